"""Pen ink, marker, dust and bubble rims on a slide, told from stained tissue in optical density.

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
The film rule, pens of any colour on open glass, is `bigslide.tiling.films`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from scipy import ndimage

from bigslide.tiling.pixel_classes import (
    INK_MIN_OD,
    TissueSettings,
    enclosed,
    gaussian_planes,
    summed,
)

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


VOTE_SIGMA = 2.0


GROW_PX = 2


POCKET_PX = 16
"""Off-colour pockets enclosed by ink up to this radius (times the texture window) are ink too."""


def grown_box(box: tuple[slice, slice], by: int, shape: tuple[int, int]) -> tuple[slice, slice]:
    """`box` grown by `by` pixels on every side, within an image of `shape`."""
    rows, cols = box
    return (
        slice(max(0, rows.start - by), min(shape[0], rows.stop + by)),
        slice(max(0, cols.start - by), min(shape[1], cols.stop + by)),
    )


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
    smooth = candidate & (colour_texture(od, sigma) < settings.ink_texture)
    # a film is smooth nearly everywhere; tissue has smooth spots (a nucleus's inside) among texture
    vote, candidates = gaussian_planes(np.stack([smooth, candidate]).astype(np.float32), VOTE_SIGMA * sigma)
    return candidate & (vote >= 0.5 * candidates)


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
        part = grown_box(box, margin, (h, w))
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


def colour_texture(od: np.ndarray, sigma: float = 1.0) -> np.ndarray:
    """How much a pixel's neighbourhood (Gaussian window of `sigma` pixels) varies in colour, as the
    spread of OD across the neighbourhood's mean colour, over that colour's strength.

    A film of dye varies in amount only (streaks, soft edges on glass: the same colour scaled), so it
    scores ~0; tissue is nuclei beside cytoplasm and stroma, each its own mix of the two dyes.
    """
    h, w = od.shape[:2]
    planes = np.empty((9, h, w), od.dtype)  # the three channels, then their six products
    pairs = [(i, j) for i in range(3) for j in range(i, 3)]
    for c in range(3):
        planes[c] = od[..., c]
    for k, (i, j) in enumerate(pairs, start=3):
        np.multiply(od[..., i], od[..., j], out=planes[k])
    smoothed = gaussian_planes(planes, sigma)
    mean = smoothed[:3]
    strength = np.sqrt(mean[0] * mean[0] + mean[1] * mean[1] + mean[2] * mean[2])
    unit = [m / np.maximum(strength, 1e-6) for m in mean]
    spread = np.zeros_like(strength)
    along = np.zeros_like(strength)
    for k, (i, j) in enumerate(pairs, start=3):
        moment = smoothed[k]
        if i == j:
            spread += moment
        along += (1 if i == j else 2) * unit[i] * unit[j] * moment
    return np.sqrt(np.maximum(spread - along, 0)) / np.maximum(strength, 1e-3)
