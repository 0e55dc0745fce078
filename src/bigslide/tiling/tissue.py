"""Find tissue on a slide: which pixels are stained tissue, glass or something else on the glass (pen ink,
marker, dust, bubble rims), an Otsu mask on a low level, and the Big-Layers greyscale rule.

Which pixels are ink is `bigslide.tiling.ink`'s rule, and `bigslide.tiling.films`' for pens on the
glass; the pixel classes, the settings and the measures they share are in `bigslide.tiling.pixel_classes`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from skimage.filters import threshold_otsu
from skimage.morphology import remove_small_holes, remove_small_objects

from bigslide.tiling.films import films_on_glass
from bigslide.tiling.ink import ink_mask
from bigslide.tiling.pixel_classes import (
    FILM,
    GLASS,
    GLASS_OD,
    GLASS_WINDOW_UM,
    INK,
    PEN_FLATNESS,
    RULE_HIGH,
    RULE_LOW,
    TEXTURE_UM,
    TISSUE,
    UNKNOWN_PIXEL_UM,
    TissueSettings,
    enclosed,
    flatness_window,
    gaussian_planes,
    greyscale,
    light_texture,
    optical_density,
    summed,
)
from bigslide.wsi.tiff_tiles import LUMA

if TYPE_CHECKING:
    from bigslide.wsi.slide import Slide

DEFAULT_MIN_TISSUE = 0.6


MASK_SIZE = 2048
"""Longer side of the low-resolution image tissue is found on when no finer measure is needed."""


CLASSIFY_UM = 2.0
"""Pixels finer than this (µm) are judged in blocks of about this size: cells, not their insides."""


class TissueMask(NamedTuple):
    """Boolean tissue mask; pixel (i, j) covers level-0 pixels [j*ds, (j+1)*ds) x [i*ds, (i+1)*ds)."""

    mask: np.ndarray
    downsample: float


def rule_mask(rgb: np.ndarray) -> np.ndarray:
    """Per-pixel Big-Layers rule: True where greyscale is in [3, 230]."""
    grey = greyscale(rgb)
    return (grey >= RULE_LOW) & (grey <= RULE_HIGH)


def tile_tissue_fraction(tile: np.ndarray) -> float:
    """Fraction of a tile's pixels that pass the Big-Layers rule (keep a tile when >= 0.6)."""
    mask = rule_mask(tile)
    return float(mask.mean()) if mask.size else 0.0


def glass_od(rgb: np.ndarray) -> np.ndarray:
    """(3,) OD of the slide's glass: the median of its bright, nearly grey pixels (0 when it shows none)."""
    rgb = np.asarray(rgb)[..., :3].reshape(-1, 3)
    rgb = rgb[:: max(1, len(rgb) // 250_000)]  # a sample is plenty for a median
    bright = rgb[greyscale(rgb) >= 200]
    bright = bright[_saturation(bright) < 0.15]
    if len(bright) < max(16, len(rgb) // 1000):
        return np.zeros(3, np.float32)
    median = [_median(bright[:, c]) for c in range(3)] if bright.dtype == np.uint8 else np.median(bright, 0)
    return optical_density(np.asarray(median, np.float64)).astype(np.float32)


def _median(values: np.ndarray) -> float:
    """`np.median` of uint8 values, from their histogram (a sort of the whole sample costs ten times more)."""
    cumulative = np.bincount(values, minlength=256).cumsum()
    n = len(values)
    middle = np.searchsorted(cumulative, [(n - 1) // 2 + 1, n // 2 + 1])  # the values at (n-1)//2 and n//2
    return float(middle.mean())


def classify_pixels(
    rgb: np.ndarray,
    settings: TissueSettings = TissueSettings(),
    *,
    glass: np.ndarray | None = None,
    pixel_um: float | None = None,
    mark_films: bool = False,
) -> np.ndarray:
    """uint8 class per pixel of an (H, W, 3) image: GLASS, TISSUE or INK.

    `glass`: the slide's glass OD (`glass_od`; default: measured on `rgb`); `pixel_um`: µm per pixel of
    `rgb`, to fill holes of `settings.fill_holes_um` (None: no filling); `mark_films`: ink that only the
    film rule found is FILM instead of INK.
    """
    rgb = np.asarray(rgb)[..., :3]
    factor = int(CLASSIFY_UM // pixel_um) if pixel_um else 1
    if pixel_um and factor >= 2 and min(rgb.shape[:2]) >= 2 * factor and settings.reject_ink:
        # finer than the rule needs: judge blocks of `factor` pixels, and give each pixel its block's class
        coarse = classify_pixels(
            block_mean(rgb, factor), settings, glass=glass, pixel_um=pixel_um * factor, mark_films=mark_films
        )
        fine = np.repeat(np.repeat(coarse, factor, axis=0), factor, axis=1)
        return np.pad(fine, [(0, max(0, n - m)) for n, m in zip(rgb.shape[:2], fine.shape)], mode="edge")[
            : rgb.shape[0], : rgb.shape[1]
        ]
    if not settings.reject_ink:
        grey = greyscale(rgb)
        out = np.full(grey.shape, GLASS, np.uint8)
        out[grey < RULE_LOW] = INK
        out[(grey >= RULE_LOW) & (grey <= RULE_HIGH)] = TISSUE
        return out
    od = optical_density(rgb, glass_od(rgb) if glass is None else glass)
    total = summed(od)
    sigma = max(1.0, TEXTURE_UM / pixel_um) if pixel_um else 1.0
    ink = ink_mask(od, settings, sigma) | _darker_than(rgb, RULE_LOW)
    window = max(0.5, GLASS_WINDOW_UM / pixel_um) if pixel_um else 0.5
    faint = total >= 0.5 * GLASS_OD  # bare glass stays glass, however near a tissue's edge
    around = gaussian_planes(total[None], window)[0]
    out = _classes(np.where(faint, np.maximum(total, around), total), ink, pixel_um, settings)
    if settings.ink_flatness > 0:
        # films are judged on glass pixel by pixel: a stroke's faint halo is glass around it, not tissue
        plain = _classes(total, ink, pixel_um, settings)
        films = films_on_glass(od, plain, settings, pixel_um or UNKNOWN_PIXEL_UM)
        out[films & (out != INK)] = FILM if mark_films else INK
    return out


def _darker_than(rgb: np.ndarray, level: float) -> np.ndarray:
    """Pixels whose `greyscale` is below `level`, worked out only where every channel is dark enough for
    that (each adds its weight times itself to the greyscale): most of a slide is far brighter."""
    red, green, blue = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    maybe = (red < level / LUMA[0]) & (green < level / LUMA[1]) & (blue < level / LUMA[2])
    out = np.zeros(maybe.shape, bool)
    out[maybe] = greyscale(rgb[maybe]) < level
    return out


def _classes(
    absorbing: np.ndarray, ink: np.ndarray, pixel_um: float | None, settings: TissueSettings
) -> np.ndarray:
    """TISSUE where `absorbing` (summed OD above the glass) reaches GLASS_OD, else GLASS; INK at `ink`;
    glass enclosed by tissue up to `settings.fill_holes_um` across is tissue."""
    out = np.where(absorbing >= GLASS_OD, TISSUE, GLASS).astype(np.uint8)
    out[ink] = INK
    if pixel_um and settings.fill_holes_um > 0:
        hole = math.pi * (settings.fill_holes_um / pixel_um / 2) ** 2
        out[enclosed(out != TISSUE, hole) & (out == GLASS)] = TISSUE
    return out


def textured_pixels(
    rgb: np.ndarray, glass: np.ndarray | None = None, pixel_um: float | None = None, step: int = 1
) -> np.ndarray:
    """Whether each `step`-th pixel of every `step`-th row of an (H, W, 3) image varies in light across a
    nucleus-wide window as cells make it vary (`light_texture` at least PEN_FLATNESS): what tissue looks
    like, and glass, a dark background or a film of ink does not."""
    od = optical_density(np.asarray(rgb)[::step, ::step, :3], glass_od(rgb) if glass is None else glass)
    total = summed(od)
    return light_texture(total, flatness_window((pixel_um or UNKNOWN_PIXEL_UM) * step)) >= PEN_FLATNESS


def block_mean(rgb: np.ndarray, factor: int) -> np.ndarray:
    """uint8 image reduced by `factor` (means of whole blocks, rounded; a partial last row or column is
    dropped). Summed slice by slice in uint16: a mean over reshaped block axes is several times slower."""
    if factor == 1:
        return rgb
    h, w = rgb.shape[0] // factor * factor, rgb.shape[1] // factor * factor
    dtype = np.uint16 if factor <= 16 else np.uint32  # 16 * 16 * 255 still fits 16 bits
    rows: np.ndarray = rgb[0:h:factor, :w].astype(dtype)
    for i in range(1, factor):
        np.add(rows, rgb[i:h:factor, :w], out=rows)
    sums: np.ndarray = rows[:, 0:w:factor].copy()
    for j in range(1, factor):
        np.add(sums, rows[:, j:w:factor], out=sums)
    return np.rint(sums.astype(np.float32) / np.float32(factor * factor)).astype(np.uint8)


def tissue_mask(
    slide: Slide,
    *,
    max_size: int = MASK_SIZE,
    settings: TissueSettings = TissueSettings(),
) -> TissueMask:
    """Otsu tissue mask on a low level (longer side <= `max_size`), small specks and holes removed, and
    only pixels `settings` call tissue (no ink, marker or dust).

    Thresholds saturation (stained tissue is coloured, glass is not); falls back to darkness when the
    image has no colour. Only the chosen low level is read.
    """
    level = _mask_level(slide, max_size)
    image = slide.thumbnail(max_size) if level is None else slide.read_level(level)
    h, w = image.shape[:2]
    w0, h0 = slide.dimensions
    downsample = (w0 / w + h0 / h) / 2
    pixel_um = slide.mpp[0] * downsample if slide.mpp is not None else None
    mask = otsu_mask(image, settings, pixel_um=pixel_um)
    return TissueMask(mask, downsample)


def otsu_mask(
    image: np.ndarray,
    settings: TissueSettings = TissueSettings(),
    *,
    pixel_um: float | None = None,
) -> np.ndarray:
    """The pixels `classify_pixels` calls tissue, small specks and holes removed. With the greyscale
    rule: an Otsu threshold on saturation (or on darkness for grey images) within the rule's pixels.

    Ink is the most saturated thing on a slide: with it on the glass, an Otsu cut on saturation falls
    between ink and tissue, so the stain rule's own glass threshold (relative to the slide's glass)
    decides instead.
    """
    classes = classify_pixels(image, settings, pixel_um=pixel_um)
    mask = classes == TISSUE
    if not settings.reject_ink:
        saturation = _saturation(image)
        darkness = 255.0 - greyscale(image)
        channel = saturation if np.ptp(saturation) > 0.05 else darkness
        if np.ptp(channel) <= 1e-6:
            return np.zeros(image.shape[:2], bool)
        mask &= channel > threshold_otsu(channel)
    speck = max(4, mask.size // 20000)
    mask = remove_small_objects(mask, max_size=speck)
    return remove_small_holes(mask, max_size=speck)


def _saturation(image: np.ndarray) -> np.ndarray:
    """HSV saturation (max - min) / max, 0 for black; as skimage's rgb2hsv but without hue."""
    red, green, blue = image[..., 0], image[..., 1], image[..., 2]  # a reduce over the last axis is slow
    top = np.maximum(np.maximum(red, green), blue).astype(np.float32)
    spread = top - np.minimum(np.minimum(red, green), blue)
    return np.divide(spread, top, out=np.zeros_like(top), where=top > 0)


def _mask_level(slide: Slide, max_size: int) -> int | None:
    """The most detailed level whose longer side fits `max_size`; None when every level is larger."""
    for level, (w, h) in enumerate(slide.level_dimensions):
        if max(w, h) <= max_size:
            return level
    return None
