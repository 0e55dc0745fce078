"""Focus: how sharp each tile is, from the variance of the Laplacian of its greyscale.

Measured on the level where a tile spans about `SHARPNESS_SPAN` pixels (never finer than the level tiles
are read at), so a slide's tiles are judged in one pass over a low level, each of its file tiles decoded
once. The variance of the Laplacian grows with contrast as much as with focus, and pale tissue is as sharp
as dark: it is divided by the tile's own greyscale variance (plus one grey level², so glass noise does not
count). Out-of-focus tissue keeps its contrast over tens of µm and loses its edges: its ratio falls far
below a sharp tile's. The ratio depends on the size of the pixels it is taken on (coarser pixels score
sharp and blurred tissue alike higher), hardly on how many pixels a tile spans: it is taken on the level's
own pixels, never on pixels averaged down, so that one `TissueSettings.min_sharpness` holds.
"""

from __future__ import annotations

import numpy as np

from bigslide.tiling.tissue_measure import apply_in_runs, footprints, level_spanning
from bigslide.wsi.slide import Slide

LUMA = np.array([0.299, 0.587, 0.114], np.float32)
"""`bigslide.tiling.pixel_classes.greyscale`'s weights, as a matrix product (three times faster on
uint8 RGB)."""
SHARPNESS_SPAN = 32
"""Pixels a tile spans on the level its sharpness is measured on (when the pyramid has such a level)."""


def sharpness_level(slide: Slide, size0: int, read_level: int = 0) -> int:
    """The coarsest level where a tile of `size0` level-0 pixels spans SHARPNESS_SPAN pixels, or
    `read_level` when that is coarser."""
    return max(level_spanning(slide, size0, SHARPNESS_SPAN), read_level)


def sharpness(grey: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Per box (row0, row1, col0, col1) of a float32 greyscale image: variance of the Laplacian (the
    image's edge pixels repeated beyond it) over (greyscale variance + 1)."""
    out = np.zeros(len(boxes), np.float64)
    rows = boxes[:, :2]
    bands = rows[:1] if (rows == rows[0]).all() else np.unique(rows, axis=0)  # a run is one band
    for r0, r1 in bands:
        at = np.flatnonzero((rows[:, 0] == r0) & (rows[:, 1] == r1))
        out[at] = _band_sharpness(grey, int(r0), int(r1), boxes[at, 2], boxes[at, 3])
    return out


def _band_sharpness(grey: np.ndarray, r0: int, r1: int, c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """`sharpness` of boxes that share their rows [r0, r1), from column sums."""
    x0, x1 = int(c0.min()), int(c1.max())
    lap = _laplacian(grey, r0, r1, x0, x1)
    band = grey[r0:r1, x0:x1]
    band = band - np.float32(band.mean())  # about the band's mean: squares lose nothing to cancellation
    sums = np.zeros((4, x1 - x0 + 1), np.float64)  # running sums along the band of each column's ...
    columns = sums[:, 1:]
    columns[0] = np.einsum("ij,ij->j", lap, lap)  # ... Laplacian², Laplacian, grey², grey
    columns[1] = lap.sum(axis=0)
    columns[2] = np.einsum("ij,ij->j", band, band)
    columns[3] = band.sum(axis=0)
    np.cumsum(columns, axis=1, out=columns)
    means = (sums[:, c1 - x0] - sums[:, c0 - x0]) / ((r1 - r0) * (c1 - c0))
    lap_var = means[0] - means[1] ** 2
    grey_var = means[2] - means[3] ** 2
    return lap_var / (np.maximum(grey_var, 0) + 1.0)


def _laplacian(grey: np.ndarray, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """The Laplacian of `grey` over [r0, r1) x [c0, c1), with the image's edge pixels repeated beyond it."""
    h, w = grey.shape
    if r0 < 1 or c0 < 1 or r1 > h - 1 or c1 > w - 1:
        grey, r0, r1, c0, c1 = np.pad(grey, 1, mode="edge"), r0 + 1, r1 + 1, c0 + 1, c1 + 1
    around = grey[r0 - 1 : r1 + 1, c0 - 1 : c1 + 1]
    lap = around[:-2, 1:-1] + around[2:, 1:-1]
    lap += around[1:-1, :-2]
    lap += around[1:-1, 2:]
    lap -= 4 * around[1:-1, 1:-1]
    return lap


def tile_sharpness(slide: Slide, coords: np.ndarray, size0: int, read_level: int = 0) -> np.ndarray:
    """Sharpness of each tile (`coords` level-0 top-left corners, side `size0`) on `sharpness_level`; see
    `sharpness`. NaN where the tile's pixels cannot be decoded."""
    if len(coords) == 0:
        return np.zeros(0, np.float64)
    level = sharpness_level(slide, size0, read_level)
    lw, lh = slide.level_dimensions[level]
    boxes = footprints(coords, size0, slide.level_downsamples[level], (lh, lw))
    return apply_in_runs(slide, level, boxes, lambda image, local: sharpness(image @ LUMA, local), margin=1)
