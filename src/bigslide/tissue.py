"""Find tissue on a slide: an Otsu mask on a low level, and the Big-Layers per-pixel rule for tiles."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from skimage.filters import threshold_otsu
from skimage.morphology import remove_small_holes, remove_small_objects

if TYPE_CHECKING:
    from bigslide.slide import Slide

RULE_LOW = 3
RULE_HIGH = 230
"""Big-Layers rule: a pixel is tissue when its greyscale is in [RULE_LOW, RULE_HIGH] (not glass/black)."""

DEFAULT_MIN_TISSUE = 0.6
MASK_SIZE = 2048
"""Longer side of the low-resolution image tissue is found on when no finer measure is needed."""


class TissueMask(NamedTuple):
    """Boolean tissue mask; pixel (i, j) covers level-0 pixels [j*ds, (j+1)*ds) x [i*ds, (i+1)*ds)."""

    mask: np.ndarray
    downsample: float


def greyscale(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma as float in [0, 255] (the weights PIL's "L" mode uses)."""
    rgb = np.asarray(rgb, dtype=np.float32)
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114


def rule_mask(rgb: np.ndarray) -> np.ndarray:
    """Per-pixel Big-Layers rule: True where greyscale is in [3, 230]."""
    grey = greyscale(rgb)
    return (grey >= RULE_LOW) & (grey <= RULE_HIGH)


def tile_tissue_fraction(tile: np.ndarray) -> float:
    """Fraction of a tile's pixels that pass the Big-Layers rule (keep a tile when >= 0.6)."""
    mask = rule_mask(tile)
    return float(mask.mean()) if mask.size else 0.0


def tissue_mask(slide: Slide, *, max_size: int = MASK_SIZE) -> TissueMask:
    """Otsu tissue mask on a low level (longer side <= `max_size`), small specks and holes removed.

    Thresholds saturation (stained tissue is coloured, glass is not); falls back to darkness when the
    image has no colour. Only the chosen low level is read.
    """
    level = _mask_level(slide, max_size)
    image = slide.thumbnail(max_size) if level is None else slide.read_level(level)
    h, w = image.shape[:2]
    w0, h0 = slide.dimensions
    downsample = (w0 / w + h0 / h) / 2
    mask = otsu_mask(image)
    return TissueMask(mask, downsample)


def otsu_mask(image: np.ndarray) -> np.ndarray:
    """Otsu threshold on saturation (or on darkness for grey images), then cleaned."""
    saturation = _saturation(image)
    darkness = 255.0 - greyscale(image)
    channel = saturation if np.ptp(saturation) > 0.05 else darkness
    if np.ptp(channel) <= 1e-6:
        return np.zeros(image.shape[:2], bool)
    mask = channel > threshold_otsu(channel)
    # Only pixels the rule calls tissue qualify: this drops black borders and pen-free glass noise.
    mask &= rule_mask(image)
    speck = max(4, mask.size // 20000)
    mask = remove_small_objects(mask, max_size=speck)
    return remove_small_holes(mask, max_size=speck)


def _saturation(image: np.ndarray) -> np.ndarray:
    """HSV saturation (max - min) / max, 0 for black; as skimage's rgb2hsv but without hue."""
    rgb = image[..., :3]
    top = rgb.max(axis=2).astype(np.float32)
    spread = top - rgb.min(axis=2)
    return np.divide(spread, top, out=np.zeros_like(top), where=top > 0)


def _mask_level(slide: Slide, max_size: int) -> int | None:
    """The most detailed level whose longer side fits `max_size`; None when every level is larger."""
    for level, (w, h) in enumerate(slide.level_dimensions):
        if max(w, h) <= max_size:
            return level
    return None
