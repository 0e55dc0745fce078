"""Synthetic whole-slide images with planted lesions, made on the fly (no downloads).

Tissue is textured with scikit-image's bundled immunohistochemistry image. A lesion is tissue with
the same colours but a finer texture (the same image shrunk, so nuclei are smaller and denser, with its
colour histogram matched back to the normal tissue), so telling lesions apart needs texture, not colour.
A slide is positive ("tumor") when it holds at least one lesion.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import shapely
from scipy import ndimage
from skimage import data as skdata
from skimage import draw, exposure, transform

from bigslide.errors import DataError
from bigslide.regions import Region, save_regions
from bigslide.synthetic.pyramid import Flavour, downsample_pyramid, write_pyramid

BACKGROUND = 240
LESION_TEXTURE_SCALE = 0.45
_SUFFIX = {"svs": ".svs", "tiff": ".tiff", "ome": ".ome.tif"}
_MANIFEST = "synthetic_set.json"
_SET_VERSION = 1


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


@lru_cache(maxsize=1)
def _textures() -> tuple[np.ndarray, np.ndarray]:
    """(normal, lesion) source textures; the lesion one is finer-grained with matched colour histogram."""
    normal = np.ascontiguousarray(skdata.immunohistochemistry())
    small = transform.rescale(normal, LESION_TEXTURE_SCALE, channel_axis=-1, anti_aliasing=True)
    lesion = exposure.match_histograms(small, normal.astype(np.float64) / 255, channel_axis=-1)
    return normal, np.clip(np.round(lesion * 255), 0, 255).astype(np.uint8)


def _mirror_index(n: int, period: int, offset: int) -> np.ndarray:
    """Indices 0..n-1 shifted by `offset` into a texture of `period`, mirrored at its edges (seamless)."""
    i = (np.arange(n) + offset) % (2 * period)
    return np.where(i < period, i, 2 * period - 1 - i)


class _Texture:
    """A randomly flipped/rotated texture mirror-tiled over the whole slide, sampled on demand."""

    def __init__(self, texture: np.ndarray, rng: np.random.Generator) -> None:
        tex = np.rot90(texture, int(rng.integers(4)))
        self.tex = np.ascontiguousarray(tex[:, ::-1] if rng.random() < 0.5 else tex)
        self.offset = (int(rng.integers(self.tex.shape[0])), int(rng.integers(self.tex.shape[1])))

    def window(self, row: int, col: int, height: int, width: int) -> np.ndarray:
        """The (height, width, 3) patch whose top-left pixel is slide pixel (row, col)."""
        th, tw = self.tex.shape[:2]
        iy = _mirror_index(height, th, self.offset[0] + row)
        ix = _mirror_index(width, tw, self.offset[1] + col)
        return self.tex.take(iy, axis=0).take(ix, axis=1)


def _linear_weights(n_out: int, n_in: int, step: int) -> np.ndarray:
    """(n_out, n_in) linear-interpolation matrix from a grid of cells `step` pixels wide to pixels."""
    pos = np.clip((np.arange(n_out) + 0.5) / step - 0.5, 0, n_in - 1)
    lo = np.minimum(pos.astype(np.int64), max(n_in - 2, 0))
    frac = (pos - lo).astype(np.float32)
    weights = np.zeros((n_out, n_in), np.float32)
    weights[np.arange(n_out), lo] = 1 - frac
    if n_in > 1:
        weights[np.arange(n_out), lo + 1] += frac
    return weights


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
    scale = min(1.0, min(height, width) / 2048)
    return max(24.0, 80 * scale), max(40.0, 250 * scale)


def synthesize_slide(
    size: tuple[int, int],
    *,
    lesions: int,
    seed: int,
    lesion_diameter: tuple[float, float] | None = None,
) -> SlideImage:
    """Render a slide of `size` (w, h) in memory with `lesions` lesions fully inside the tissue."""
    width, height = int(size[0]), int(size[1])
    if width < 64 or height < 64:
        raise DataError(f"size={size}: synthetic slides need at least 64x64 pixels")
    if lesions < 0:
        raise DataError(f"lesions={lesions}: must be >= 0")
    rng = np.random.default_rng(seed)
    normal_src, lesion_src = _textures()

    fld, threshold, step = _tissue_field(height, width, rng)
    # Separable linear upsampling as two small matrix products: much faster than ndimage.zoom.
    full = _linear_weights(height, fld.shape[0], step) @ fld @ _linear_weights(width, fld.shape[1], step).T
    alpha = np.clip((full - threshold) / 0.15, 0, 1)
    tissue = alpha >= 0.5

    lesion_mask = np.zeros((height, width), bool)
    # Lesions go where tissue is fully opaque, so no lesion pixel is blended with background.
    polygons = _place_lesions(lesions, fld > threshold, alpha >= 1, step, lesion_diameter, rng)
    normal_tex, lesion_tex = _Texture(normal_src, rng), _Texture(lesion_src, rng)
    texture = normal_tex.window(0, 0, height, width)
    for poly in polygons:
        rr, cc = _raster(poly, (height, width))
        lesion_mask[rr, cc] = True
        r0, c0 = int(rr.min()), int(cc.min())
        patch = lesion_tex.window(r0, c0, int(rr.max()) - r0 + 1, int(cc.max()) - c0 + 1)
        texture[rr, cc] = patch[rr - r0, cc - c0]

    stain = rng.uniform(0.94, 1.04, size=3).astype(np.float32)  # per-slide stain variation, lesion included
    noise = rng.integers(-3, 4, size=(height, width, 1), dtype=np.int16)
    # background + alpha * (stained texture - background) + noise, in place to keep memory flat
    rgb_f = texture.astype(np.float32)
    rgb_f *= stain
    rgb_f -= BACKGROUND
    rgb_f *= alpha[..., None]
    rgb_f += noise + np.float32(BACKGROUND)
    np.clip(rgb_f, 0, 255, out=rgb_f)
    rgb = np.rint(rgb_f, out=rgb_f).astype(np.uint8)
    return SlideImage(rgb=rgb, tissue=tissue, lesion_mask=lesion_mask, lesions=polygons)


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
) -> SlideInfo:
    """Write a 3-level pyramidal tiled TIFF with MPP metadata; label 1 ("tumor") when `lesions` > 0."""
    image = synthesize_slide(size, lesions=lesions, seed=seed, lesion_diameter=lesion_diameter)
    path = Path(path)
    write_pyramid(path, downsample_pyramid(image.rgb, 3), mpp=mpp, tile=tile, flavour=flavour)
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


def _stratified_splits(labels: list[int], rng: np.random.Generator) -> list[str]:
    """About 50/25/25 train/val/test per class, with each class in every split when it has >= 3 slides."""
    splits = [""] * len(labels)
    for k, cls in enumerate(sorted(set(labels))):
        idx = rng.permutation([i for i, lab in enumerate(labels) if lab == cls])
        n = len(idx)
        n_train = max(1, min(-(-n // 2), n - 2)) if n >= 3 else 1
        rest = n - n_train
        n_val = (rest + 1) // 2 if k % 2 == 0 else rest // 2  # alternate so totals stay balanced
        if n == 2:
            n_val = 1
        for j, i in enumerate(idx):
            splits[i] = "train" if j < n_train else "val" if j < n_train + n_val else "test"
    return splits


def _write_lesion_geojson(polygons: list[np.ndarray], path: Path) -> None:
    """QuPath-style GeoJSON: one Polygon annotation classified "lesion" per lesion, level-0 pixel (x, y)."""
    save_regions([Region(shapely.Polygon(poly), name="lesion") for poly in polygons], path)


def load_lesions(path: str | Path) -> dict[str, list[np.ndarray]]:
    """Read a set's `lesions.json`: slide file name -> list of (K, 2) level-0 (x, y) polygons."""
    raw = json.loads(Path(path).read_text())
    return {name: [np.asarray(p, dtype=np.float64) for p in polys] for name, polys in raw.items()}


def make_slide_set(
    out_dir: str | Path,
    *,
    n_slides: int = 12,
    size: tuple[int, int] = (2048, 2048),
    seed: int = 0,
    positive_fraction: float = 0.5,
    flavour: Flavour = "svs",
    lesion_diameter: tuple[float, float] | None = None,
) -> Path:
    """Write slides, `slides.csv` (slide,label,split), `lesions.json` and per-slide lesion GeoJSON.

    `lesion_diameter` = (min, max) in level-0 pixels; None scales the default with the slide size.

    Returns the CSV path. A folder already holding a set made with the same parameters is reused as is.
    """
    if n_slides < 1:
        raise DataError(f"n_slides={n_slides}: must be >= 1")
    if not 0 <= positive_fraction <= 1:
        raise DataError(f"positive_fraction={positive_fraction}: must be in [0, 1]")
    out = Path(out_dir)
    csv_path = out / "slides.csv"
    params = {
        "version": _SET_VERSION,
        "n_slides": n_slides,
        "size": [int(size[0]), int(size[1])],
        "seed": seed,
        "positive_fraction": positive_fraction,
        "flavour": flavour,
        "lesion_diameter": list(lesion_diameter) if lesion_diameter else None,
    }
    names = [f"slide_{i:03d}{_SUFFIX[flavour]}" for i in range(n_slides)]
    if _cached(out, params, names):
        return csv_path
    out.mkdir(parents=True, exist_ok=True)
    (out / _MANIFEST).unlink(missing_ok=True)  # an interrupted rewrite must not look complete

    rng = np.random.default_rng([seed, 7919])
    n_pos = round(n_slides * positive_fraction)
    labels = [0] * n_slides
    for i in rng.permutation(n_slides)[:n_pos]:
        labels[i] = 1
    splits = _stratified_splits(labels, rng)
    counts = [int(rng.integers(1, 4)) if lab else 0 for lab in labels]

    def write(i: int) -> SlideInfo:
        name = names[i]
        info = make_synthetic_slide(
            out / name,
            size=size,
            lesions=counts[i],
            seed=seed * 100_003 + i,
            flavour=flavour,
            lesion_diameter=lesion_diameter,
        )
        _write_lesion_geojson(info.lesions, out / f"{name.split('.')[0]}.lesions.geojson")
        return info

    # numpy and zlib release the GIL, so two threads nearly halve the time.
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        infos = list(pool.map(write, range(n_slides)))
    lesions = {name: [poly.round(2).tolist() for poly in info.lesions] for name, info in zip(names, infos)}

    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["slide", "label", "split"])
        for name, lab, split in zip(names, labels, splits):
            writer.writerow([name, "tumor" if lab else "normal", split])
    (out / "lesions.json").write_text(json.dumps(lesions))
    (out / _MANIFEST).write_text(json.dumps({"params": params, "slides": names}, indent=1))
    return csv_path


def _cached(out: Path, params: dict, names: list[str]) -> bool:
    try:
        manifest = json.loads((out / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("params") != params or manifest.get("slides") != names:
        return False
    return all((out / n).is_file() for n in [*names, "slides.csv", "lesions.json"])
