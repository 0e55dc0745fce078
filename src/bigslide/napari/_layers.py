"""Layer construction for slides, regions, tile previews and heatmaps, all placed by one formula.

Every layer over a slide gets its scale and translate from the slide layer's `Placement` (its effective
level-0 µm/px and where it sits in the world), so an overlay can never disagree with the slide it
scores: heatmaps and tile masks through `Placement.raster`, regions, lesions and tile boxes through
`Placement.vertices` (their vertex data are level-0 positions). When the slide's µm/px changes (the
user's fallback for a file that states none) or the slide is moved, its overlays move with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import shapely
from shapely.geometry import MultiPolygon, Polygon

from bigslide.explain.placement import Placement
from bigslide.napari._placement import PROVISIONAL_MPP, WORLD_UNITS, place_layer, placement_of
from bigslide.napari._roles import ROLE, find_layer, layers_with_role, remove_layers

if TYPE_CHECKING:
    import napari

    from bigslide.explain.heatmap import Normalisation, ScoreGrid
    from bigslide.wsi.slide import Slide


HEATMAP_COLORMAPS = ("inferno", "viridis", "magma", "turbo", "plasma", "gray")
LEGEND_POSITION = "top_left"
MAX_TILE_BOXES = 4000
"""Above this many tiles the preview is drawn as a mask image: thousands of Shapes are slow to edit."""


def slide_layer_data(
    slide: Slide, name: str | None = None, *, fallback_mpp: float | None = None
) -> tuple[list[Any], dict[str, Any], str]:
    """A lazy multiscale RGB image layer tuple: napari decodes the tiles it draws (a small coarsest level,
    the whole-slide view's, is being decoded already: `bigslide.wsi.slide_view.PREFETCH_BYTES`).

    `fallback_mpp` is the level-0 µm/px used when the file states none (the Slides panel's field); without
    one such a slide is drawn at the provisional µm/px until it is given one."""
    stated = slide.mpp
    mpp = stated or ((fallback_mpp, fallback_mpp) if fallback_mpp else None)
    placement = Placement(mpp or (PROVISIONAL_MPP, PROVISIONAL_MPP))
    scale, translate = placement.raster()
    metadata = {
        ROLE: "slide",
        "path": str(slide.path),
        "mpp": mpp,
        "stated_mpp": stated,
        "levels": slide.level_count,
        "level_dimensions": [list(d) for d in slide.level_dimensions],
        "level_downsamples": list(slide.level_downsamples),
    }
    kwargs = {
        "name": name or slide_display_name(slide.path),
        "rgb": True,
        "multiscale": True,
        "scale": scale,
        "translate": translate,
        "units": WORLD_UNITS,
        "metadata": metadata,
        "contrast_limits": (0, 255),
    }
    from bigslide.napari._tile_errors import tile_error_reporter

    return slide.pyramid(tile_error_reporter(slide.path)), kwargs, "image"


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
    """Shapes-layer keyword arguments placing vertices (level-0 positions) exactly on the slide. Areas to
    leave out ("exclusions") are drawn in cyan, twice as wide, over a dark veil: no colour H&E shows, and
    the area reads as put aside; the others as bright outlines."""
    placement = placement_of(slide_layer)
    scale, translate = placement.vertices()
    width = outline_width(slide_layer.metadata.get("level_dimensions"))
    leave_out = role == "exclusions"
    return {
        "name": name,
        "scale": scale,
        "translate": translate,
        "units": WORLD_UNITS,
        "edge_color": "#00e5ff" if leave_out else "#39ff14",
        "face_color": "#0000004d" if leave_out else "transparent",
        "edge_width": 2 * width if leave_out else width,
        "metadata": {ROLE: role, "slide": slide_layer.metadata.get("path"), "shapes": True},
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
        metadata["shapes"] = True
        kwargs.update(edge_color="#ffd60a", metadata=metadata)
        return viewer.add_shapes(
            list(tile_boxes(coords, tile_size_level0)) if len(coords) else None,
            shape_type="rectangle",
            **kwargs,
        )
    grid = ScoreGrid.from_tiles(coords, np.ones(len(coords)), int(tile_size_level0))
    metadata.update(cell_size_level0=grid.cell_size_level0, origin=grid.origin)
    placement = placement_of(slide_layer)
    scale, translate = placement.raster(grid.cell_size_level0, grid.origin)
    return viewer.add_image(
        np.nan_to_num(grid.scores, nan=0.0),
        name=name,
        scale=scale,
        translate=translate,
        units=WORLD_UNITS,
        colormap="yellow",
        opacity=0.35,
        contrast_limits=(0, 1),
        blending="additive",
        metadata=metadata,
    )


# -- heatmaps --------------------------------------------------------------------------------------------

NORMALISATION_TEXT = {
    "rank": "rank in the slide (0 lowest, 1 highest tile)",
    "percentile": "1st to 99th percentile of the slide",
    "minmax": "lowest to highest tile of the slide",
    "raw": "the model's scores as they are",
}


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
    placement = placement_of(slide_layer)
    scale, translate = placement.raster(grid.cell_size_level0, grid.origin)
    kwargs: dict[str, Any] = {
        "name": name,
        "scale": scale,
        "translate": translate,
        "units": WORLD_UNITS,
        "opacity": 0.5,
        "blending": "translucent",
        "metadata": {
            ROLE: "heatmap",
            "slide": slide_layer.metadata.get("path"),
            "grid": grid,
            "normalisation": normalisation,
            "cell_size_level0": grid.cell_size_level0,
            "origin": grid.origin,
        },
    }
    if grid.is_rgb:
        kwargs["rgb"] = True
    else:
        kwargs.update(
            colormap="inferno", contrast_limits=_limits(grid.normalized(normalisation), normalisation)
        )
    return kwargs


def add_heatmap(
    viewer: napari.Viewer,
    grid: ScoreGrid,
    slide_layer: napari.layers.Image,
    *,
    name: str,
    normalisation: Normalisation = "rank",
) -> napari.layers.Image:
    """Add a heatmap over its slide, or redraw the one of that name in place (a followed run's maps
    change every epoch: updating a layer costs milliseconds, making one a tenth of a second). It becomes
    the one shown; the slide's other heatmaps are hidden."""
    kwargs = heatmap_layer_kwargs(grid, slide_layer, name=name, normalisation=normalisation)
    show_only(viewer, slide_layer.metadata.get("path"), name)
    existing = find_layer(viewer, name)
    if existing is not None and existing.metadata.get(ROLE) == "heatmap" and existing.rgb == grid.is_rgb:
        existing.metadata.update(kwargs["metadata"])
        existing.data = heatmap_display(grid, normalisation)
        place_layer(existing, slide_layer)
        if not grid.is_rgb:
            existing.contrast_limits = kwargs["contrast_limits"]
        layer = existing
    else:
        if existing is not None:
            viewer.layers.remove(existing)
        layer = _insert_map(viewer, slide_layer, heatmap_display(grid, normalisation), kwargs)
    show_legend(viewer, layer)
    return layer


def add_empty_heatmap(
    viewer: napari.Viewer,
    grid: ScoreGrid,
    slide_layer: napari.layers.Image,
    *,
    name: str,
    normalisation: Normalisation = "rank",
) -> napari.layers.Image:
    """A hidden map layer of `grid`'s cells, each empty, placed as `add_heatmap` places one: a map drawn
    later under that name fills it in place (filling a layer costs milliseconds, making one a tenth of a
    second or more of frozen viewer)."""
    kwargs = heatmap_layer_kwargs(grid, slide_layer, name=name, normalisation=normalisation)
    cells = np.full(heatmap_display(grid, normalisation).shape, np.nan, np.float32)
    return _insert_map(viewer, slide_layer, cells, {**kwargs, "visible": False})


def _insert_map(
    viewer: napari.Viewer, slide_layer: napari.layers.Image, cells: np.ndarray, kwargs: dict[str, Any]
) -> napari.layers.Image:
    """A new map layer of `cells`, placed in the layer list by `above_slide_pictures`."""
    from napari.layers import Image

    layer = Image(cells, **kwargs)
    viewer.layers.insert(above_slide_pictures(viewer, slide_layer), layer)
    return layer


def is_empty_heatmap(layer: napari.layers.Image) -> bool:
    """A map layer made ahead (`add_empty_heatmap`) that no map has filled yet."""
    return layer.metadata.get(ROLE) == "heatmap" and not layer.rgb and bool(np.isnan(layer.data).all())


def above_slide_pictures(viewer: napari.Viewer, slide_layer: napari.layers.Image) -> int:
    """Where a new map of `slide_layer` goes in the layer list: just above the slide and its other maps,
    below its outlines (lesions, annotations, regions, the tile preview), which a map drawn later would
    otherwise cover."""
    path = slide_layer.metadata.get("path")
    pictures = [
        i
        for i, layer in enumerate(viewer.layers)
        if layer is slide_layer
        or (layer.metadata.get(ROLE) == "heatmap" and layer.metadata.get("slide") == path)
    ]
    return max(pictures, default=len(viewer.layers) - 1) + 1


def show_only(viewer: napari.Viewer, slide: str | None, name: str) -> None:
    """Of a slide's heatmaps, show the one called `name` and hide the others (touching only what changes)."""
    for heatmap in layers_with_role(viewer, "heatmap", slide):
        if heatmap.visible != (heatmap.name == name):
            heatmap.visible = heatmap.name == name


LEGEND_DELAY_MS = 150
"""A map's legend appears this long after the map: each is drawn in its own event-loop turn."""


def legend_text(layer: napari.layers.Image) -> str:
    """What the colours of a heatmap layer mean, in one line."""
    if layer.rgb:
        return "RGB: first three principal components"
    normalisation = str(layer.metadata.get("normalisation", "raw"))
    return f"colour: {NORMALISATION_TEXT.get(normalisation, normalisation)}"


def show_legend(viewer: napari.Viewer, layer: napari.layers.Image | None) -> None:
    """A line on the canvas naming the map shown and what its colours mean (the Results panel draws
    the colour bar: a canvas colour bar costs a tenth of a second per layer to build). Top left: napari's
    notifications rise from the bottom right and cover the bottom of a narrow canvas."""
    overlay = viewer.canvas.overlays.text
    if layer is None:
        overlay.visible = False
        return
    meaning = legend_text(layer).removeprefix("colour: ").split(" (")[0]  # short: the canvas may be narrow
    text = f"{layer.name} — {meaning}"

    def show() -> None:
        if layer not in viewer.layers or not layer.visible:
            return  # another map was shown meanwhile: its own legend follows
        overlay.text = text
        overlay.position = LEGEND_POSITION
        overlay.font_size = 11
        overlay.visible = True

    if overlay.visible:
        show()
    else:  # drawn after the map: the first draw of each letter costs milliseconds, the new map's too
        from qtpy.QtCore import QTimer

        QTimer.singleShot(LEGEND_DELAY_MS, show)


def renormalise(layer: napari.layers.Image, normalisation: Normalisation) -> None:
    """Redraw a heatmap layer from its stored ScoreGrid with another normalisation."""
    grid = layer.metadata.get("grid")
    if grid is None or grid.is_rgb:
        return
    layer.data = heatmap_display(grid, normalisation)
    layer.contrast_limits = _limits(layer.data, normalisation)
    layer.metadata["normalisation"] = normalisation


def _limits(values: np.ndarray, normalisation: str) -> tuple[float, float]:
    """Colour scale ends: 0 and 1 for the normalised maps (what their legend says), the data's range raw."""
    if normalisation != "raw":
        return (0.0, 1.0)
    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    return (low, high if high > low else low + 1.0)
