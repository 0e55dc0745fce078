"""The tissue check in the viewer: tiles left out for ink or blur, beside the kept tiles of the preview."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from bigslide.napari._placement import placement_of
from bigslide.napari._roles import ROLE

if TYPE_CHECKING:
    import napari

    from bigslide.tiling.grid import TileGrid

INK_LABEL, BLUR_LABEL = 1, 2
COLOURS: dict[int | None, str] = {INK_LABEL: "#e600c8", BLUR_LABEL: "#ff8c00"}
"""Ink, marker or dust: magenta; out of focus: orange (the kept tiles are the preview's yellow)."""


def left_out(grid: TileGrid) -> tuple[np.ndarray, np.ndarray]:
    """(coords, label) of the tiles left out for ink, and of those out of focus (left out or only
    flagged, per `data.exclude_blurred`)."""
    from bigslide.tiling.grid import BLUR, INK

    flagged = grid.coords[grid.out_of_focus]
    ink = grid.rejected[grid.rejected_reason == INK]
    blur = np.concatenate([grid.rejected[grid.rejected_reason == BLUR], flagged]).reshape(-1, 2)
    labels = np.concatenate([np.full(len(ink), INK_LABEL), np.full(len(blur), BLUR_LABEL)])
    return np.concatenate([ink, blur]).reshape(-1, 2), labels


def add_rejected_tiles(viewer: napari.Viewer, slide_layer: Any, grid: TileGrid) -> Any:
    """A labels layer over the slide: the tiles left out for ink in magenta, out-of-focus ones in orange
    (None when there are none). It carries the "tiles" role: it goes when the preview does."""
    from napari.utils.colormaps import DirectLabelColormap

    from bigslide.explain.heatmap import ScoreGrid

    coords, labels = left_out(grid)
    if len(coords) == 0:
        return None
    raster = ScoreGrid.from_tiles(coords, labels.astype(np.float64), grid.tile_size_level0)
    placement = placement_of(slide_layer)
    scale, translate = placement.raster(raster.cell_size_level0, raster.origin)
    metadata = {
        ROLE: "tiles",
        "slide": slide_layer.metadata.get("path"),
        "count": len(coords),
        "cell_size_level0": raster.cell_size_level0,
        "origin": raster.origin,
        "left_out": True,
    }
    colours: dict[int | None, str] = {None: "transparent", 0: "transparent", **COLOURS}
    return viewer.add_labels(
        np.nan_to_num(raster.scores, nan=0.0).astype(np.uint8),
        name=f"{slide_layer.name} tiles left out (ink {int((labels == INK_LABEL).sum())}, "
        f"out of focus {int((labels == BLUR_LABEL).sum())})",
        scale=scale,
        translate=translate,
        units=placement.units,
        opacity=0.6,
        colormap=DirectLabelColormap(color_dict=colours),
        metadata=metadata,
    )
