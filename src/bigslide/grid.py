"""A grid of non-overlapping tiles over a slide, in level-0 pixels (TRIDENT/CLAM convention).

Tissue is measured on a low pyramid level, never by reading level 0 tile by tile: each tile's tissue
fraction is the share of its footprint's low-level pixels that pass the filter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bigslide.errors import ConfigError, SlideError
from bigslide.regions import Region, centres_inside, check_inside
from bigslide.resolution import ReadPlan, plan_level, plan_read
from bigslide.slide import WHOLE_READ_PIXELS, Slide
from bigslide.tissue import DEFAULT_MIN_TISSUE, MASK_SIZE, rule_mask, tissue_mask

TileFilter = Literal["rule", "otsu", "none"]
MIN_FOOTPRINT_PX = 4
"""A tile must still span this many pixels on the level its tissue is measured on."""
_STRIP_PIXELS = 1 << 24
TILING_VERSION = 1
"""Raise when a slide's grid or tissue mask changes for a reason outside `bigslide.data.tile_cache`'s
TILING_MODULES (e.g. a library's algorithm): grids kept on disk are then made anew."""


@dataclass(eq=False)
class TileGrid:
    """Tiles as level-0 top-left corners `coords` (N, 2) int64 (x, y), in row-major order (y, then x).

    `tile_size` is the side the model sees (pixels at `target_mpp`, or at `level` when that is None);
    `tile_size_level0` the side in level-0 pixels; `read_size` the side read at `level` (resized to
    `tile_size` when they differ). `slide_mpp` is the slide's level-0 (x, y) microns per pixel.
    """

    coords: np.ndarray
    tissue: np.ndarray
    tile_size: int
    tile_size_level0: int
    level: int
    downsample: float
    slide_mpp: tuple[float, float] | None
    slide_path: str
    slide_dimensions: tuple[int, int]
    min_tissue: float = DEFAULT_MIN_TISSUE
    filter: str = "rule"
    target_mpp: float | None = None
    read_size: int = 0

    def __post_init__(self) -> None:
        self.read_size = self.read_size or self.tile_size

    @property
    def plan(self) -> ReadPlan:
        """How each tile is read: level, size read there, size the model sees."""
        return ReadPlan(
            self.tile_size,
            self.level,
            self.downsample,
            self.tile_size_level0,
            self.read_size,
            self.target_mpp,
        )

    def __len__(self) -> int:
        return len(self.coords)

    @classmethod
    def from_slide(
        cls,
        slide: Slide,
        tile_size: int,
        level: int = 0,
        min_tissue: float = DEFAULT_MIN_TISSUE,
        regions: Sequence[Region] | None = None,
        *,
        filter: TileFilter = "rule",
        target_mpp: float | None = None,
    ) -> TileGrid:
        """Tile `slide` at `target_mpp` µm/px (else at pyramid `level` as stored); keep tiles with tissue
        >= `min_tissue` whose centre is in `regions`.

        filter "rule": Big-Layers rule (greyscale in [3, 230]); "otsu": the Otsu tissue mask;
        "none": keep every tile (tissue still reports the rule's fraction). `regions=None` tiles the
        whole slide; an empty list keeps no tile.
        """
        if tile_size < 1:
            raise ConfigError(f"tile_size must be a positive number of pixels, got {tile_size}")
        if not 0.0 <= min_tissue <= 1.0:
            raise ConfigError(f"min_tissue must lie in [0, 1], got {min_tissue}")
        if filter not in ("rule", "otsu", "none"):
            raise ConfigError(f"filter must be 'rule', 'otsu' or 'none', got {filter!r}")
        plan = (
            plan_read(slide, tile_size, target_mpp)
            if target_mpp is not None
            else plan_level(slide, tile_size, level)
        )
        level, downsample, size0 = plan.level, plan.downsample, plan.size_level0
        level_w, level_h = slide.level_dimensions[level]
        if plan.read_size > min(level_w, level_h):
            at = f" read at {target_mpp} µm/px as {plan.read_size} px" if target_mpp is not None else ""
            raise SlideError(
                f"{slide.path}: a tile of {tile_size} px does not fit the slide ({level_w} x {level_h} px "
                f"at level {level}){at}; choose a smaller tile size or a finer resolution"
            )
        coords = _full_grid(slide, level, plan.read_size, size0)
        if regions is not None:
            check_inside(regions, slide.dimensions, slide.path)
            coords = coords[centres_inside(coords, size0, regions)]

        if filter == "otsu":
            mask, mask_ds = tissue_mask(slide)
            tissue = _fractions(mask, mask_ds, coords, size0)
        else:
            tissue = _rule_fractions(slide, coords, size0)
        if filter != "none":
            keep = tissue >= min_tissue
            coords, tissue = coords[keep], tissue[keep]

        return cls(
            coords=coords,
            tissue=tissue.astype(np.float32),
            tile_size=int(tile_size),
            tile_size_level0=int(size0),
            level=int(level),
            downsample=float(downsample),
            slide_mpp=slide.mpp,
            slide_path=str(slide.path),
            slide_dimensions=slide.dimensions,
            min_tissue=float(min_tissue),
            filter=filter,
            target_mpp=plan.target_mpp,
            read_size=plan.read_size,
        )

    # -- persistence ------------------------------------------------------------------------------
    def attributes(self) -> dict[str, Any]:
        """Grid metadata under TRIDENT-like names."""
        return {
            "patch_size": self.tile_size,
            "patch_size_level0": self.tile_size_level0,
            "level": self.level,
            "level_dim": list(self.slide_dimensions),
            "downsample": self.downsample,
            "mpp": list(self.slide_mpp) if self.slide_mpp is not None else None,
            "slide_path": self.slide_path,
            "min_tissue": self.min_tissue,
            "filter": self.filter,
            "target_mpp": self.target_mpp,
            "read_size": self.read_size,
        }

    def save(self, path: str | Path) -> Path:
        """Write coords, tissue and attributes (JSON) to an uncompressed `.npz` file."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        with path.open("wb") as f:
            np.savez(f, coords=self.coords, tissue=self.tissue, attrs=np.array(json.dumps(self.attributes())))
        return path

    @classmethod
    def load(cls, path: str | Path) -> TileGrid:
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                coords = data["coords"].astype(np.int64).reshape(-1, 2)
                tissue = data["tissue"].astype(np.float32)
                attrs = json.loads(str(data["attrs"]))
            mpp = attrs["mpp"]
            return cls(
                coords=coords,
                tissue=tissue,
                tile_size=int(attrs["patch_size"]),
                tile_size_level0=int(attrs["patch_size_level0"]),
                level=int(attrs["level"]),
                downsample=float(attrs["downsample"]),
                slide_mpp=(float(mpp[0]), float(mpp[1])) if mpp is not None else None,
                slide_path=str(attrs["slide_path"]),
                slide_dimensions=(int(attrs["level_dim"][0]), int(attrs["level_dim"][1])),
                min_tissue=float(attrs.get("min_tissue", DEFAULT_MIN_TISSUE)),
                filter=str(attrs.get("filter", "rule")),
                target_mpp=attrs.get("target_mpp"),
                read_size=int(attrs.get("read_size") or 0),
            )
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise SlideError(f"{path}: not a tile grid file ({exc})") from exc


def _full_grid(slide: Slide, level: int, tile_size: int, size0: int) -> np.ndarray:
    """Every tile fully inside the slide, both at level 0 and at the read level, row-major."""
    w0, h0 = slide.dimensions
    lw, lh = slide.level_dimensions[level]
    ds = slide.level_downsamples[level]
    xs = np.arange(0, w0 - size0 + 1, size0, dtype=np.int64)
    ys = np.arange(0, h0 - size0 + 1, size0, dtype=np.int64)
    xs = xs[np.floor(xs / ds) + tile_size <= lw]
    ys = ys[np.floor(ys / ds) + tile_size <= lh]
    yy, xx = np.meshgrid(ys, xs, indexing="ij")
    return np.stack([xx.ravel(), yy.ravel()], axis=1)


def measure_level(slide: Slide, size0: int) -> int:
    """The coarsest level on which a tile of `size0` level-0 pixels still spans MIN_FOOTPRINT_PX."""
    chosen = 0
    for level, ds in enumerate(slide.level_downsamples):
        if size0 / ds >= MIN_FOOTPRINT_PX * 0.99:  # level sizes are floored, so ds runs a hair high
            chosen = level
    return chosen


def thumbnail_downsample(slide: Slide) -> float:
    """Level-0 pixels per pixel of `slide.thumbnail(MASK_SIZE)`, without reading it."""
    level = slide.thumbnail_level(MASK_SIZE)
    w, h = slide.level_dimensions[level]
    return slide.level_downsamples[level] * max(1, math.ceil(max(w, h) / MASK_SIZE))


def _footprints(coords: np.ndarray, size0: int, ds: float, shape: tuple[int, int]) -> np.ndarray:
    """(N, 4) row0, row1, col0, col1 of each tile on a raster of downsample `ds` (at least 1 px)."""
    h, w = shape
    start = np.round(coords / ds).astype(np.int64)
    stop = np.round((coords + size0) / ds).astype(np.int64)
    stop = np.maximum(stop, start + 1)
    col0, row0 = np.clip(start[:, 0], 0, w - 1), np.clip(start[:, 1], 0, h - 1)
    col1, row1 = np.clip(stop[:, 0], col0 + 1, w), np.clip(stop[:, 1], row0 + 1, h)
    return np.stack([row0, row1, col0, col1], axis=1)


def _box_means(mask: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Mean of `mask` over each (row0, row1, col0, col1) box, via a summed-area table."""
    table = np.zeros((mask.shape[0] + 1, mask.shape[1] + 1), np.int64)
    table[1:, 1:] = mask.astype(np.int64).cumsum(0).cumsum(1)
    r0, r1, c0, c1 = boxes.T
    total = table[r1, c1] - table[r0, c1] - table[r1, c0] + table[r0, c0]
    return total / ((r1 - r0) * (c1 - c0))


def _fractions(mask: np.ndarray, ds: float, coords: np.ndarray, size0: int) -> np.ndarray:
    if len(coords) == 0:
        return np.zeros(0, np.float64)
    return _box_means(mask, _footprints(coords, size0, ds, mask.shape))


def _rule_fractions(slide: Slide, coords: np.ndarray, size0: int) -> np.ndarray:
    """Rule fraction per tile, reading the measuring level in strips of whole tile rows."""
    out = np.zeros(len(coords), np.float64)
    if len(coords) == 0:
        return out
    level = measure_level(slide, size0)
    lw, lh = slide.level_dimensions[level]
    if lw * lh > WHOLE_READ_PIXELS and size0 / thumbnail_downsample(slide) >= MIN_FOOTPRINT_PX:
        # no pyramid level is small enough: measure on the (streamed) thumbnail instead
        thumb = slide.thumbnail(MASK_SIZE)
        return _fractions(rule_mask(thumb), slide.dimensions[0] / thumb.shape[1], coords, size0)
    boxes = _footprints(coords, size0, slide.level_downsamples[level], (lh, lw))
    col0, col1 = int(boxes[:, 2].min()), int(boxes[:, 3].max())
    max_rows = max(int((boxes[:, 1] - boxes[:, 0]).max()), _STRIP_PIXELS // max(1, col1 - col0))
    order = np.argsort(boxes[:, 0], kind="stable")
    start = 0
    while start < len(order):
        top = int(boxes[order[start], 0])
        stop = start
        bottom = top
        while stop < len(order) and int(boxes[order[stop], 1]) - top <= max_rows:
            bottom = max(bottom, int(boxes[order[stop], 1]))
            stop += 1
        batch = order[start:stop]
        strip = rule_mask(slide._read_level(level, top, bottom, col0, col1))
        local = boxes[batch] - np.array([top, top, col0, col0])
        out[batch] = _box_means(strip, local)
        start = stop
    return out
