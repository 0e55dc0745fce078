"""Focus: how sharp each tile is, from the variance of the Laplacian of its greyscale, and which tiles
are out of focus.

Measured on the level where a tile spans about `SHARPNESS_SPAN` pixels (never finer than the level tiles
are read at), so a slide's tiles are judged in one pass over a low level, each of its file tiles decoded
once. A tile spanning fewer pixels there (small tiles on a slide scanned no finer) is judged on a window of
SHARPNESS_SPAN pixels around its centre, since focus is a property of an area and on 16 pixels the measure
is noisy; and on its own footprint, weighted (`OWN_WEIGHT`), where that is lower: near a blurred area's
edge the window reaches into sharp tissue the tile does not hold. The variance of the Laplacian grows with
contrast as much as with focus, and pale tissue is as sharp as dark: it is divided by the window's own
greyscale variance plus GREY_NOISE, so that a window with next to no contrast (blurred flat, or glass) is
not called sharp for the JPEG noise in its Laplacian. Out-of-focus tissue keeps its contrast over tens of
µm and loses its edges: its ratio falls far below a sharp tile's. The ratio depends on the size of the
pixels it is taken on (coarser pixels score sharp and blurred tissue alike higher), hardly on how many
pixels a tile spans: it is taken on the level's own pixels, never on pixels averaged down, so that one
`TissueSettings.min_sharpness` holds.

A scanner's focus and its JPEG quality set how sharp a whole slide is; what a person wants flagged is the
tissue much softer than the rest of its slide (a fold, an area out of the focal plane). So a tile is out
of focus when its sharpness is below `min_sharpness` and below RELATIVE_FOCUS times the median of the
slide's tissue tiles (`out_of_focus`). On the tissue bench's tuning slides (scanned with a focus blur of
0-1 px and JPEG quality 60-95), the absolute rule alone flagged 7.6 % (64 px tiles at 0.5 µm/px) and
15.8 % (32 px at 2 µm/px) of the sharp tissue tiles; this rule flags 0.6 % and 0.8 %, and more of the
blurred patch (74 % and 84 %, against 65 % and 80 %; 83 % at 64 px with the footprint's measure, 0.7 %
of the sharp tissue).
"""

from __future__ import annotations

import numpy as np

from bigslide.tiling.tissue_measure import apply_in_runs, footprints, level_spanning
from bigslide.wsi.slide import Slide

SHARPNESS_SPAN = 32
"""Pixels a tile spans on the level its sharpness is measured on (when the pyramid has such a level), and
the least a tile's focus is judged on."""
OWN_SPAN = 16
"""A tile spanning fewer than SHARPNESS_SPAN pixels is also measured on its own footprint (at least this
many pixels): inside the edge of a blurred area, its window reaches into the sharp tissue beyond."""
OWN_WEIGHT = 1.5
"""Such a tile's sharpness is the lower of its window's and OWN_WEIGHT times its footprint's (a measure on
fewer pixels, noisier). Chosen on the tissue bench's tuning seeds (5000-5029, 64 px tiles at 0.5 µm/px on
2 µm/px scans, tiles of 16 px): the blurred patch flagged 74.1 % with the window alone, 86.0 / 82.9 / 80.5 %
with weights 1 / 1.5 / 2, sharp clean tissue 0.64 % alone, 0.83 / 0.73 / 0.72 %: 1.5, the lowest weight
keeping sharp tissue flagged within a tenth of a point of the window's."""
GREY_NOISE = 25.0
"""Grey levels² added to a window's greyscale variance: a window varying by less than about 5 grey levels
has no structure to judge focus by (its Laplacian is the JPEG's noise)."""
RELATIVE_FOCUS = 0.4
"""A tile is out of focus only below this share of its slide's median sharpness (and below
`min_sharpness`): a slide scanned soft throughout is not flagged tile by tile."""


def sharpness_level(slide: Slide, size0: int, read_level: int = 0) -> int:
    """The coarsest level where a tile of `size0` level-0 pixels spans SHARPNESS_SPAN pixels, or
    `read_level` when that is coarser."""
    return max(level_spanning(slide, size0, SHARPNESS_SPAN), read_level)


def sharpness(grey: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Per box (row0, row1, col0, col1) of a float32 greyscale image: variance of the Laplacian (the
    image's edge pixels repeated beyond it) over (greyscale variance + GREY_NOISE)."""
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
    return lap_var / (np.maximum(grey_var, 0) + GREY_NOISE)


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
    """Sharpness of each tile (`coords` level-0 top-left corners, side `size0`) on `sharpness_level`, over
    at least SHARPNESS_SPAN pixels around it (or OWN_WEIGHT times its own footprint's, when lower: see
    OWN_SPAN); see `sharpness`. The level is read as luma (from a JPEG file tile, its decoder's own
    greyscale: `Slide.read_file_tile_luma`). NaN where the pixels cannot be decoded."""
    if len(coords) == 0:
        return np.zeros(0, np.float64)
    level = sharpness_level(slide, size0, read_level)
    lw, lh = slide.level_dimensions[level]
    footprint = footprints(coords, size0, slide.level_downsamples[level], (lh, lw))
    window = widened(footprint, (lh, lw))
    own = widened(footprint, (lh, lw), OWN_SPAN)
    if (own == window).all():  # every tile spans SHARPNESS_SPAN: its window is its own footprint
        return apply_in_runs(slide, level, window, sharpness, margin=1, luma=True)

    def lower(grey: np.ndarray, boxes: np.ndarray) -> np.ndarray:
        return np.minimum(sharpness(grey, boxes[:, :4]), OWN_WEIGHT * sharpness(grey, boxes[:, 4:]))

    # both from the same decoded pixels: the footprint lies within the window
    return apply_in_runs(slide, level, np.hstack([window, own]), lower, margin=1, luma=True)


def widened(boxes: np.ndarray, shape: tuple[int, int], span: int = SHARPNESS_SPAN) -> np.ndarray:
    """(row0, row1, col0, col1) boxes shorter than `span` on a side grown to `span` about their centre
    (shifted inside an image of `shape`; never beyond it)."""
    boxes = boxes.copy()
    for start, size in ((0, shape[0]), (2, shape[1])):
        lo, hi = boxes[:, start], boxes[:, start + 1]
        short = np.maximum(span - (hi - lo), 0)
        grown_lo = np.clip(lo - short // 2, 0, max(size - span, 0))
        boxes[:, start] = np.where(short > 0, grown_lo, lo)
        boxes[:, start + 1] = np.where(short > 0, np.minimum(grown_lo + span, size), hi)
    return boxes


def focus_reference(sharpness: np.ndarray) -> float | None:
    """The slide's typical sharpness: the median of its tissue tiles' (None with none measured)."""
    finite = sharpness[np.isfinite(sharpness)]
    return float(np.median(finite)) if len(finite) else None


def out_of_focus(sharpness: np.ndarray, min_sharpness: float, reference: float | None) -> np.ndarray:
    """Which tiles are out of focus: sharpness below `min_sharpness` and below RELATIVE_FOCUS times the
    slide's `focus_reference`. Where that reference is itself below RELATIVE_FOCUS * `min_sharpness` (most
    of the slide is out of focus) or unknown, `min_sharpness` alone decides. NaN is never out of focus."""
    below = sharpness < min_sharpness
    if reference is None or reference < RELATIVE_FOCUS * min_sharpness:
        return below
    return below & (sharpness < RELATIVE_FOCUS * reference)
