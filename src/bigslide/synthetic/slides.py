"""Synthetic H&E-like whole-slide images with planted lesions, made on the fly (no downloads).

Glass, a tissue outline, collagen stroma, glands, vessels and fat, and nuclei, rendered by
`bigslide.synthetic.he`. Lesion kinds: "tumour" (crowded, enlarged, dark, pleomorphic nuclei: plain to
see at 10-20x) and "subtle" (the same nuclei in the same places, enlarged, paler and vesicular: same
density, same mean colour; a change seen at 40x). Masks and polygons are exact. A slide is positive
("tumor") when it holds a lesion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import shapely
from scipy import ndimage
from skimage import draw

from bigslide.errors import DataError
from bigslide.synthetic import he
from bigslide.synthetic.labs import lab_named
from bigslide.synthetic.pyramid import Flavour, downsample_pyramid, write_pyramid

LesionKind = Literal["tumour", "subtle"]
LESION_KINDS: tuple[str, ...] = ("tumour", "subtle")
NORMAL_DENSITY = 1 / 900  # stromal nuclei per pixel (before the cellularity field) at 0.5 µm/px
TUMOUR_DENSITY = 1 / 150  # crowded: nuclei overlap and touch


@dataclass(frozen=True)
class SlideInfo:
    """A written synthetic slide: `label` 1 when it holds a lesion; lesions are (K, 2) level-0 (x, y)."""

    path: Path
    label: int
    lesions: list[np.ndarray] = field(default_factory=list)
    mpp: float = 0.5
    dimensions: tuple[int, int] = (0, 0)

    @property
    def boxes(self) -> list[tuple[float, float, float, float]]:
        """Lesion bounding boxes (x0, y0, x1, y1) in level-0 pixels."""
        return [(*poly.min(axis=0).tolist(), *poly.max(axis=0).tolist()) for poly in self.lesions]


@dataclass(frozen=True)
class SlideImage:
    """An in-memory synthetic slide: level-0 RGB, tissue and lesion masks, lesion polygons."""

    rgb: np.ndarray
    tissue: np.ndarray
    lesion_mask: np.ndarray
    lesions: list[np.ndarray]


def _tissue_field(height: int, width: int, rng: np.random.Generator) -> tuple[np.ndarray, float, int]:
    """A smooth random field at 1/`step` resolution whose super-level set is one or a few blobs."""
    step = max(1, min(height, width) // 128)
    gh, gw = -(-height // step), -(-width // step)
    noise = ndimage.gaussian_filter(rng.normal(size=(gh, gw)), sigma=min(gh, gw) / 10, mode="reflect")
    noise /= noise.std() + 1e-12
    yy, xx = np.mgrid[0:gh, 0:gw].astype(np.float64)
    cy, cx = gh * rng.uniform(0.4, 0.6), gw * rng.uniform(0.4, 0.6)
    radius2 = ((yy - cy) / (0.4 * gh)) ** 2 + ((xx - cx) / (0.4 * gw)) ** 2
    fld = noise + 3.5 * (1 - radius2)
    margin = max(2, min(gh, gw) // 32)
    # A smooth penalty near the border keeps blobs off the edges without cutting them straight.
    border = np.minimum(np.minimum(yy, gh - 1 - yy) / gh, np.minimum(xx, gw - 1 - xx) / gw)
    fld -= 12 * np.clip(0.06 - border, 0, None) / 0.06
    fld[:margin], fld[-margin:], fld[:, :margin], fld[:, -margin:] = -10, -10, -10, -10
    threshold = float(np.quantile(fld, 1 - rng.uniform(0.3, 0.45)))
    return fld.astype(np.float32), threshold, step


def _lesion_polygon(cx: float, cy: float, radius: float, rng: np.random.Generator) -> np.ndarray:
    """A smooth irregular star-shaped polygon (48 vertices) around (cx, cy)."""
    theta = np.linspace(0, 2 * np.pi, 48, endpoint=False)
    wobble = sum(rng.uniform(0, 0.12) * np.cos(k * theta + rng.uniform(0, 2 * np.pi)) for k in range(2, 6))
    r = radius * (1 + wobble)
    return np.stack([cx + r * np.cos(theta), cy + r * np.sin(theta)], axis=1)


def _raster(poly: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    # Pixel (r, c) covers [c, c+1) x [r, r+1): test its centre against the polygon.
    return draw.polygon(poly[:, 1] - 0.5, poly[:, 0] - 0.5, shape)


def _default_diameter(height: int, width: int) -> tuple[float, float]:
    side = min(height, width)
    return max(24.0, 0.12 * side), max(40.0, 0.25 * side)


def synthesize_slide(
    size: tuple[int, int],
    *,
    lesions: int,
    seed: int,
    lesion_diameter: tuple[float, float] | None = None,
    lesion_kind: LesionKind = "tumour",
    lab: str = "A",
) -> SlideImage:
    """Render an H&E-like slide of `size` (w, h) with `lesions` lesions of `lesion_kind` inside the tissue,
    stained as `lab` does (`bigslide.synthetic.labs`: "A"; "B": stronger, bluer hematoxylin, paler eosin, a
    cast; "C": a larger shift of the same kind; "drawn-<seed>": a lab drawn at random from the seed).

    Each part draws from its own random stream, so the same seed with and without lesions gives the same
    pixels everywhere outside the lesion mask (the tests rely on this to check the ground truth), and the
    same seed in another lab gives the same tissue, masks and lesions in that lab's colours.
    """
    width, height = int(size[0]), int(size[1])
    if width < 64 or height < 64:
        raise DataError(f"size={size}: synthetic slides need at least 64x64 pixels")
    if lesions < 0:
        raise DataError(f"lesions={lesions}: must be >= 0")
    if lesion_kind not in LESION_KINDS:
        raise DataError(f"lesion_kind={lesion_kind!r}: must be one of {', '.join(LESION_KINDS)}")
    lab_named(lab)  # an unknown lab is named before any work
    r_tissue, r_stain, r_stroma, r_nuclei, r_lesion, r_noise = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(6)
    )
    fld, threshold, step = _tissue_field(height, width, r_tissue)
    alpha = np.clip((he.upsample(fld, height, width, step) - threshold) / 0.15, 0, 1)
    tissue = alpha >= 0.5
    stain = he.slide_stain(r_stain, lab)

    stroma = he.stroma_eosin(height, width, r_stroma)
    parts = he.draw_structures(alpha >= 1, r_stroma)
    open_tissue = 1 - parts.lumen
    eosin = np.maximum(stroma, parts.eosin)
    eosin *= open_tissue
    h_base = (0.025 * open_tissue).astype(np.float32)
    xs, ys, which = _normal_nuclei(alpha, parts, r_nuclei)
    hema = h_base.copy()
    he.stamp_nuclei(hema, xs, ys, which, he.nucleus_bank("normal"))

    lesion_mask = np.zeros((height, width), bool)
    # Lesions go where tissue is fully opaque, so no lesion pixel is blended with background.
    polygons = _place_lesions(lesions, fld > threshold, alpha >= 1, step, lesion_diameter, r_lesion)
    hema_out = ndimage.gaussian_filter(hema, he.OPTICS_BLUR)
    eosin_out = ndimage.gaussian_filter(eosin, he.OPTICS_BLUR)
    margin = he.nucleus_bank("tumour").half + 6
    for poly in polygons:
        rr, cc = _raster(poly, (height, width))
        lesion_mask[rr, cc] = True
        y0, x0 = max(0, int(rr.min()) - margin), max(0, int(cc.min()) - margin)
        y1, x1 = min(height, int(rr.max()) + margin + 1), min(width, int(cc.max()) + margin + 1)
        if lesion_kind == "tumour":
            h_local, e_local = _tumour_layer(stroma[y0:y1, x0:x1], r_lesion)
        else:  # the same nuclei in the same places, enlarged and vesicular
            h_local, e_local = h_base[y0:y1, x0:x1].copy(), eosin[y0:y1, x0:x1]
            he.stamp_nuclei(h_local, xs - x0, ys - y0, which, he.nucleus_bank("subtle"))
        hema_out[rr, cc] = ndimage.gaussian_filter(h_local, he.OPTICS_BLUR)[rr - y0, cc - x0]
        eosin_out[rr, cc] = ndimage.gaussian_filter(e_local, he.OPTICS_BLUR)[rr - y0, cc - x0]

    alpha32 = alpha.astype(np.float32)
    hema_out *= alpha32 * np.float32(stain.h_strength)
    eosin_out *= alpha32 * np.float32(stain.e_strength)
    noise = r_noise.standard_normal((height, width), dtype=np.float32)
    noise *= 0.012
    rgb = he.od_to_rgb(hema_out, eosin_out, stain, extra=noise)
    return SlideImage(rgb=rgb, tissue=tissue, lesion_mask=lesion_mask, lesions=polygons)


def _normal_nuclei(
    alpha: np.ndarray, parts: he.Structures, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stromal nuclei (sparse, denser in cellular patches) plus the nuclei lining glands and vessels."""
    height, width = alpha.shape
    n = rng.poisson(height * width * NORMAL_DENSITY * 2.5)
    xs, ys = rng.uniform(0, width, n), rng.uniform(0, height, n)
    cellularity = np.exp(0.9 * he.smooth_noise(height, width, 128, rng))  # mean ~1.5, patches up to ~5
    iy, ix = ys.astype(np.int64), xs.astype(np.int64)
    keep = (alpha[iy, ix] > 0.5) & (parts.lumen[iy, ix] < 0.5)
    keep &= rng.uniform(0, 2.5, n) < cellularity[iy, ix]
    xs = np.concatenate([xs[keep], np.asarray(parts.nuclei_x)])
    ys = np.concatenate([ys[keep], np.asarray(parts.nuclei_y)])
    return xs, ys, rng.integers(he.BANK_SIZE, size=len(xs))


def _tumour_layer(stroma: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A sheet of crowded, enlarged, dark, pleomorphic nuclei in lilac cytoplasm with a little stroma."""
    height, width = stroma.shape
    bank = he.nucleus_bank("tumour")
    n = rng.poisson(height * width * TUMOUR_DENSITY)
    hema = np.full((height, width), 0.1, np.float32)
    xs, ys = rng.uniform(0, width, n), rng.uniform(0, height, n)
    he.stamp_nuclei(hema, xs, ys, rng.integers(he.BANK_SIZE, size=n), bank)
    return hema, 0.45 * stroma + 0.14


def _place_lesions(
    count: int,
    coarse_tissue: np.ndarray,
    tissue: np.ndarray,
    step: int,
    diameter: tuple[float, float] | None,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Rejection-sample non-overlapping lesions whose every pixel lies inside the tissue."""
    if count == 0:
        return []
    height, width = tissue.shape
    dmin, dmax = diameter or _default_diameter(height, width)
    depth = ndimage.distance_transform_edt(coarse_tissue) * step  # room around each coarse cell
    placed: list[tuple[float, float, float]] = []
    polygons: list[np.ndarray] = []
    for attempt in range(min(2000, 400 * count)):
        shrink = max(0.6, 0.85 ** (attempt // 100))  # crowded: smaller, but never tiny
        radius = rng.uniform(dmin, dmax) / 2 * shrink
        candidates = np.argwhere(depth > 1.25 * radius + 2 * step)
        if len(candidates) == 0:
            continue
        gy, gx = candidates[rng.integers(len(candidates))]
        cx, cy = (gx + rng.random()) * step, (gy + rng.random()) * step
        if any(np.hypot(cx - px, cy - py) < 1.3 * (radius + pr) for px, py, pr in placed):
            continue
        poly = _lesion_polygon(cx, cy, radius, rng)
        rr, cc = _raster(poly, (height, width))
        inside_image = poly.min() >= 0 and poly[:, 0].max() < width and poly[:, 1].max() < height
        if not inside_image or len(rr) == 0 or not tissue[rr, cc].all():
            continue
        placed.append((cx, cy, radius))
        polygons.append(poly)
        if len(polygons) == count:
            return polygons
    raise DataError(
        f"lesions={count}: could not fit that many lesions in the tissue of a {width}x{height} slide"
    )


def make_synthetic_slide(
    path: str | Path,
    *,
    size: tuple[int, int] = (2048, 2048),
    lesions: int,
    seed: int,
    mpp: float = 0.5,
    tile: int = 256,
    flavour: Flavour = "svs",
    lesion_diameter: tuple[float, float] | None = None,
    lesion_kind: LesionKind = "tumour",
    lab: str = "A",
) -> SlideInfo:
    """Write a 3-level pyramidal tiled TIFF with MPP metadata; label 1 ("tumor") when `lesions` > 0. Tiles
    are JPEG at the lab's quality where its scanner writes JPEG, else lossless."""
    image = synthesize_slide(
        size,
        lesions=lesions,
        seed=seed,
        lesion_diameter=lesion_diameter,
        lesion_kind=lesion_kind,
        lab=lab,
    )
    path = Path(path)
    write_pyramid(
        path,
        downsample_pyramid(image.rgb, 3),
        mpp=mpp,
        tile=tile,
        flavour=flavour,
        jpeg_quality=lab_named(lab).jpeg_quality,
    )
    return SlideInfo(
        path=path,
        label=int(bool(image.lesions)),
        lesions=image.lesions,
        mpp=mpp,
        dimensions=(int(size[0]), int(size[1])),
    )


def _as_geometry(lesions: SlideInfo | Sequence[np.ndarray] | Sequence[shapely.Geometry]) -> shapely.Geometry:
    items = lesions.lesions if isinstance(lesions, SlideInfo) else list(lesions)
    geoms = [g if isinstance(g, shapely.Geometry) else shapely.Polygon(np.asarray(g, float)) for g in items]
    return shapely.union_all(geoms) if geoms else shapely.Polygon()


def lesion_fraction(
    info_or_lesions: SlideInfo | Sequence[np.ndarray] | Sequence[shapely.Geometry],
    coords: np.ndarray,
    tile_size_level0: float,
) -> np.ndarray:
    """Exact fraction of each tile (level-0 top-left (x, y), side `tile_size_level0`) covered by lesion."""
    coords = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
    union = _as_geometry(info_or_lesions)
    if union.is_empty or len(coords) == 0:
        return np.zeros(len(coords))
    t = float(tile_size_level0)
    boxes = shapely.box(coords[:, 0], coords[:, 1], coords[:, 0] + t, coords[:, 1] + t)
    return np.asarray(shapely.area(shapely.intersection(boxes, union)) / (t * t), dtype=np.float64)


def lesion_tiles(
    info_or_lesions: SlideInfo | Sequence[np.ndarray] | Sequence[shapely.Geometry],
    coords: np.ndarray,
    tile_size_level0: float,
    threshold: float = 0.1,
) -> np.ndarray:
    """Per-tile bool: more than `threshold` of the tile's area is lesion."""
    return lesion_fraction(info_or_lesions, coords, tile_size_level0) > threshold
