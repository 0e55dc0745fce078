"""Export heatmaps: a PNG overlay on the slide thumbnail and QuPath GeoJSON tiles carrying the scores."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image

from bigslide.explain.heatmap import Normalisation, ScoreGrid
from bigslide.wsi.slide import Slide


def colorize(values: np.ndarray, cmap: str = "inferno") -> np.ndarray:
    """(rows, cols) in [0, 1] with NaN -> RGBA float; NaN cells are fully transparent."""
    rgba = matplotlib.colormaps[cmap](np.nan_to_num(values, nan=0.0))
    rgba[..., 3] = np.where(np.isfinite(values), 1.0, 0.0)
    return rgba


def overlay_png(
    grid: ScoreGrid,
    slide: Slide,
    path: str | Path,
    *,
    max_size: int = 1024,
    normalisation: Normalisation = "rank",
    cmap: str = "inferno",
    alpha: float = 0.5,
) -> Path:
    """Blend the heatmap over the slide thumbnail (cells drawn as blocks, exactly on their tiles)."""
    out = overlay_image(grid, slide, max_size=max_size, normalisation=normalisation, cmap=cmap, alpha=alpha)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # fast compression: written for every slide a cohort predicts, 3x quicker for a file about 10 % larger
    Image.fromarray(out).save(path, format="PNG", compress_level=1)
    return path


def overlay_image(
    grid: ScoreGrid,
    slide: Slide,
    *,
    max_size: int = 1024,
    normalisation: Normalisation = "rank",
    cmap: str = "inferno",
    alpha: float = 0.5,
) -> np.ndarray:
    """`overlay_png`'s picture as an (H, W, 3) uint8 array."""
    thumb = slide.thumbnail(max_size).astype(np.float32) / 255.0
    th, tw = thumb.shape[:2]
    w0, h0 = slide.dimensions
    sx, sy = tw / w0, th / h0
    if grid.is_rgb:
        rgba = np.concatenate([grid.scores.astype(np.float32), np.ones((*grid.scores.shape[:2], 1))], axis=2)
        rgba[..., 3] = np.isfinite(grid.scores).all(axis=2)
    else:
        rgba = colorize(grid.normalized(normalisation if normalisation != "raw" else "minmax"), cmap)
    rows, cols = rgba.shape[:2]
    p = grid.cell_size_level0
    # thumbnail pixel (r, c) -> grid cell, by nearest lookup of the pixel's level-0 centre
    ys = ((np.arange(th) + 0.5) / sy - grid.origin[1]) // p
    xs = ((np.arange(tw) + 0.5) / sx - grid.origin[0]) // p
    inside_y = (ys >= 0) & (ys < rows)
    inside_x = (xs >= 0) & (xs < cols)
    layer = np.zeros((th, tw, 4), np.float32)
    yi, xi = ys[inside_y].astype(int), xs[inside_x].astype(int)
    layer[np.ix_(inside_y, inside_x)] = rgba[np.ix_(yi, xi)]
    a = layer[..., 3:4] * alpha
    out = thumb * (1 - a) + layer[..., :3] * a
    return np.round(out * 255).astype(np.uint8)


def grid_geojson(grid: ScoreGrid, path: str | Path) -> Path:
    """Every scored cell as a QuPath tile (level-0 pixel polygon) with its score as a measurement."""
    features = []
    p = grid.cell_size_level0
    values = grid.scores if not grid.is_rgb else grid.scores.mean(axis=2)
    for r, c in zip(*np.nonzero(np.isfinite(values))):
        x0, y0 = grid.origin[0] + c * p, grid.origin[1] + r * p
        ring = [[x0, y0], [x0 + p, y0], [x0 + p, y0 + p], [x0, y0 + p], [x0, y0]]
        features.append(
            {
                "type": "Feature",
                "geometry": {"type": "Polygon", "coordinates": [ring]},
                "properties": {
                    "objectType": "tile",
                    "name": f"{grid.name} r{r} c{c}",
                    "measurements": {grid.name: float(values[r, c])},
                },
            }
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return path
