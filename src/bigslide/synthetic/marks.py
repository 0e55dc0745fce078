"""What people and scanners add to the glass, drawn onto a synthetic slide: pen and marker strokes
(circles around the tissue, arrows, lines across it, labels on the glass) in blue, green, black and red,
or in pens of any colour and density (`Pen`, `random_pen`: blues from navy to cornflower, violet, green,
black, red), dust specks and fibres, air-bubble rims, out-of-focus patches; and tissue that is hard to
keep: pale (weakly stained) patches, fat (empty adipocytes with thin septa) and, when asked, lymphocyte
aggregates (crowded small nuclei, haematoxylin at its darkest, little eosin).

Everything acts in optical density (OD) as light does: ink and dust absorb on top of the tissue (so light
ink over tissue still shows the tissue through it), pale tissue absorbs less, blur spreads the light.
Each kind of mark comes with its exact mask, so tests and the tissue bench know which tile is what.
Sizes are in µm and drawn at the slide's `mpp`.
"""

from __future__ import annotations

import colorsys
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from skimage import draw
from skimage.segmentation import find_boundaries

from bigslide.errors import DataError
from bigslide.synthetic import he
from bigslide.synthetic.slides import synthesize_slide

# Transmitted colour of a full-strength stroke on white glass (RGB), per ink: pens and markers as
# pathologists use them.
INKS: dict[str, tuple[int, int, int]] = {
    "blue": (40, 62, 150),
    "green": (40, 120, 75),
    "black": (38, 38, 45),
    "red": (185, 40, 50),
}
PEN_WIDTH_UM = (80.0, 180.0)
DENSE_STROKE = (0.75, 1.0)
LIGHT_STROKE = (0.3, 0.45)
"""Strength of a stroke (a share of its pen's full-strength OD): drawn firmly, and drawn light."""

FAMILIES: dict[str, tuple[tuple[float, float], tuple[float, float], tuple[float, float]]] = {
    "blue": ((200, 240), (0.3, 0.85), (0.35, 0.85)),
    "violet": ((250, 290), (0.3, 0.75), (0.35, 0.75)),
    "green": ((90, 170), (0.3, 0.8), (0.3, 0.7)),
    "black": ((0, 360), (0.0, 0.15), (0.1, 0.35)),
    "red": ((-15, 15), (0.5, 0.85), (0.55, 0.9)),
}
"""Ink families as scanned: ranges of hue (degrees), saturation and value of a full-strength stroke on
white glass. Blue runs from navy to cornflower, greyish blues (80, 100, 170) included."""


@dataclass(frozen=True)
class Pen:
    """A pen as the scanner sees it: `rgb`, the transmitted colour of a full-strength stroke on white
    glass; `density`, how firmly it is drawn (the range of stroke strengths, as shares of that colour's
    OD); `width_um`, the range of stroke widths; `family`, the colour family it belongs to."""

    family: str
    rgb: tuple[int, int, int]
    density: tuple[float, float] = DENSE_STROKE
    width_um: tuple[float, float] = PEN_WIDTH_UM


def named_pen(name: str) -> Pen:
    """The pen of `INKS[name]` (the benchmark's first shades)."""
    return Pen(name, INKS[name])


def random_pen(family: str, rng: np.random.Generator) -> Pen:
    """A pen of `family` (`FAMILIES`) with its hue, saturation, value, density (0.35-1 of its colour's
    OD: light strokes to dense ones) and width (80-180 µm) drawn at random."""
    if family not in FAMILIES:
        raise DataError(f"family={family!r}: must be one of {', '.join(FAMILIES)}")
    hue, saturation, value = (rng.uniform(*bounds) for bounds in FAMILIES[family])
    rgb = colorsys.hsv_to_rgb((hue % 360) / 360, saturation, value)
    density = rng.uniform(0.35, 1.0)
    width = rng.uniform(*PEN_WIDTH_UM)
    return Pen(
        family,
        (round(255 * rgb[0]), round(255 * rgb[1]), round(255 * rgb[2])),
        (0.9 * density, density),
        (width, width),
    )


@dataclass(frozen=True)
class MarkedSlide:
    """Level-0 RGB and a mask per kind of pixel: `tissue` (fat and aggregates included), `ink`
    (`light_ink`: the part drawn light, across the tissue), `dust` (specks, fibres and bubble rims),
    `blur` (out-of-focus tissue), `pale`, `fat` and `aggregate` (the hard-to-keep tissue), `lesion`;
    `pen`: per pixel, the index into `pens` of the pen drawn last there (-1: no ink)."""

    rgb: np.ndarray
    tissue: np.ndarray
    ink: np.ndarray
    light_ink: np.ndarray
    dust: np.ndarray
    blur: np.ndarray
    pale: np.ndarray
    fat: np.ndarray
    lesion: np.ndarray
    inks: tuple[str, ...]  # the ink colours (pen families) used
    light_colour: str  # the ink drawn light
    pens: tuple[Pen, ...] = ()
    pen: np.ndarray | None = None
    aggregate: np.ndarray | None = None


def _od(rgb: np.ndarray) -> np.ndarray:
    return -np.log((rgb.astype(np.float32) + 0.5) / 255.5)


def _rgb(od: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(np.exp(-od) * 255.5 - 0.5), 0, 255).astype(np.uint8)


def _ink_od(pen: Pen) -> np.ndarray:
    return _od(np.array(pen.rgb, np.float32)) - _od(np.array([245.0, 245.0, 245.0]))


def synthesize_marked_slide(
    size: tuple[int, int],
    *,
    seed: int,
    mpp: float = 2.0,
    lab: str = "A",
    lesions: int = 0,
    inks: Sequence[str | Pen] | None = None,
    aggregates: int = 0,
) -> MarkedSlide:
    """An H&E-like slide (`bigslide.synthetic.slides.synthesize_slide`) with pen strokes of 2-3 inks
    (`inks`: names in `INKS` or `Pen`s, else drawn from `INKS`), dust, 1-2 bubble rims, a blurred patch,
    a pale patch, a patch of fat and `aggregates` lymphocyte aggregates. One seed gives one slide; the
    tissue is the one `synthesize_slide(size, seed=seed)` draws, and aggregates change nothing else."""
    unknown = sorted({i for i in inks or () if isinstance(i, str)} - set(INKS))
    if unknown:
        raise DataError(f"inks={unknown}: must be among {', '.join(INKS)}")
    base = synthesize_slide(size, lesions=lesions, seed=seed, lab=lab)
    rng = np.random.default_rng([seed, 4049])
    height, width = base.tissue.shape
    chosen = inks or tuple(rng.choice(list(INKS), size=int(rng.integers(2, 4)), replace=False))
    pens = tuple(named_pen(str(i)) if isinstance(i, str) else i for i in chosen)
    od = _od(base.rgb)
    glass = np.median(od[~base.tissue], axis=0) if (~base.tissue).any() else np.zeros(3, np.float32)
    tissue = base.tissue.copy()
    inside = ndimage.binary_erosion(tissue, iterations=max(1, int(40 / mpp)))
    candidates = np.argwhere(inside if inside.any() else tissue)

    def spot(radius: float, rng: np.random.Generator = rng) -> np.ndarray:
        y, x = candidates[rng.integers(len(candidates))]
        yy, xx = np.ogrid[:height, :width]
        return ((yy - y) ** 2 + (xx - x) ** 2) <= radius**2

    um = 1 / mpp  # pixels per µm
    fat = spot(rng.uniform(120, 200) * um) & tissue
    od = np.where(fat[..., None], _fat(od, glass, fat, rng, um), od)
    pale = spot(rng.uniform(120, 200) * um) & tissue & ~fat
    od = np.where(pale[..., None], glass + (od - glass) * rng.uniform(0.3, 0.45), od)
    blur = spot(rng.uniform(120, 200) * um) & tissue & ~fat & ~pale
    aggregate = np.zeros((height, width), bool)
    if aggregates:
        own = np.random.default_rng([seed, 4050])  # the other parts keep their draws
        for _ in range(aggregates):
            aggregate |= spot(own.uniform(80, 160) * um, own) & tissue & ~fat & ~pale & ~blur
        od = _aggregates(od, glass, aggregate, he.slide_stain(_stain_stream(seed), lab), own)
    sigma = rng.uniform(6, 12) * um  # a few cells wide: nuclei and fibres are gone
    soft = ndimage.gaussian_filter(blur.astype(np.float32), 3)[..., None]
    blurred = np.stack([ndimage.gaussian_filter(od[..., c], sigma) for c in range(3)], axis=-1)
    od = od * (1 - soft) + blurred * soft
    blur = soft[..., 0] >= 0.9  # blurred through and through (the patch's rim is part sharp)

    ink = np.zeros((height, width), bool)
    light_ink = np.zeros((height, width), bool)
    pen_index = np.full((height, width), -1, np.int8)
    light_colour = ""
    heavy = np.zeros((height, width), bool)
    for k, (paths, light) in enumerate(_pen_paths(tissue, rng)):
        pen = pens[k % len(pens)]
        depth = _depth(paths, rng.uniform(*pen.width_um) * um, (height, width))
        stroke = np.clip(depth / (3 * um) + 0.5, 0, 1)  # edges soft over ~3 µm
        strength = rng.uniform(*LIGHT_STROKE) if light else rng.uniform(*pen.density)
        od += (stroke * strength * _streaks(depth, rng, um))[..., None] * _ink_od(pen)
        ink |= stroke > 0.5
        pen_index[stroke > 0.5] = k % len(pens)
        (light_ink if light else heavy)[...] |= stroke > 0.5
        light_colour = pen.family if light else light_colour
    dust = _dust(od, rng, um)
    light_ink &= ~heavy
    return MarkedSlide(
        _rgb(od),
        tissue,
        ink,
        light_ink,
        dust,
        blur,
        pale,
        fat,
        base.lesion_mask,
        tuple(p.family for p in pens),
        light_colour,
        pens,
        pen_index,
        aggregate,
    )


def _stain_stream(seed: int) -> np.random.Generator:
    """The random stream `synthesize_slide` draws the slide's stain from."""
    return np.random.default_rng(np.random.SeedSequence(seed).spawn(6)[1])


def _aggregates(
    od: np.ndarray, glass: np.ndarray, region: np.ndarray, stain: he.Stain, rng: np.random.Generator
) -> np.ndarray:
    """Lymphocyte aggregates over `region`: small nuclei crowded edge to edge, haematoxylin darker than
    anywhere else on the slide, little eosin between them (a third of the tissue's own)."""
    ys, xs = np.nonzero(region)
    bank = he.nucleus_bank("normal")
    n = int(region.sum() / 45)
    pick = rng.integers(len(ys), size=n)
    nuclei = np.zeros(region.shape, np.float32)
    he.stamp_nuclei(
        nuclei, xs[pick] + rng.uniform(-0.5, 0.5, n), ys[pick], rng.integers(he.BANK_SIZE, size=n), bank
    )
    nuclei = ndimage.gaussian_filter(nuclei, he.OPTICS_BLUR) * stain.h_strength * rng.uniform(1.2, 1.6)
    dense = glass + (od - glass) * 0.35 + nuclei[..., None] * stain.vectors[0]
    soft = ndimage.gaussian_filter(region.astype(np.float32), 1.5)[..., None]
    return od * (1 - soft) + dense * soft


def _fat(od: np.ndarray, glass: np.ndarray, region: np.ndarray, rng: np.random.Generator, um: float):
    """Adipocytes of 40-90 µm: empty cells (glass) between thin septa that keep the tissue's stain."""
    ys, xs = np.nonzero(region)
    n = max(4, int(region.sum() / (np.pi * (30 * um) ** 2)))
    seeds = np.zeros(region.shape, np.int32)
    pick = rng.integers(len(ys), size=n)
    seeds[ys[pick], xs[pick]] = np.arange(1, n + 1)
    _, (iy, ix) = ndimage.distance_transform_edt(seeds == 0, return_indices=True)
    cells = seeds[iy, ix]
    septa = ndimage.binary_dilation(find_boundaries(cells), iterations=max(1, round(2 * um)))
    return np.where(septa[..., None], glass + (od - glass) * 1.3, glass)


def _pen_paths(tissue: np.ndarray, rng: np.random.Generator) -> list[tuple[list[np.ndarray], bool]]:
    """Strokes as (polylines (K, 2) of x, y; drawn light): a circle around the tissue (crossing it in
    places), an arrow pointing at it, a line across it in light ink and a mark on the glass."""
    height, width = tissue.shape
    side = min(height, width)
    ys, xs = np.nonzero(tissue)
    cx, cy = xs.mean(), ys.mean()
    rx, ry = (xs.max() - xs.min()) / 2, (ys.max() - ys.min()) / 2
    t = np.linspace(0, 2 * np.pi * rng.uniform(0.75, 0.95), 120) + rng.uniform(0, 2 * np.pi)
    wobble = 1 + 0.06 * np.sin(3 * t + rng.uniform(0, 6))
    scale = rng.uniform(0.95, 1.15)
    circle = np.stack([cx + rx * scale * wobble * np.cos(t), cy + ry * scale * wobble * np.sin(t)], 1)
    angle = rng.uniform(0, 2 * np.pi)
    tip = np.array([cx + 1.1 * rx * np.cos(angle), cy + 1.1 * ry * np.sin(angle)])
    tail = tip + 0.35 * side * np.array([np.cos(angle), np.sin(angle)])
    barbs = [tip + 0.06 * side * np.array([np.cos(angle + s), np.sin(angle + s)]) for s in (-0.6, 0.6)]
    direction = rng.uniform(0, np.pi)
    reach = 0.8 * max(rx, ry) * np.array([np.cos(direction), np.sin(direction)])
    centre = np.array([cx, cy])
    across = np.array([centre - reach, centre + reach])
    corner = np.array([rng.uniform(0.05, 0.2) * width, rng.uniform(0.85, 0.92) * height])
    label = corner + np.array([[0, 0], [0.06 * width, -0.05 * height], [0.12 * width, 0.0]])
    return [
        ([circle], False),
        ([np.array([tail, tip]), np.array([barbs[0], tip, barbs[1]])], False),
        ([across], True),
        ([label], False),
    ]


def _depth(paths: list[np.ndarray], width_px: float, shape: tuple[int, int]) -> np.ndarray:
    """Signed distance (pixels, > 0 inside) to the edge of a stroke of `width_px` along `paths`."""
    centre = np.zeros(shape, bool)
    segments = [(a, b) for path in paths for a, b in itertools.pairwise(path)]
    for (x0, y0), (x1, y1) in segments:
        rr, cc = draw.line(round(y0), round(x0), round(y1), round(x1))
        keep = (rr >= 0) & (rr < shape[0]) & (cc >= 0) & (cc < shape[1])
        centre[rr[keep], cc[keep]] = True
    if not centre.any():
        return np.full(shape, -np.inf, np.float32)
    return (width_px / 2 - ndimage.distance_transform_edt(~centre)).astype(np.float32)


def _streaks(depth: np.ndarray, rng: np.random.Generator, um: float) -> np.ndarray:
    """Ink density across a stroke: streaks of ±8 % over ~10 µm and ink pooled at the rims (+15 %)."""
    noise = ndimage.gaussian_filter(rng.normal(size=depth.shape), 5 * um)
    noise /= noise.std() + 1e-9
    rim = np.exp(-np.clip(depth, 0, None) / (8 * um))
    return (1 + 0.08 * noise + 0.15 * rim).astype(np.float32)


def _dust(od: np.ndarray, rng: np.random.Generator, um: float) -> np.ndarray:
    """Dark grey-brown specks (4-20 µm), a few fibres and 1-2 air-bubble rims, drawn into `od`."""
    height, width = od.shape[:2]
    mask = np.zeros((height, width), bool)
    grey = np.array([1.0, 1.05, 1.15], np.float32)  # a little brown
    for _ in range(int(rng.integers(30, 60))):
        rr, cc = draw.disk(
            (rng.uniform(0, height), rng.uniform(0, width)), rng.uniform(2, 10) * um, shape=(height, width)
        )
        od[rr, cc] += grey * rng.uniform(0.8, 2.0)
        mask[rr, cc] = True
    for _ in range(int(rng.integers(2, 5))):
        y, x = rng.uniform(0, height), rng.uniform(0, width)
        a, length = rng.uniform(0, np.pi), rng.uniform(60, 200) * um
        rr, cc = draw.line(int(y), int(x), int(y + length * np.sin(a)), int(x + length * np.cos(a)))
        keep = (rr >= 0) & (rr < height) & (cc >= 0) & (cc < width)
        line = np.zeros((height, width), bool)
        line[rr[keep], cc[keep]] = True
        line = ndimage.binary_dilation(line, iterations=max(1, int(2 * um)))
        od[line] += grey * 1.2
        mask |= line
    for _ in range(int(rng.integers(1, 3))):
        radius = rng.uniform(120, 300) * um
        y, x = rng.uniform(radius, height - radius), rng.uniform(radius, width - radius)
        yy, xx = np.ogrid[:height, :width]
        distance = np.sqrt((yy - y) ** 2 + (xx - x) ** 2)
        rim = np.abs(distance - radius) <= max(1.0, 3 * um)
        od[rim] += grey * 0.7
        mask |= rim
    return mask
