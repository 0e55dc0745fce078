"""Focus: how sharp each tile is, from the variance of the Laplacian of its greyscale.

Measured on the level where a tile spans about `SHARPNESS_SPAN` pixels (never finer than the level tiles
are read at), so a slide's tiles are judged in one pass over a low level. The variance of the Laplacian
grows with contrast as much as with focus, and pale tissue is as sharp as dark: it is divided by the
tile's own greyscale variance (plus one grey level², so glass noise does not count). Out-of-focus tissue
keeps its contrast over tens of µm and loses its edges: its ratio falls far below a sharp tile's.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from bigslide.slide import Slide
from bigslide.tissue import greyscale
from bigslide.tissue_measure import apply_in_runs, box_means, footprints, level_spanning

SHARPNESS_SPAN = 32
"""Pixels a tile spans on the level its sharpness is measured on (when the pyramid has such a level)."""


def sharpness_level(slide: Slide, size0: int, read_level: int = 0) -> int:
    """The coarsest level where a tile of `size0` level-0 pixels spans SHARPNESS_SPAN pixels, or
    `read_level` when that is coarser."""
    return max(level_spanning(slide, size0, SHARPNESS_SPAN), read_level)


def sharpness(grey: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Per box (row0, row1, col0, col1) of a greyscale image: variance of the Laplacian over
    (greyscale variance + 1)."""
    lap = ndimage.laplace(grey.astype(np.float32), mode="nearest")
    lap_var = box_means(lap * lap, boxes) - box_means(lap, boxes) ** 2
    grey_var = box_means(grey * grey, boxes) - box_means(grey, boxes) ** 2
    return lap_var / (np.maximum(grey_var, 0) + 1.0)


def tile_sharpness(slide: Slide, coords: np.ndarray, size0: int, read_level: int = 0) -> np.ndarray:
    """Sharpness of each tile (`coords` level-0 top-left corners, side `size0`); see `sharpness`."""
    if len(coords) == 0:
        return np.zeros(0, np.float64)
    level = sharpness_level(slide, size0, read_level)
    lw, lh = slide.level_dimensions[level]
    boxes = footprints(coords, size0, slide.level_downsamples[level], (lh, lw))
    return apply_in_runs(
        slide, level, boxes, lambda image, local: sharpness(greyscale(image).astype(np.float64), local), 1
    )
