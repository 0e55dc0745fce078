"""Pen strokes of any colour on the glass: flat films of dye lying on open glass.

Colour cannot tell every pen from a stain (a pink or violet pen is H&E's own colour), but place can
(`ink_flatness`, 0.15 by default; 0 turns it off): a pen stroke on the glass is a flat film (its light
varies little across a few cells, `light_texture` below `ink_flatness`) lying on open glass, where a flat
patch of tissue (stroma, a blurred area, an aggregate) lies among textured tissue. So a flat area of one
hue, of at least a stroke's breadth, whose surroundings are at least `GLASS_RIM` open glass is ink,
whatever its colour, together with its soft edge (pixels of its own colour, or faint, beside it). For an
area of a hue no stain makes (red, orange, green ink), that soft edge counts with the glass around it. Glass
among tissue (fat, lumens, up to `OPEN_GLASS_UM` across) is not open glass. Stroma with sparse nuclei at
the tissue's edge is flat on these pixels and meets the glass too, but it is paler than the tissue it
belongs to and of its eosin's colour: a flat area as pale as the image's own textured tissue
(`FILM_OVER_TISSUE`) and eosin-pink on the whole is tissue, not a film (a light blue or grey stroke, paler
than the tissue too, is not pink). Films are looked for only on
eosin-stained tissue (H&E): on the coarse pixels tiles are measured on (about 8 µm), an IHC slide's
counterstain with sparse nuclei and its broad DAB fields are flat too, and where they meet the glass they
would be taken for films.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from scipy import ndimage

from bigslide.tiling.ink import grown_box
from bigslide.tiling.pixel_classes import (
    GLASS,
    INK,
    INK_MIN_OD,
    TISSUE,
    TissueSettings,
    enclosed,
    flatness_window,
    gaussian_planes,
    light_texture,
    summed,
)

EOSIN_RED_GREEN = 0.6


EOSIN_BLUE_GREEN = 0.75


EOSIN_MIN_SHARE = 0.1
"""Films are looked for only where the textured tissue is eosin-stained: at least EOSIN_MIN_SHARE of it
absorbing red light less than 0.6 times as much as green and blue less than 0.75 times (eosin
0.07 : 1 : 0.11; half and half with hematoxylin 0.43 : 1 : 0.24). IHC's hematoxylin counterstain
(0.93 : 1 : 0.41, a purple one about 0.78 : 1 : 0.56) and DAB (0.47 : 1 : 1.37) are not, and on the coarse
levels tiles are measured on they are as flat as a pen's film. On the tissue bench's tuning slides 18-80 %
of the textured tissue is eosin-stained."""


GLASS_RIM = 0.2
"""Share of a flat area's surroundings that must be open glass for it to be ink."""


OPEN_GLASS_UM = 300.0
"""Glass enclosed by tissue or ink up to this many µm across (fat, lumens) is not open glass."""


THIN_INK_UM = 30.0
"""Ink thinner than this (a bubble's rim, dust) does not enclose glass: a rim drawn across a pen's stroke
had closed the glass inside it, and the stroke's segment there was kept as tissue (on the tissue bench's
tuning slides, 46 of one stroke's 580 tiles). A pen's stroke (80-180 µm) still does."""


FILM_MIN_UM = 25.0
"""A flat area on the glass is ink from a 25 µm radius disk's area on (pen strokes are 80-180 µm wide)."""


EDGE_COSINE = 0.97
"""A stroke's soft edge: pixels whose OD points within acos(0.97) = 14 degrees of the stroke's mean."""


FILM_OVER_TISSUE = 1.3
"""A film whose summed OD is below FILM_OVER_TISSUE times the median of the image's textured tissue, and
whose mean OD is eosin-pink (`_pale_stroma`), is stroma. On the tissue bench's tuning slides, flat areas
of tissue taken for films (pale stroma at the tissue's edge, 99 areas) absorbed 0.46-1.06 times that
median; pens' films 1.65 times or more. A light greyish blue stroke of the development slides absorbed
less than the tissue: colour, not amount alone, tells it. On `bench grid`'s H&E slide, with no ink at
all, the rule without this left 17 tiles of such stroma out as ink."""


MIN_JUDGED_PX = 64
"""Textured tissue pixels an image needs for its stain to be judged."""


HUE_BIN = 30.0


NEUTRAL_CHROMA = 0.08
"""Flat areas are found per hue band of HUE_BIN degrees (grey, below NEUTRAL_CHROMA, is a band of its own),
in two sets of bands half a band apart, so that a stroke's hue never straddles every set's edge."""


STAIN_HUES = (36.0, 152.0)
"""OD hues (degrees, `_od_hue`) H&E's stains make in any lab: hematoxylin (0.65 : 0.70 : 0.29) at 66° and
eosin (0.07 : 0.99 : 0.11) at 122°, each turned by up to 30°, and every mix between. Red and orange inks
(160-200°), green (about 335°) and DAB (204°) lie outside; blue and violet inks lie inside."""


def films_on_glass(
    od: np.ndarray, classes: np.ndarray, settings: TissueSettings, pixel_um: float
) -> np.ndarray:
    """Pixels of flat films of dye lying on open glass (pen strokes of any colour), with their soft edges;
    `classes`: GLASS / TISSUE / INK so far (filled holes already TISSUE, so fat is not open glass);
    `settings.ink_flatness` above 0."""
    total = summed(od)
    sigma = flatness_window(pixel_um)
    tissue = classes == TISSUE
    smooth = light_texture(total, sigma) < settings.ink_flatness
    flat = (tissue & smooth) | (classes == INK)
    textured = tissue & ~smooth
    if not flat.any() or not _eosin_stained(od, textured):
        return np.zeros(flat.shape, bool)
    # the tissue's typical amount is wanted only for an eosin-pink film: found once, when first asked
    least = functools.cache(lambda: FILM_OVER_TISSUE * _typical(total, textured))
    reach = math.ceil(3 * sigma) + 2  # past the textured band a soft edge leaves around a stroke
    min_size = math.pi * (FILM_MIN_UM / pixel_um) ** 2
    ink = np.zeros(flat.shape, bool)
    # glass among tissue (fat cells, lumens) is no place for a pen: only glass reaching the image's edge, or
    # wider than a lumen, is open; a thin line of ink (a bubble's rim) does not close it
    thin = math.ceil(THIN_INK_UM / pixel_um / 2)
    walls = (classes == TISSUE) | _opened(classes == INK, thin)
    open_glass = (classes == GLASS) & ~enclosed(~walls, math.pi * (OPEN_GLASS_UM / pixel_um / 2) ** 2)
    # a film of one hue lies within a flat area of any hue: only areas of a film's size with open glass
    # within reach can hold one, and each is judged on its own rectangle (together a few % of the image)
    areas, _count = ndimage.label(flat)
    sizes = np.bincount(areas.ravel())
    candidate = sizes >= min_size
    candidate[0] = False
    reached = np.zeros(len(sizes), bool)
    reached[areas[ndimage.maximum_filter(open_glass, size=2 * reach + 1) & flat]] = True
    boxes = ndimage.find_objects(areas)
    h, w = flat.shape
    grow = math.ceil(sigma + 1)  # how far a stroke's soft edge reaches
    spread = grow + int(4.0 * sigma + 0.5)  # and what the Gaussian measuring it reads around it
    found = []
    for area in np.flatnonzero(candidate & reached):
        part = grown_box(boxes[area - 1], reach, (h, w))
        own = areas[part] == area
        films = _films_of_one_hue(od[part], flat[part], open_glass[part], reach, min_size) & own
        if films.any() and not _pale_stroma(od[part][films], least):
            ink[part] |= films
            found.append(area)
    out = ink.copy()
    # the stroke's soft edge is textured (the window spans it) but of the stroke's colour, or faint; judged
    # on a rectangle around each area with films, which gives every pixel the value the whole image would
    for area in found:
        part = grown_box(boxes[area - 1], spread, (h, w))
        near = ndimage.binary_dilation(ink[part] & (areas[part] == area), iterations=grow) & tissue[part]
        out[part] |= _soft_edge(od[part], total[part], ink[part], near, sigma)
    return out


def _films_of_one_hue(
    od: np.ndarray, flat: np.ndarray, open_glass: np.ndarray, reach: int, min_size: float
) -> np.ndarray:
    """The `flat` pixels in areas of one hue band whose surroundings (`reach` pixels around) are at least
    GLASS_RIM `open_glass`, of at least `min_size` pixels."""
    out = np.zeros(flat.shape, bool)
    flat_od = od[flat]  # hue and chroma only where they are used
    hue = _od_hue(flat_od)
    neutral = _od_chroma(flat_od) < NEUTRAL_CHROMA
    for offset in (0.0, 0.5):
        # one area per hue: a stroke running along the tissue is not joined to the flat stroma beside it
        flat_bins = np.floor(hue / HUE_BIN + offset).astype(np.int8) % round(360 / HUE_BIN)
        flat_bins[neutral] = -1
        bins = np.full(flat.shape, -2, np.int8)
        bins[flat] = flat_bins
        labels = np.zeros(flat.shape, np.int32)
        count = 0
        off_stain = [False]  # per label
        for b in np.unique(flat_bins):
            part, n = ndimage.label(bins == b)
            inside = part > 0
            labels[inside] = part[inside] + count
            count += n
            off_stain += [_off_stain(int(b), offset)] * n
        ring = ndimage.grey_dilation(labels, size=2 * reach + 1)
        ring[flat] = 0
        size = np.bincount(labels.ravel(), minlength=count + 1)
        glassy = open_glass
        if any(off_stain):
            # an area of a hue no stain makes is dye, its soft edge of its own colour between it and the
            # glass (a dense stroke's edge fills the narrow ring); a stain-hued area's rim may be tissue
            glassy = open_glass | (_own_edge(od, labels, ring, size) & np.asarray(off_stain)[ring])
        on_glass = np.bincount(ring[glassy], minlength=count + 1)
        around = np.bincount(ring.ravel(), minlength=count + 1)
        # an area wholly among flat ones of other hues (a stroke's core within its edge) counts
        film = (on_glass >= GLASS_RIM * around) & (size >= min_size)
        film[0] = False
        out |= film[labels]
    return out


def _off_stain(band: int, offset: float) -> bool:
    """Whether hue band `band` of the band set shifted by `offset` lies wholly outside STAIN_HUES (the
    grey band, -1, does not)."""
    if band < 0:
        return False
    low = (band - offset) * HUE_BIN  # from -HUE_BIN / 2 for the first band of the shifted set
    high = low + HUE_BIN
    first, last = STAIN_HUES
    return high <= first and low % 360 >= last if low < 0 else high <= first or low >= last


def _own_edge(od: np.ndarray, labels: np.ndarray, ring: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Ring pixels whose OD points the way of the mean OD of the area they surround (within
    acos(EDGE_COSINE)): a stroke's own soft edge, which lies between it and the glass."""
    flat_labels = labels.ravel()
    mean = (
        np.stack(
            [np.bincount(flat_labels, weights=od[..., c].ravel(), minlength=len(size)) for c in range(3)],
            axis=-1,
        )
        / np.maximum(size, 1)[:, None]
    )
    out = np.zeros(ring.shape, bool)
    near = ring > 0
    out[near] = _cosine(od[near], mean[ring[near]]) >= EDGE_COSINE
    return out


def _soft_edge(
    od: np.ndarray, total: np.ndarray, ink: np.ndarray, near: np.ndarray, sigma: float
) -> np.ndarray:
    """The `near` pixels whose OD points the way of the `ink`'s around them (within acos(EDGE_COSINE)), or
    that are faint. Every `near` pixel must lie the Gaussian's radius inside the crop's edges (or on the
    image's own edge): then its value is the one the whole image gives."""
    out = np.zeros(near.shape, bool)
    if not near.any():
        return out
    weight = ink.astype(np.float32)
    weighted = np.stack([od[..., c] * weight for c in range(3)])
    beside = np.moveaxis(gaussian_planes(weighted, sigma, mode="reflect")[:, near], 0, -1)
    out[near] = (_cosine(od[near], beside) >= EDGE_COSINE) | (total[near] < INK_MIN_OD)
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of the angle between each pair of (..., 3) OD vectors (0 where either is 0)."""
    return summed(a * b) / np.maximum(_length(a) * _length(b), 1e-6)


def _length(vectors: np.ndarray) -> np.ndarray:
    """Euclidean length of each (..., 3) vector (channel by channel: a reduce over the last axis is slow)."""
    x, y, z = vectors[..., 0], vectors[..., 1], vectors[..., 2]
    return np.sqrt(x * x + y * y + z * z)


def _eosin_stained(od: np.ndarray, textured: np.ndarray) -> bool:
    """Whether the `textured` tissue is H&E-like (eosin in at least EOSIN_MIN_SHARE of it); True when
    there is too little of it to tell (an image of glass and ink)."""
    judged = np.count_nonzero(textured)
    if judged < MIN_JUDGED_PX:
        return True
    red, green, blue = od[..., 0], od[..., 1], od[..., 2]
    pink = textured & (red < EOSIN_RED_GREEN * green) & (blue < EOSIN_BLUE_GREEN * green)
    return bool(np.count_nonzero(pink) / judged >= EOSIN_MIN_SHARE)


def _pale_stroma(od: np.ndarray, least: Callable[[], float]) -> bool:
    """Whether a film of these (N, 3) OD pixels is eosin-pink and absorbs less than `least()` (summed)."""
    red, green, blue = (float(v) for v in od.mean(axis=0))
    return red < EOSIN_RED_GREEN * green and blue < EOSIN_BLUE_GREEN * green and red + green + blue < least()


def _typical(total: np.ndarray, textured: np.ndarray) -> float:
    """The median summed OD of the `textured` pixels (a sample of at most about 100,000 of them); 0 when
    there are fewer than MIN_JUDGED_PX (an image of glass and ink: no tissue to compare a film with)."""
    values = total[textured]
    if len(values) < MIN_JUDGED_PX:
        return 0.0
    return float(np.median(values[:: max(1, len(values) // 100_000)]))


def _opened(mask: np.ndarray, iterations: int) -> np.ndarray:
    """`ndimage.binary_opening(mask, iterations=iterations)`, worked out on the rectangle around `mask`'s
    pixels (and `iterations` beyond): nothing outside it can be set, and most images have little ink."""
    out = np.zeros(mask.shape, bool)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if len(rows) == 0:
        return out
    box = (slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1))
    part = grown_box(box, iterations, mask.shape)
    out[part] = ndimage.binary_opening(mask[part], iterations=iterations)
    return out


def _od_hue(od: np.ndarray) -> np.ndarray:
    """Hue of each pixel's OD (degrees): the angle of its colour around the grey axis. Not
    `bigslide.hue.hue_angle` made per pixel: that measures from an origin 30° away, and pixels of equal green
    and blue, exactly on a band's edge here, would fall on either side of it by rounding (tried: the flat
    blurred patch of `tests/test_ink_films.py` became 14 % ink)."""
    red, green, blue = od[..., 0], od[..., 1], od[..., 2]
    return np.degrees(np.arctan2(math.sqrt(3) * (green - blue), 2 * red - green - blue)) % 360


def _od_chroma(od: np.ndarray) -> np.ndarray:
    """How far a pixel's OD lies from grey, as a share of its amount."""
    amount = summed(od)
    return _length(od - (amount / 3)[..., None]) / np.maximum(amount, 1e-6)
