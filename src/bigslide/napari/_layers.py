"""Layer construction for slides, regions, tile previews and heatmaps, all aligned in one world frame.

World coordinates are µm when the slide knows its pixel size, else level-0 pixels. The slide layer has
scale (mpp_y, mpp_x), so its data coordinates are level-0 pixels; region and tile-box Shapes layers get
the same scale so their vertices are stored in level-0 pixels too; heatmaps use
`ScoreGrid.layer_transform()`. Every layer gets the same units, or napari drops them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import shapely
from shapely.geometry import MultiPolygon, Polygon

if TYPE_CHECKING:
    import napari

    from bigslide.explain.heatmap import Normalisation, ScoreGrid
    from bigslide.slide import Slide

ROLE = "bigslide_role"
"""Metadata key telling our layers apart: "slide", "regions", "lesions", "tiles" or "heatmap"."""

HEATMAP_COLORMAPS = ("inferno", "viridis", "magma", "turbo", "plasma", "gray")
MAX_TILE_BOXES = 4000
"""Above this many tiles the preview is drawn as a mask image: thousands of Shapes are slow to edit."""


def world_units(mpp: tuple[float, float] | None) -> str:
    return "um" if mpp else "pixel"


def slide_scale(mpp: tuple[float, float] | None) -> tuple[float, float]:
    """napari (row, col) scale of level-0 pixels."""
    return (mpp[1], mpp[0]) if mpp else (1.0, 1.0)


def slide_layer_data(slide: Slide, name: str | None = None) -> tuple[list[Any], dict[str, Any], str]:
    """A lazy multiscale RGB image layer tuple; no pixel is decoded until napari draws it."""
    mpp = slide.mpp
    metadata = {
        ROLE: "slide",
        "path": str(slide.path),
        "mpp": mpp,
        "levels": slide.level_count,
        "level_dimensions": [list(d) for d in slide.level_dimensions],
        "level_downsamples": list(slide.level_downsamples),
    }
    kwargs = {
        "name": name or slide_display_name(slide.path),
        "rgb": True,
        "multiscale": True,
        "scale": slide_scale(mpp),
        "units": world_units(mpp),
        "metadata": metadata,
        "contrast_limits": (0, 255),
    }
    return slide.pyramid(), kwargs, "image"


def slide_display_name(path: str | Path) -> str:
    name = Path(path).name
    for suffix in (".ome.tiff", ".ome.tif", ".svs", ".tiff", ".tif", ".ndpi"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


# -- polygons <-> Shapes data --------------------------------------------------------------------------


def polygons_to_shapes(geometries: list[Any]) -> list[np.ndarray]:
    """Shapely polygons in level-0 (x, y) px -> napari polygon vertices in (row, col) = (y, x).

    Holes are dropped (napari polygons have none); multipolygons give one shape per part.
    """
    shapes: list[np.ndarray] = []
    for geometry in geometries:
        parts = geometry.geoms if isinstance(geometry, MultiPolygon) else [geometry]
        for part in parts:
            if not isinstance(part, Polygon) or part.is_empty:
                continue
            xy = np.asarray(part.exterior.coords)[:-1]
            shapes.append(xy[:, ::-1].astype(np.float64))
    return shapes


def shapes_to_polygons(layer: napari.layers.Shapes) -> list[Polygon]:
    """The area shapes of a Shapes layer (polygons, rectangles, ellipses) as valid level-0 polygons."""
    polygons: list[Polygon] = []
    for vertices, kind in zip(layer.data, layer.shape_type):
        yx = np.asarray(vertices, dtype=np.float64)[:, -2:]
        if kind == "ellipse":
            yx = _ellipse_outline(yx)
        elif kind not in ("polygon", "rectangle"):
            continue  # lines and paths enclose no area
        if len(yx) < 3:
            continue
        polygon = Polygon(yx[:, ::-1])
        if not polygon.is_valid:
            polygon = shapely.make_valid(polygon)
        for part in getattr(polygon, "geoms", [polygon]):
            if isinstance(part, Polygon) and part.area > 0:
                polygons.append(part)
    return polygons


def _ellipse_outline(corners: np.ndarray, n: int = 64) -> np.ndarray:
    # napari stores an ellipse as the four corners of its (possibly rotated) bounding box
    centre = corners.mean(axis=0)
    half_a = (corners[1] - corners[0]) / 2
    half_b = (corners[3] - corners[0]) / 2
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)[:, None]
    return centre + np.cos(t) * half_a + np.sin(t) * half_b


def regions_layer_kwargs(
    slide_layer: napari.layers.Image, name: str, *, role: str = "regions"
) -> dict[str, Any]:
    """Shapes-layer keyword arguments sharing the slide's scale and units (vertices in level-0 px)."""
    colour = "#39ff14" if role == "regions" else "#ff2d55"
    return {
        "name": name,
        "scale": tuple(slide_layer.scale),
        "translate": tuple(slide_layer.translate),
        "units": slide_layer.units,
        "edge_color": colour,
        "face_color": "transparent",
        "edge_width": outline_width(slide_layer.metadata.get("level_dimensions")),
        "metadata": {ROLE: role, "slide": slide_layer.metadata.get("path")},
    }


def outline_width(level_dimensions: Any) -> float:
    """Outline width in level-0 pixels that reads well when the whole slide is in view."""
    if not level_dimensions:
        return 3.0
    return max(3.0, max(level_dimensions[0]) / 300)


# -- tile preview ----------------------------------------------------------------------------------------


def tile_boxes(coords: np.ndarray, tile_size_level0: float) -> np.ndarray:
    """(N, 4, 2) rectangle corners in level-0 (row, col) for tiles with top-left (x, y) `coords`."""
    coords = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
    x, y = coords[:, 0], coords[:, 1]
    t = float(tile_size_level0)
    rows = np.stack([y, y, y + t, y + t], axis=1)
    cols = np.stack([x, x + t, x + t, x], axis=1)
    return np.stack([rows, cols], axis=2)


def add_tile_preview(
    viewer: napari.Viewer, slide_layer: napari.layers.Image, coords: np.ndarray, tile_size_level0: float
) -> napari.layers.Layer:
    """Show the tiles that will be sampled: outlines when few, a translucent mask when many."""
    from bigslide.explain.heatmap import ScoreGrid

    name = f"{slide_layer.name} tiles ({len(coords)})"
    remove_layers(viewer, role="tiles", slide=slide_layer.metadata.get("path"))
    metadata = {ROLE: "tiles", "slide": slide_layer.metadata.get("path"), "count": len(coords)}
    if len(coords) <= MAX_TILE_BOXES:
        kwargs = regions_layer_kwargs(slide_layer, name, role="tiles")
        kwargs.update(edge_color="#ffd60a", edge_width=kwargs["edge_width"] / 2, metadata=metadata)
        return viewer.add_shapes(
            list(tile_boxes(coords, tile_size_level0)) if len(coords) else None,
            shape_type="rectangle",
            **kwargs,
        )
    mpp = slide_layer.metadata.get("mpp")
    grid = ScoreGrid.from_tiles(coords, np.ones(len(coords)), int(tile_size_level0), mpp=_mpp_tuple(mpp))
    scale, translate = grid.layer_transform()
    return viewer.add_image(
        np.nan_to_num(grid.scores, nan=0.0),
        name=name,
        scale=scale,
        translate=_offset(translate, slide_layer),
        units=slide_layer.units,
        colormap="yellow",
        opacity=0.35,
        contrast_limits=(0, 1),
        blending="additive",
        metadata=metadata,
    )


# -- heatmaps --------------------------------------------------------------------------------------------


def heatmap_display(grid: ScoreGrid, normalisation: Normalisation = "rank") -> np.ndarray:
    """Cell values to draw: scalar grids normalised with NaN (no tile) kept, RGB grids with NaN as black."""
    data = grid.normalized(normalisation)
    if grid.is_rgb:
        return np.clip(np.nan_to_num(data, nan=0.0), 0, 1).astype(np.float32)
    return data.astype(np.float32)


def heatmap_layer_kwargs(
    grid: ScoreGrid, slide_layer: napari.layers.Image, *, name: str, normalisation: Normalisation = "rank"
) -> dict[str, Any]:
    """Keyword arguments putting each cell exactly over the level-0 pixels it scores."""
    scale, translate = grid.layer_transform()
    kwargs: dict[str, Any] = {
        "name": name,
        "scale": scale,
        "translate": _offset(translate, slide_layer),
        "units": slide_layer.units,
        "opacity": 0.5,
        "blending": "translucent",
        "metadata": {
            ROLE: "heatmap",
            "slide": slide_layer.metadata.get("path"),
            "grid": grid,
            "normalisation": normalisation,
        },
    }
    if grid.is_rgb:
        kwargs["rgb"] = True
    else:
        finite = grid.normalized(normalisation)
        finite = finite[np.isfinite(finite)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        kwargs.update(colormap="inferno", contrast_limits=(low, high if high > low else low + 1.0))
    return kwargs


def add_heatmap(
    viewer: napari.Viewer,
    grid: ScoreGrid,
    slide_layer: napari.layers.Image,
    *,
    name: str,
    normalisation: Normalisation = "rank",
) -> napari.layers.Image:
    if grid.mpp is None and slide_layer.metadata.get("mpp"):
        grid.mpp = _mpp_tuple(slide_layer.metadata["mpp"])
    kwargs = heatmap_layer_kwargs(grid, slide_layer, name=name, normalisation=normalisation)
    existing = find_layer(viewer, name)
    if existing is not None:
        viewer.layers.remove(existing)
    return viewer.add_image(heatmap_display(grid, normalisation), **kwargs)


def renormalise(layer: napari.layers.Image, normalisation: Normalisation) -> None:
    """Redraw a heatmap layer from its stored ScoreGrid with another normalisation."""
    grid = layer.metadata.get("grid")
    if grid is None or grid.is_rgb:
        return
    layer.data = heatmap_display(grid, normalisation)
    finite = layer.data[np.isfinite(layer.data)]
    if finite.size:
        low, high = float(finite.min()), float(finite.max())
        layer.contrast_limits = (low, high if high > low else low + 1.0)
    layer.metadata["normalisation"] = normalisation


# -- lookups ---------------------------------------------------------------------------------------------


def slide_layers(viewer: napari.Viewer) -> list[napari.layers.Image]:
    return [layer for layer in viewer.layers if layer.metadata.get(ROLE) == "slide"]


def layers_with_role(viewer: napari.Viewer, role: str, slide: str | None = None) -> list[Any]:
    return [
        layer
        for layer in viewer.layers
        if layer.metadata.get(ROLE) == role and (slide is None or layer.metadata.get("slide") == slide)
    ]


def remove_layers(viewer: napari.Viewer, *, role: str, slide: str | None = None) -> None:
    for layer in layers_with_role(viewer, role, slide):
        viewer.layers.remove(layer)


def find_layer(viewer: napari.Viewer, name: str) -> Any:
    return next((layer for layer in viewer.layers if layer.name == name), None)


def _mpp_tuple(mpp: Any) -> tuple[float, float] | None:
    return (float(mpp[0]), float(mpp[1])) if mpp else None


def _offset(translate: tuple[float, float], slide_layer: napari.layers.Image) -> tuple[float, float]:
    # a slide layer the user moved carries its heatmaps and tiles along
    dy, dx = (float(v) for v in slide_layer.translate[-2:])
    return (translate[0] + dy, translate[1] + dx)
