"""What people and scanners add to the glass, drawn onto a synthetic slide: pen and marker strokes
(circles around the tissue, arrows, lines across it, labels on the glass) in blue, green, black and red,
dust specks and fibres, air-bubble rims, out-of-focus patches; and tissue that is hard to keep: pale
(weakly stained) patches and fat (empty adipocytes with thin septa).

Everything acts in optical density (OD) as light does: ink and dust absorb on top of the tissue (so light
ink over tissue still shows the tissue through it), pale tissue absorbs less, blur spreads the light.
Each kind of mark comes with its exact mask, so tests and the tissue bench know which tile is what.
Sizes are in µm and drawn at the slide's `mpp`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from skimage import draw
from skimage.segmentation import find_boundaries

from bigslide.errors import DataError
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


@dataclass(frozen=True)
class MarkedSlide:
    """Level-0 RGB and a mask per kind of pixel: `tissue` (fat included), `ink` (`light_ink`: the part
    drawn light, across the tissue), `dust` (specks, fibres and bubble rims), `blur` (out-of-focus
    tissue), `pale` and `fat` (the hard-to-keep tissue), `lesion`."""

    rgb: np.ndarray
    tissue: np.ndarray
    ink: np.ndarray
    light_ink: np.ndarray
    dust: np.ndarray
    blur: np.ndarray
    pale: np.ndarray
    fat: np.ndarray
    lesion: np.ndarray
    inks: tuple[str, ...]  # the ink colours used
    light_colour: str  # the ink drawn light


def _od(rgb: np.ndarray) -> np.ndarray:
    return -np.log((rgb.astype(np.float32) + 0.5) / 255.5)


def _rgb(od: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(np.exp(-od) * 255.5 - 0.5), 0, 255).astype(np.uint8)


def _ink_od(name: str) -> np.ndarray:
    return _od(np.array(INKS[name], np.float32)) - _od(np.array([245.0, 245.0, 245.0]))


def synthesize_marked_slide(
    size: tuple[int, int],
    *,
    seed: int,
    mpp: float = 2.0,
    lab: str = "A",
    lesions: int = 0,
    inks: tuple[str, ...] | None = None,
) -> MarkedSlide:
    """An H&E-like slide (`bigslide.synthetic.slides.synthesize_slide`) with pen strokes of 2-3 inks
    (`inks`, else drawn from `INKS`), dust, 1-2 bubble rims, a blurred patch, a pale patch and a patch
    of fat. One seed gives one slide; the tissue is the one `synthesize_slide(size, seed=seed)` draws."""
    unknown = sorted(set(inks or ()) - set(INKS))
    if unknown:
        raise DataError(f"inks={unknown}: must be among {', '.join(INKS)}")
    base = synthesize_slide(size, lesions=lesions, seed=seed, lab=lab)
    rng = np.random.default_rng([seed, 4049])
    height, width = base.tissue.shape
    chosen = inks or tuple(rng.choice(list(INKS), size=int(rng.integers(2, 4)), replace=False))
    od = _od(base.rgb)
    glass = np.median(od[~base.tissue], axis=0) if (~base.tissue).any() else np.zeros(3, np.float32)
    tissue = base.tissue.copy()
    inside = ndimage.binary_erosion(tissue, iterations=max(1, int(40 / mpp)))
    candidates = np.argwhere(inside if inside.any() else tissue)

    def spot(radius: float) -> np.ndarray:
        y, x = candidates[rng.integers(len(candidates))]
        yy, xx = np.ogrid[:height, :width]
        return ((yy - y) ** 2 + (xx - x) ** 2) <= radius**2

    um = 1 / mpp  # pixels per µm
    fat = spot(rng.uniform(120, 200) * um) & tissue
    od = np.where(fat[..., None], _fat(od, glass, fat, rng, um), od)
    pale = spot(rng.uniform(120, 200) * um) & tissue & ~fat
    od = np.where(pale[..., None], glass + (od - glass) * rng.uniform(0.3, 0.45), od)
    blur = spot(rng.uniform(120, 200) * um) & tissue & ~fat & ~pale
    sigma = rng.uniform(6, 12) * um  # a few cells wide: nuclei and fibres are gone
    soft = ndimage.gaussian_filter(blur.astype(np.float32), 3)[..., None]
    blurred = np.stack([ndimage.gaussian_filter(od[..., c], sigma) for c in range(3)], axis=-1)
    od = od * (1 - soft) + blurred * soft
    blur = soft[..., 0] >= 0.9  # blurred through and through (the patch's rim is part sharp)

    ink = np.zeros((height, width), bool)
    light_ink = np.zeros((height, width), bool)
    light_colour = ""
    heavy = np.zeros((height, width), bool)
    for k, (paths, light) in enumerate(_pen_paths(tissue, rng)):
        name = str(chosen[k % len(chosen)])
        depth = _depth(paths, rng.uniform(*PEN_WIDTH_UM) * um, (height, width))
        stroke = np.clip(depth / (3 * um) + 0.5, 0, 1)  # edges soft over ~3 µm
        strength = rng.uniform(0.3, 0.45) if light else rng.uniform(0.75, 1.0)
        od += (stroke * strength * _streaks(depth, rng, um))[..., None] * _ink_od(name)
        ink |= stroke > 0.5
        (light_ink if light else heavy)[...] |= stroke > 0.5
        light_colour = name if light else light_colour
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
        tuple(str(c) for c in chosen),
        light_colour,
    )


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
