"""H&E-like tissue rendered in optical-density (HED) space: stroma, structures, nuclei, stain, blur.

Everything is drawn as hematoxylin and eosin optical densities (OD) and turned into RGB at the end with
scikit-image's HED stain vectors (`skimage.color.rgb_from_hed`), perturbed per slide, so stain variation
acts on both dyes the way it does between labs. Nuclei are stamped from small banks of templates (a few
hundred shapes per kind, cached), which keeps a 2048² slide at well under a second.

Nucleus kinds: "normal" (small, fine chromatin), "tumour" (enlarged, hyperchromatic, pleomorphic, coarse
chromatin) and "subtle" (the normal shapes enlarged by SUBTLE_ENLARGEMENT, with vesicular chromatin: dark rim,
clumps and a nucleolus, scaled so every nucleus absorbs as much light as its normal twin: the same
number of nuclei in the same places and the same mean colour, only larger, paler nuclei with another
texture).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy import ndimage
from skimage import draw

from bigslide.synthetic.labs import lab_named

NucleusKind = Literal["normal", "tumour", "subtle"]
BANK_SIZE = 256
SUBTLE_ENLARGEMENT = 1.35  # nuclear radius of the subtle kind over its normal twin's
OPTICS_BLUR = 0.8  # sigma (pixels at 0.5 µm/px) of the slightly soft focus every slide gets
GLASS_OD = 0.035  # background glass transmits ~92 %: RGB ≈ 235-245 after the stain mix


@dataclass(frozen=True)
class Stain:
    """Per-slide stain: OD vectors of hematoxylin, eosin and residual (rows), dye strengths, and an OD
    added to every pixel per RGB channel (a lab's colour cast: mounting medium, lamp, scanner)."""

    vectors: np.ndarray  # (3, 3) float32, unit rows
    h_strength: float
    e_strength: float
    cast: tuple[float, float, float] = (0.0, 0.0, 0.0)


def slide_stain(rng: np.random.Generator, lab: str = "A") -> Stain:
    """The lab's stain vectors tilted a little and dye strengths scaled, as between batches of a lab.
    The random draws do not depend on the lab, so one seed renders the same slide in every lab."""
    base = lab_named(lab)
    vectors = np.asarray(base.vectors, np.float64)
    vectors = vectors + rng.normal(0, 0.04, size=(3, 3))
    vectors = np.abs(vectors) / np.linalg.norm(vectors, axis=1, keepdims=True)
    h, e = float(rng.uniform(0.8, 1.2)), float(rng.uniform(0.8, 1.2))
    return Stain(vectors.astype(np.float32), h * base.h_strength, e * base.e_strength, base.cast)


def od_to_rgb(h: np.ndarray, e: np.ndarray, stain: Stain, extra: np.ndarray | None = None) -> np.ndarray:
    """(H, W) hematoxylin and eosin OD -> uint8 RGB through the slide's stain vectors (Beer-Lambert)."""
    height, width = h.shape
    od = np.empty((height, width, 3), np.float32)
    for c in range(3):
        od[..., c] = h * stain.vectors[0, c] + e * stain.vectors[1, c] + (GLASS_OD + stain.cast[c])
        if extra is not None:
            od[..., c] += extra
    np.negative(od, out=od)
    np.exp(od, out=od)
    od *= 255
    np.clip(od, 0, 255, out=od)
    return np.rint(od, out=od).astype(np.uint8)


@dataclass(frozen=True)
class NucleusBank:
    """`templates` (N, S, S) float32 hematoxylin OD, centred; `radius` (N,) mean radius in pixels."""

    templates: np.ndarray
    radius: np.ndarray

    @property
    def half(self) -> int:
        return self.templates.shape[1] // 2


@lru_cache(maxsize=4)
def nucleus_bank(kind: NucleusKind) -> NucleusBank:
    """A fixed bank of nuclei of one kind (the same for every slide; slides differ in placement)."""
    tumour = kind == "tumour"
    rng = np.random.default_rng(1234 if tumour else 4321)  # normal and subtle share these draws
    extra = np.random.default_rng(8765)  # the subtle kind's own draws, so the twins stay twins
    rmax = 11 if tumour else 7
    size = 2 * rmax + 3
    # Subtle nuclei are their normal twins enlarged: a canvas wide enough for the largest, the same
    # random draws (drawn at the normal canvas size, padded) and the twin's outline scaled.
    out_rmax = int(np.ceil(rmax * SUBTLE_ENLARGEMENT)) if kind == "subtle" else rmax
    out_size = 2 * out_rmax + 3
    pad = (out_size - size) // 2
    grid = _polar_grid(size)
    out_grid = _polar_grid(out_size)
    templates = np.zeros((BANK_SIZE, out_size, out_size), np.float32)
    radii = np.zeros(BANK_SIZE, np.float32)
    for i in range(BANK_SIZE):
        if tumour:
            r0, aspect, wobble, peak = (
                rng.uniform(5.5, 9.0),
                rng.uniform(1.0, 1.7),
                0.16,
                rng.uniform(1.3, 1.8),
            )
        else:
            r0, aspect, wobble, peak = (
                rng.uniform(3.2, 5.0),
                rng.uniform(1.0, 2.2),
                0.05,
                rng.uniform(0.9, 1.2),
            )
        angle = rng.uniform(0, np.pi)
        ripple = [(rng.uniform(0, wobble), k, rng.uniform(0, 2 * np.pi)) for k in (2, 3, 5)]
        inside, _ = _outline(grid, r0, aspect, angle, ripple, rmax)
        chromatin = ndimage.gaussian_filter(rng.normal(size=(size, size)), 0.7 if not tumour else 1.2)
        chromatin /= chromatin.std() + 1e-6
        fine = np.clip(1 + (0.35 if tumour else 0.15) * chromatin, 0.3, None)
        nucleus = inside * fine
        if kind == "subtle":
            big, rad = _outline(out_grid, r0 * SUBTLE_ENLARGEMENT, aspect, angle, ripple, out_rmax)
            texture = _vesicular(out_grid[1] / np.maximum(rad, 1), np.pad(chromatin, pad, "reflect"), extra)
            nucleus = _same_absorbance(big * texture, nucleus, peak)
            r0 *= SUBTLE_ENLARGEMENT
        templates[i] = peak * nucleus
        radii[i] = r0
    return NucleusBank(templates, radii)


def _polar_grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(angle, distance) of each pixel of a size x size canvas from its centre pixel."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) - size // 2
    return np.arctan2(yy, xx), np.hypot(yy, xx)


def _outline(
    grid: tuple[np.ndarray, np.ndarray],
    r0: float,
    aspect: float,
    angle: float,
    ripple: list[tuple[float, int, float]],
    rmax: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(coverage in [0, 1], radius per pixel's direction) of an elliptical nucleus with a low-order
    wobble (irregular, pleomorphic outlines) and a one-pixel anti-aliased edge."""
    theta, dist = grid
    c, s = np.cos(theta - angle), np.sin(theta - angle)
    ellipse = r0 / np.sqrt((c / np.sqrt(aspect)) ** 2 + (s * np.sqrt(aspect)) ** 2)
    wobble = sum(amplitude * np.cos(k * theta + phase) for amplitude, k, phase in ripple)
    rad = np.minimum(ellipse * (1 + wobble), rmax)
    return np.clip(rad - dist + 0.5, 0, 1), rad


def _same_absorbance(nucleus: np.ndarray, twin: np.ndarray, peak: float) -> np.ndarray:
    """`nucleus` scaled to absorb as much light as `twin` once both are blurred by the optics
    (Beer-Lambert, a typical hematoxylin OD per unit): the tile's mean colour stays where the twin left it."""

    def absorbed(x: np.ndarray) -> float:
        return float((1 - np.exp(-0.7 * peak * ndimage.gaussian_filter(x, OPTICS_BLUR))).sum())

    target, low, high = absorbed(twin), 0.0, 4.0
    for _ in range(30):  # bisection: absorbance grows with the scale
        mid = (low + high) / 2
        low, high = (mid, high) if absorbed(mid * nucleus) < target else (low, mid)
    return (low + high) / 2 * nucleus


def _vesicular(rel: np.ndarray, chromatin: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Pale centre, dark rim, coarse clumps and one nucleolus: the chromatin of an activated nucleus."""
    size = rel.shape[0]
    rim = np.clip((rel - 0.55) / 0.35, 0, 1) ** 2
    clumps = (chromatin > 0.8).astype(np.float32)
    centre = size // 2 + rng.uniform(-1.0, 1.0, size=2)
    yy, xx = np.mgrid[0:size, 0:size]
    nucleolus = np.exp(-((yy - centre[0]) ** 2 + (xx - centre[1]) ** 2) / 2.0)
    return 0.25 + 1.6 * rim + 0.8 * clumps + 1.6 * nucleolus


def stamp_nuclei(
    target: np.ndarray, xs: np.ndarray, ys: np.ndarray, which: np.ndarray, bank: NucleusBank
) -> None:
    """Draw nuclei (centre x, y in `target`'s pixels, template index) by maximum, cropped at the edges."""
    half = bank.half
    height, width = target.shape
    for x, y, k in zip(xs.astype(np.int64), ys.astype(np.int64), which):
        x0, y0 = x - half, y - half
        tx0, ty0 = max(0, -x0), max(0, -y0)
        x1, y1 = min(width, x0 + 2 * half + 1), min(height, y0 + 2 * half + 1)
        if x1 <= x0 + tx0 or y1 <= y0 + ty0:
            continue
        region = target[y0 + ty0 : y1, x0 + tx0 : x1]
        np.maximum(
            region, bank.templates[k, ty0 : ty0 + region.shape[0], tx0 : tx0 + region.shape[1]], out=region
        )


def upsample(field: np.ndarray, height: int, width: int, step: int) -> np.ndarray:
    """Bilinear upsampling of a coarse grid (cells `step` px wide) as two small matrix products."""
    return (
        _linear_weights(height, field.shape[0], step) @ field @ _linear_weights(width, field.shape[1], step).T
    )


def _linear_weights(n_out: int, n_in: int, step: int) -> np.ndarray:
    pos = np.clip((np.arange(n_out) + 0.5) / step - 0.5, 0, n_in - 1)
    lo = np.minimum(pos.astype(np.int64), max(n_in - 2, 0))
    frac = (pos - lo).astype(np.float32)
    weights = np.zeros((n_out, n_in), np.float32)
    weights[np.arange(n_out), lo] = 1 - frac
    if n_in > 1:
        weights[np.arange(n_out), lo + 1] += frac
    return weights


def smooth_noise(height: int, width: int, cell: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-variance noise smooth over ~`cell` pixels, full size, float32."""
    gh, gw = -(-height // cell) + 1, -(-width // cell) + 1
    coarse = ndimage.gaussian_filter(rng.normal(size=(gh, gw)), 1.0, mode="reflect").astype(np.float32)
    coarse /= coarse.std() + 1e-6
    return upsample(coarse, height, width, cell)


def stroma_eosin(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Eosin OD of collagen stroma: wavy parallel fibres whose direction drifts across the slide."""
    yy = np.arange(height, dtype=np.float32)[:, None]
    xx = np.arange(width, dtype=np.float32)[None, :]
    angle = rng.uniform(0, np.pi)
    period = rng.uniform(7, 11)
    warp = smooth_noise(height, width, 128, rng) * 30 + smooth_noise(height, width, 32, rng) * 4
    phase = (xx * np.cos(angle) + yy * np.sin(angle) + warp) * np.float32(2 * np.pi / period)
    fibres = np.sin(phase)
    fibres = np.clip(fibres, 0, None, out=fibres) ** 2  # thin bright bands, darker gaps
    fibres *= np.clip(0.6 + 0.5 * smooth_noise(height, width, 16, rng), 0, 1)  # broken into bundles
    density = 0.8 + 0.15 * smooth_noise(height, width, 160, rng)
    eosin = (0.22 + 0.4 * fibres) * density
    eosin += 0.03 * rng.standard_normal((height, width), dtype=np.float32)
    return np.clip(eosin, 0.02, None, out=eosin)


@dataclass
class Structures:
    """Glands, vessels and fat drawn into a slide: where tissue is empty (`lumen`, 0..1), extra eosin,
    and the nuclei that line them (x, y)."""

    lumen: np.ndarray
    eosin: np.ndarray
    nuclei_x: list[float]
    nuclei_y: list[float]


def draw_structures(tissue: np.ndarray, rng: np.random.Generator) -> Structures:
    """Glands (lumen + epithelium + a ring of nuclei), vessels (lumen with red cells) and fat clusters."""
    height, width = tissue.shape
    lumen = np.zeros((height, width), np.float32)
    eosin = np.zeros((height, width), np.float32)
    nx: list[float] = []
    ny: list[float] = []
    area = float(tissue.sum())
    candidates = np.argwhere(tissue[::8, ::8]) * 8
    if len(candidates) == 0:
        return Structures(lumen, eosin, nx, ny)

    def centre() -> tuple[float, float]:
        y, x = candidates[rng.integers(len(candidates))]
        return float(x + rng.uniform(0, 8)), float(y + rng.uniform(0, 8))

    for _ in range(rng.poisson(area / 120_000)):  # glands
        cx, cy = centre()
        ra, rb, rot = rng.uniform(10, 30), rng.uniform(8, 20), rng.uniform(0, np.pi)
        wall = rng.uniform(9, 13)
        rr, cc = draw.ellipse(cy, cx, rb + wall, ra + wall, (height, width), rotation=rot)
        eosin[rr, cc] = np.maximum(eosin[rr, cc], 0.22)
        rr, cc = draw.ellipse(cy, cx, rb, ra, (height, width), rotation=rot)
        lumen[rr, cc] = 1
        ring = max(8, int(2 * np.pi * np.sqrt((ra**2 + rb**2) / 2) / 7))
        t = np.linspace(0, 2 * np.pi, ring, endpoint=False) + rng.uniform(0, 1)
        ex, ey = (ra + wall * 0.55) * np.cos(t), (rb + wall * 0.55) * np.sin(t)
        nx.extend((cx + ex * np.cos(rot) - ey * np.sin(rot)).tolist())
        ny.extend((cy - ex * np.sin(rot) - ey * np.cos(rot)).tolist())
    for _ in range(rng.poisson(area / 160_000)):  # vessels with red cells
        cx, cy = centre()
        ra, rb, rot = rng.uniform(14, 40), rng.uniform(4, 10), rng.uniform(0, np.pi)
        rr, cc = draw.ellipse(cy, cx, rb, ra, (height, width), rotation=rot)
        lumen[rr, cc] = 0.85
        for _ in range(int(ra * rb / 12)):
            k = rng.integers(len(rr))
            dr, dc = draw.disk((rr[k], cc[k]), 2.2, shape=(height, width))
            eosin[dr, dc] = 0.9
            lumen[dr, dc] = 0
        for side in (-1, 1):  # flat endothelial nuclei along the wall
            t = rng.uniform(-0.8, 0.8, size=2)
            ex, ey = ra * np.sin(t), side * (rb + 2) * np.cos(t)
            nx.extend((cx + ex * np.cos(rot) - ey * np.sin(rot)).tolist())
            ny.extend((cy - ex * np.sin(rot) - ey * np.cos(rot)).tolist())
    for _ in range(rng.poisson(area / 250_000)):  # fat: a cluster of empty adipocytes with thin septa
        cx, cy = centre()
        for _ in range(rng.integers(4, 12)):
            r = rng.uniform(12, 26)
            ox, oy = cx + rng.normal(0, 28), cy + rng.normal(0, 28)
            rr, cc = draw.disk((oy, ox), r, shape=(height, width))
            lumen[rr, cc] = 1
            rr, cc = draw.circle_perimeter(int(oy), int(ox), int(r), shape=(height, width))
            eosin[rr, cc] = 0.35
            lumen[rr, cc] = 0
    lumen *= tissue
    return Structures(lumen, eosin, nx, ny)
