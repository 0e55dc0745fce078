"""Find tissue on a slide: which pixels are stained tissue, glass or something else on the glass (pen ink,
marker, dust, bubble rims), an Otsu mask on a low level, and the Big-Layers greyscale rule.

Pixels are judged in optical density (OD = -ln(intensity / 255)) above the slide's own glass, so a lab's
colour cast or a dim lamp moves glass and tissue together. Hematoxylin and eosin absorb green light most
(eosin) or red and green alike (hematoxylin), and blue light little. A pixel is not tissue when it is grey
or black (dust, black ink, bubble rims), or when it is a film of dye with no cells in it: off-stain
(absorbing at least `TissueSettings.ink_blue_green` as much blue as green: green, red, black) or
blue-violet (absorbing more red than green, as blue ink and a bluish hematoxylin both do; colour cannot
tell them apart) and smooth in colour (`colour_texture` below `ink_texture` in most of its
neighbourhood). Ink is one dye, so it varies in amount only; tissue is nuclei beside cytoplasm and
stroma. Strokes of two inks crossing (darker than any stain, off colour) are ink however textured; ink
takes in the off-colour and bluish pixels at its rim and in pockets it encloses. Glass enclosed by tissue
(fat, lumens) up to `fill_holes_um` across counts as tissue.

Colour cannot tell every pen from a stain (a pink or violet pen is H&E's own colour), but place can
(`ink_flatness`, 0.15 for slides with pen marks; 0, the default, turns it off): a pen stroke on the glass
is a flat film (its light varies little across a few cells, `light_texture` below `ink_flatness`) lying
on open glass, where a flat patch of tissue (stroma, a blurred area, an aggregate) lies among textured
tissue. So a flat area of one hue, of at least a stroke's breadth, whose surroundings are at least
`GLASS_RIM` open glass is ink, whatever its colour, together with its soft edge (pixels of its own
colour, or faint, beside it). Glass among tissue (fat, lumens, up to `OPEN_GLASS_UM` across) is not open
glass. It is off by default: on the coarse levels tiles are measured on (8-16 µm/px), an IHC slide's
counterstain with sparse nuclei and its broad DAB fields are flat too, and where they meet the glass they
were taken for films.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from scipy import ndimage
from skimage.filters import threshold_otsu
from skimage.morphology import remove_small_holes, remove_small_objects

if TYPE_CHECKING:
    from bigslide.wsi.slide import Slide

RULE_LOW = 3
RULE_HIGH = 230
"""Big-Layers rule: a pixel is tissue when its greyscale is in [RULE_LOW, RULE_HIGH] (not glass/black)."""

DEFAULT_MIN_TISSUE = 0.6
MASK_SIZE = 2048
"""Longer side of the low-resolution image tissue is found on when no finer measure is needed."""

GLASS_OD = 0.08
"""Summed OD above the glass's below which a pixel is glass (about greyscale 238 on glass of 245)."""
INK_MIN_OD = 0.3
"""Summed OD from which a pixel's colour is judged (fainter ones are pale tissue or glass)."""
SMOOTH_MIN_OD = 0.6
"""Summed OD from which a smooth blue-violet area is ink (a paler one is faint tissue)."""
DARK_OD = 4.5
"""Summed OD from which any colour may be ink (where strokes of two inks cross, the mix looks purple)."""
BROWN_BLUE_GREEN = 0.75
BROWN_RED_GREEN = (0.3, 0.85)
"""Brown, never ink: blue OD at least 0.75 times the green's and red OD 0.3 to 0.85 times it: DAB (IHC's
stain, OD 0.27 : 0.57 : 0.78) alone or over hematoxylin (0.65 : 0.70 : 0.29), down to about 1.3 parts DAB
to 1 of hematoxylin. The pens' inks lie outside: red 0.16 : 1 : 0.88, black 1 : 1 : 0.9, green
2.5 : 1 : 1.7, blue 1.3 : 1 : 0.36."""
PEN_FLATNESS = 0.15
"""`ink_flatness` for slides with pen marks on the glass (chosen on the tissue bench's tuning seeds)."""
GLASS_RIM = 0.2
"""Share of a flat area's surroundings that must be open glass for it to be ink."""
OPEN_GLASS_UM = 300.0
"""Glass enclosed by tissue or ink up to this many µm across (fat, lumens) is not open glass."""
FILM_MIN_UM = 25.0
"""A flat area on the glass is ink from a 25 µm radius disk's area on (pen strokes are 80-180 µm wide)."""
EDGE_COSINE = 0.97
"""A stroke's soft edge: pixels whose OD points within acos(0.97) = 14 degrees of the stroke's mean."""
HUE_BIN = 30.0
NEUTRAL_CHROMA = 0.08
"""Flat areas are found per hue band of HUE_BIN degrees (grey, below NEUTRAL_CHROMA, is a band of its own),
in two sets of bands half a band apart, so that a stroke's hue never straddles every set's edge."""
FLAT_MIN_PX = 0.7
"""The flatness window (Gaussian sigma) is at least this many pixels: on coarse levels a stroke spans few."""
UNKNOWN_PIXEL_UM = 8.0
"""µm per pixel the glass films' sizes assume on an image of unknown scale."""
VOTE_SIGMA = 2.0
GROW_PX = 2
POCKET_PX = 16
"""Off-colour pockets enclosed by ink up to this radius (times the texture window) are ink too."""
CLASSIFY_UM = 2.0
"""Pixels finer than this (µm) are judged in blocks of about this size: cells, not their insides."""
TEXTURE_UM = 6.0
"""Window (Gaussian sigma, µm) colour texture is measured over: about a nucleus."""

GLASS, TISSUE, INK = 0, 1, 2
"""Pixel classes of `classify_pixels`: glass, stained tissue, and anything else on the glass (pen ink,
marker, dust, bubble rims, black)."""


@dataclass(frozen=True)
class TissueSettings:
    """How tissue is told from glass and from what lies on the glass (`data.*` settings of the same names).

    `reject_ink` False is the Big-Layers greyscale rule alone (the ink and hole fields are then
    unused). `exclude_blurred`: tiles less sharp than `min_sharpness` are left out (`bigslide.tiling.blur`);
    they are measured either way. `exclude_classes`: regions of these classes (besides QuPath's ignored
    classes, whose names end in "*") are areas to leave out (`bigslide.tiling.regions.centres_sampled`).
    """

    reject_ink: bool = True
    ink_blue_green: float = 0.6
    ink_texture: float = 0.01
    ink_flatness: float = 0.0
    fill_holes_um: float = 100.0
    min_sharpness: float = 0.1
    exclude_blurred: bool = False
    exclude_classes: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TissueSettings:
        """The settings `dataclasses.asdict` wrote (lists back to tuples)."""
        known = {f.name for f in dataclasses.fields(cls)}
        kept: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in known
        }
        return cls(**kept)

    def describe(self) -> str:
        if not self.reject_ink:
            return "greyscale rule [3, 230]"
        return (
            f"stain rule (ink: blue/green OD >= {self.ink_blue_green:g} or blue-violet, with colour texture "
            f"< {self.ink_texture:g}"
            + (
                f", and flat films on the glass (light texture < {self.ink_flatness:g})"
                if self.ink_flatness
                else ""
            )
            + f"; holes < {self.fill_holes_um:g} µm filled)"
        )


GREYSCALE_RULE = TissueSettings(reject_ink=False, fill_holes_um=0.0)
"""The Big-Layers rule alone: greyscale in [3, 230] (no ink rejection, no filling)."""


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


def optical_density(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) float32 OD of uint8 RGB, finite at 0 (intensities offset by half a level)."""
    return -np.log((np.asarray(rgb[..., :3], np.float32) + 0.5) / 255.5)


def summed(od: np.ndarray) -> np.ndarray:
    """The three channels of an (..., 3) array added (a sum over the last axis is ten times slower)."""
    return od[..., 0] + od[..., 1] + od[..., 2]


def glass_od(rgb: np.ndarray) -> np.ndarray:
    """(3,) OD of the slide's glass: the median of its bright, nearly grey pixels (0 when it shows none)."""
    rgb = np.asarray(rgb)[..., :3].reshape(-1, 3)
    rgb = rgb[:: max(1, len(rgb) // 250_000)]  # a sample is plenty for a median
    grey = greyscale(rgb)
    bright = rgb[(grey >= 200) & (_saturation(rgb) < 0.15)]
    if len(bright) < max(16, len(rgb) // 1000):
        return np.zeros(3, np.float32)
    return optical_density(np.median(bright, axis=0)).astype(np.float32)


def classify_pixels(
    rgb: np.ndarray,
    settings: TissueSettings = TissueSettings(),
    *,
    glass: np.ndarray | None = None,
    pixel_um: float | None = None,
) -> np.ndarray:
    """uint8 class per pixel of an (H, W, 3) image: GLASS, TISSUE or INK.

    `glass`: the slide's glass OD (`glass_od`; default: measured on `rgb`); `pixel_um`: µm per pixel of
    `rgb`, to fill holes of `settings.fill_holes_um` (None: no filling).
    """
    rgb = np.asarray(rgb)[..., :3]
    factor = int(CLASSIFY_UM // pixel_um) if pixel_um else 1
    if pixel_um and factor >= 2 and min(rgb.shape[:2]) >= 2 * factor and settings.reject_ink:
        # finer than the rule needs: judge blocks of `factor` pixels, and give each pixel its block's class
        coarse = classify_pixels(_block_mean(rgb, factor), settings, glass=glass, pixel_um=pixel_um * factor)
        fine = np.repeat(np.repeat(coarse, factor, axis=0), factor, axis=1)
        return np.pad(fine, [(0, max(0, n - m)) for n, m in zip(rgb.shape[:2], fine.shape)], mode="edge")[
            : rgb.shape[0], : rgb.shape[1]
        ]
    grey = greyscale(rgb)
    if not settings.reject_ink:
        out = np.full(grey.shape, GLASS, np.uint8)
        out[grey < RULE_LOW] = INK
        out[(grey >= RULE_LOW) & (grey <= RULE_HIGH)] = TISSUE
        return out
    od = optical_density(rgb)
    od -= glass_od(rgb) if glass is None else np.asarray(glass, np.float32)
    np.maximum(od, 0, out=od)
    total = summed(od)
    sigma = max(1.0, TEXTURE_UM / pixel_um) if pixel_um else 1.0
    ink = ink_mask(od, settings, sigma) | (grey < RULE_LOW)
    out = np.where(total >= GLASS_OD, TISSUE, GLASS).astype(np.uint8)
    out[ink] = INK
    if pixel_um and settings.fill_holes_um > 0:
        hole = math.pi * (settings.fill_holes_um / pixel_um / 2) ** 2
        out[enclosed(out != TISSUE, hole) & (out == GLASS)] = TISSUE
    if settings.ink_flatness > 0:
        out[films_on_glass(od, out, settings, pixel_um or UNKNOWN_PIXEL_UM)] = INK
    return out


def films_on_glass(
    od: np.ndarray, classes: np.ndarray, settings: TissueSettings, pixel_um: float
) -> np.ndarray:
    """Pixels of flat films of dye lying on open glass (pen strokes of any colour), with their soft edges;
    `classes`: GLASS / TISSUE / INK so far (filled holes already TISSUE, so fat is not open glass);
    `settings.ink_flatness` above 0."""
    total = summed(od)
    sigma = _flatness_window(pixel_um)
    flat = ((classes == TISSUE) & (light_texture(total, sigma) < settings.ink_flatness)) | (classes == INK)
    if not flat.any():
        return flat
    reach = math.ceil(3 * sigma) + 2  # past the textured band a soft edge leaves around a stroke
    min_size = math.pi * (FILM_MIN_UM / pixel_um) ** 2
    ink = np.zeros(flat.shape, bool)
    # glass among tissue (fat cells, lumens) is no place for a pen: only glass reaching the image's edge, or
    # wider than a lumen, is open
    open_glass = (classes == GLASS) & ~enclosed(
        classes == GLASS, math.pi * (OPEN_GLASS_UM / pixel_um / 2) ** 2
    )
    hue = _od_hue(od)
    for offset in (0.0, 0.5):
        # one area per hue: a stroke running along the tissue is not joined to the flat stroma beside it
        bins = np.floor(hue / HUE_BIN + offset).astype(np.int64) % round(360 / HUE_BIN)
        bins[_od_chroma(od) < NEUTRAL_CHROMA] = -1
        labels = np.zeros(flat.shape, np.int64)
        count = 0
        for b in np.unique(bins[flat]):
            part, n = ndimage.label(flat & (bins == b))
            inside = part > 0
            labels[inside] = part[inside] + count
            count += n
        ring = ndimage.grey_dilation(labels, size=2 * reach + 1)
        ring[flat] = 0
        on_glass = np.bincount(ring[open_glass], minlength=count + 1)
        around = np.bincount(ring.ravel(), minlength=count + 1)
        size = np.bincount(labels.ravel(), minlength=count + 1)
        film = (on_glass >= GLASS_RIM * around) & (size >= min_size)
        film[0] = False
        ink |= film[labels]
    if not ink.any():
        return ink
    # the stroke's soft edge is textured (the window spans it) but of the stroke's colour, or faint
    near = ndimage.binary_dilation(ink, iterations=math.ceil(sigma + 1)) & (classes == TISSUE)
    weight = ink.astype(np.float32)
    beside = np.stack([ndimage.gaussian_filter(od[..., c] * weight, sigma) for c in range(3)], axis=-1)
    cosine = summed(od * beside) / np.maximum(
        np.linalg.norm(od, axis=-1) * np.linalg.norm(beside, axis=-1), 1e-6
    )
    return ink | (near & ((cosine >= EDGE_COSINE) | (total < INK_MIN_OD)))


def _od_hue(od: np.ndarray) -> np.ndarray:
    """Hue of each pixel's OD (degrees): the angle of its colour around the grey axis. Not
    `bigslide.hue.hue_angle` made per pixel: that measures from an origin 30° away, and pixels of equal green
    and blue, exactly on a band's edge here, would fall on either side of it by rounding (tried: the flat
    blurred patch of `tests/test_ink_films.py` became 14 % ink)."""
    red, green, blue = od[..., 0], od[..., 1], od[..., 2]
    return np.degrees(np.arctan2(math.sqrt(3) * (green - blue), 2 * red - green - blue)) % 360


def _flatness_window(pixel_um: float) -> float:
    """Gaussian sigma, in pixels of `pixel_um`, that flatness and cell texture are measured over."""
    return max(FLAT_MIN_PX, TEXTURE_UM / pixel_um)


def _od_chroma(od: np.ndarray) -> np.ndarray:
    """How far a pixel's OD lies from grey, as a share of its amount."""
    grey = od.mean(axis=-1, keepdims=True)
    return np.linalg.norm(od - grey, axis=-1) / np.maximum(summed(od), 1e-6)


def textured_pixels(
    rgb: np.ndarray, glass: np.ndarray | None = None, pixel_um: float | None = None, step: int = 1
) -> np.ndarray:
    """Whether each `step`-th pixel of every `step`-th row of an (H, W, 3) image varies in light across a
    nucleus-wide window as cells make it vary (`light_texture` at least PEN_FLATNESS): what tissue looks
    like, and glass, a dark background or a film of ink does not."""
    od = optical_density(np.asarray(rgb)[::step, ::step, :3])
    od -= glass_od(rgb) if glass is None else np.asarray(glass, np.float32)
    total = summed(np.maximum(od, 0))
    return light_texture(total, _flatness_window((pixel_um or UNKNOWN_PIXEL_UM) * step)) >= PEN_FLATNESS


def light_texture(total: np.ndarray, sigma: float) -> np.ndarray:
    """How much the light absorbed (summed OD) varies across a Gaussian window of `sigma` pixels, as a share
    of its mean: a film of one dye (a pen stroke) varies little; tissue, nuclei beside stroma, much."""
    mean = ndimage.gaussian_filter(total, sigma, mode="nearest")
    square = ndimage.gaussian_filter(total * total, sigma, mode="nearest")
    return np.sqrt(np.maximum(square - mean * mean, 0)) / np.maximum(mean, 1e-3)


def _block_mean(rgb: np.ndarray, factor: int) -> np.ndarray:
    """uint8 image reduced by `factor` (means of whole blocks; a partial last row or column is dropped)."""
    h, w = rgb.shape[0] // factor * factor, rgb.shape[1] // factor * factor
    blocks = rgb[:h, :w].reshape(h // factor, factor, w // factor, factor, 3).mean(axis=(1, 3))
    return np.rint(blocks).astype(np.uint8)


def ink_mask(od: np.ndarray, settings: TissueSettings, sigma: float = 1.0) -> np.ndarray:
    """Pixels of pen ink, marker, dust or bubble rims in an image of OD above the glass's (H, W, 3);
    `sigma`: the texture window in pixels. Texture is measured only around pixels that could be ink."""
    total = summed(od)
    coloured = total >= INK_MIN_OD
    brown = _brown(od)
    neutral = coloured & ~brown & (od[..., 2] >= 0.9 * od[..., 1]) & (od[..., 0] >= 0.8 * od[..., 1])
    off_colour = coloured & ~brown & (od[..., 2] >= settings.ink_blue_green * od[..., 1])
    bluish = (total >= SMOOTH_MIN_OD) & (od[..., 1] < od[..., 0])
    candidate = off_colour | bluish | (total >= DARK_OD)
    # two strokes crossing: no stain is that dark and that far off colour, textured or not
    ink = neutral | (off_colour & (total >= DARK_OD))
    ink |= dye_films(od, candidate, settings, sigma)
    # growing the ink and filling its pockets, cheap boolean work, look further than its texture
    inky = candidate | neutral
    margin = math.ceil((POCKET_PX + 4 * VOTE_SIGMA) * sigma) + GROW_PX
    for part in _around(candidate, margin):
        if ink[part].any():  # with no ink there is nothing to grow and no pocket
            ink[part] |= _grown(ink[part], inky[part], sigma)
    return ink


def _gaussian_radius(sigma: float) -> int:
    """How far `ndimage.gaussian_filter` (truncated at 4 sigma) reaches, in pixels."""
    return int(4.0 * sigma + 0.5)


def _brown(od: np.ndarray) -> np.ndarray:
    """Brown pixels: DAB, IHC's stain, alone or over hematoxylin; a stain, since no pen's ink is brown."""
    low, high = BROWN_RED_GREEN
    red, green, blue = od[..., 0], od[..., 1], od[..., 2]
    return (blue >= BROWN_BLUE_GREEN * green) & (red >= low * green) & (red <= high * green)


def dye_films(od: np.ndarray, candidate: np.ndarray, settings: TissueSettings, sigma: float) -> np.ndarray:
    """Candidate pixels in smooth films of dye: `_films` of the whole image, measured only as far from a
    candidate as texture and votes reach (stray candidate pixels are common in tissue, and measuring
    around each would measure most of it)."""
    out = np.zeros(candidate.shape, bool)
    reach = _gaussian_radius(sigma) + _gaussian_radius(VOTE_SIGMA * sigma) + 1
    for part, own in _groups(candidate, reach):
        # every candidate a group's votes count lies in the group, and their texture windows in `part`
        out[part] |= _films(od[part], own, settings, sigma)
    return out


def _films(od: np.ndarray, candidate: np.ndarray, settings: TissueSettings, sigma: float) -> np.ndarray:
    """Candidate pixels in smooth films of dye, measured over the whole of `od`."""
    smooth = (candidate & (colour_texture(od, sigma) < settings.ink_texture)).astype(np.float32)
    # a film is smooth nearly everywhere; tissue has smooth spots (a nucleus's inside) among texture
    window = VOTE_SIGMA * sigma
    vote = ndimage.gaussian_filter(smooth, window, mode="nearest")
    return candidate & (
        vote >= 0.5 * ndimage.gaussian_filter(candidate.astype(np.float32), window, mode="nearest")
    )


def _grown(ink: np.ndarray, inky: np.ndarray, sigma: float) -> np.ndarray:
    """`ink` taking in the off-colour and bluish pixels (`inky`) next to it and those it encloses: where
    strokes cross, or a stroke runs along the tissue, the mix is textured."""
    ink = ink | (ndimage.binary_dilation(ink, iterations=GROW_PX) & inky)
    ink |= enclosed(~ink, math.pi * (POCKET_PX * sigma) ** 2) & inky
    return ink


def _around(mask: np.ndarray, margin: int) -> list[tuple[slice, slice]]:
    """Rectangles covering the groups of `mask`'s pixels, each with at least `margin` pixels around
    (found on blocks of `margin` pixels: cheap on a mostly empty slide)."""
    labels, b = _block_groups(mask, margin)
    h, w = mask.shape
    return [
        (slice(r.start * b, min(h, r.stop * b)), slice(c.start * b, min(w, c.stop * b)))
        for r, c in ndimage.find_objects(labels)
    ]


def _groups(mask: np.ndarray, margin: int) -> Iterator[tuple[tuple[slice, slice], np.ndarray]]:
    """(rectangle, the group's pixels in it) for each group of `mask`'s pixels: pixels less than `margin`
    apart share a group, and its rectangle reaches `margin` pixels beyond it (where the image does)."""
    labels, b = _block_groups(mask, margin)
    h, w = mask.shape
    pixels = np.repeat(np.repeat(labels, b, axis=0), b, axis=1)[:h, :w] * mask
    for group, box in enumerate(ndimage.find_objects(pixels), start=1):
        if box is None:
            continue
        r, c = box
        part = (
            slice(max(0, r.start - margin), min(h, r.stop + margin)),
            slice(max(0, c.start - margin), min(w, c.stop + margin)),
        )
        yield part, pixels[part] == group


def _block_groups(mask: np.ndarray, margin: int) -> tuple[np.ndarray, int]:
    """Labels of the groups of blocks (side b, at least `margin`) holding `mask`'s pixels, each group
    grown by a block; and b."""
    b = max(8, margin)
    h, w = mask.shape
    padded = np.zeros((-(-h // b) * b, -(-w // b) * b), bool)
    padded[:h, :w] = mask
    blocks = padded.reshape(padded.shape[0] // b, b, padded.shape[1] // b, b).any(axis=(1, 3))
    labels, _count = ndimage.label(ndimage.binary_dilation(blocks, iterations=1))
    return labels, b


def enclosed(background: np.ndarray, max_area: float) -> np.ndarray:
    """Pixels of `background` components of at most `max_area` pixels that do not touch the image's
    edge (what lies beyond it is unknown): the holes of the foreground."""
    labels, count = ndimage.label(background)
    if count == 0:
        return np.zeros(background.shape, bool)
    sizes = np.bincount(labels.ravel(), minlength=count + 1)
    small = sizes <= max_area
    edge = np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
    small[edge] = False
    small[0] = False
    return small[labels]


def colour_texture(od: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    """How much a pixel's neighbourhood (Gaussian window of `sigma` pixels) varies in colour, as the
    spread of OD across the neighbourhood's mean colour, over that colour's strength.

    A film of dye varies in amount only (streaks, soft edges on glass: the same colour scaled), so it
    scores ~0; tissue is nuclei beside cytoplasm and stroma, each its own mix of the two dyes.
    """

    def smooth(x: np.ndarray) -> np.ndarray:
        return ndimage.gaussian_filter(x, sigma, mode="nearest")

    mean = [smooth(od[..., c]) for c in range(3)]
    strength = np.sqrt(mean[0] * mean[0] + mean[1] * mean[1] + mean[2] * mean[2])
    unit = [m / np.maximum(strength, 1e-6) for m in mean]
    spread = np.zeros_like(strength)
    along = np.zeros_like(strength)
    for i in range(3):
        for j in range(i, 3):
            moment = smooth(od[..., i] * od[..., j])
            if i == j:
                spread += moment
            along += (1 if i == j else 2) * unit[i] * unit[j] * moment
    return np.sqrt(np.maximum(spread - along, 0)) / np.maximum(strength, 1e-3)


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
    rgb = image[..., :3]
    top = rgb.max(axis=-1).astype(np.float32)
    spread = top - rgb.min(axis=-1)
    return np.divide(spread, top, out=np.zeros_like(top), where=top > 0)


def _mask_level(slide: Slide, max_size: int) -> int | None:
    """The most detailed level whose longer side fits `max_size`; None when every level is larger."""
    for level, (w, h) in enumerate(slide.level_dimensions):
        if max(w, h) <= max_size:
            return level
    return None
