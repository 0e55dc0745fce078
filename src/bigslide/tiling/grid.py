"""A grid of non-overlapping tiles over a slide, in level-0 pixels (TRIDENT/CLAM convention).

Tissue is measured on a low pyramid level, never by reading level 0 tile by tile: each tile's tissue
fraction is the share of its footprint's low-level pixels that pass the filter
(`bigslide.tiling.tissue_measure`). Kept tiles are then measured for focus (`bigslide.tiling.blur`). What
was left out, and why, travels with the grid (`TileGrid.rejected`, `TileGrid.check`): the tissue check a
person looks at.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from bigslide.errors import ConfigError, SlideError
from bigslide.tiling.blur import focus_reference, out_of_focus, tile_sharpness
from bigslide.tiling.cell_check import tiles_with_cells
from bigslide.tiling.pixel_classes import GREYSCALE_RULE, TissueSettings
from bigslide.tiling.regions import Region, centres_sampled, check_inside
from bigslide.tiling.tissue import DEFAULT_MIN_TISSUE, tissue_mask
from bigslide.tiling.tissue_measure import TileMeasure, box_means, footprints, measure_tiles
from bigslide.wsi.resolution import ReadPlan, plan_level, plan_read
from bigslide.wsi.slide import Slide

TileFilter = Literal["rule", "otsu", "none"]
TILING_VERSION = 1
"""Raise when a slide's grid or tissue mask changes for a reason outside `bigslide.data.tile_cache`'s
TILING_MODULES (e.g. a library's algorithm): grids kept on disk are then made anew."""
INK, BLUR = 1, 2
"""Why a tile was left out (`TileGrid.rejected_reason`): ink, marker or dust; out of focus."""


@dataclass(frozen=True)
class TissueCheck:
    """What the tissue check found on a slide: `tiles` tiled (inside its regions), `kept`, `ink` left
    out for pen ink, marker or dust (they pass as tissue when ink counts as tissue), `blurred` of the
    tissue tiles out of focus (left out when `blur_excluded`); the share of the tiled area that is
    tissue and that is ink."""

    tiles: int = 0
    kept: int = 0
    ink: int = 0
    blurred: int = 0
    blur_excluded: bool = False
    tissue_fraction: float = 0.0
    ink_fraction: float = 0.0
    textured_fraction: float = 1.0
    """Share of the kept tiles' tissue that shows cell texture (glass, a dark background or ink does not)."""
    focus_reference: float | None = None
    """The median sharpness of the slide's tissue tiles, which out-of-focus tiles are judged against
    (`bigslide.tiling.blur.out_of_focus`; None: none measured, or a grid made before it was kept)."""
    greyscale: bool = False
    """The file holds no colour: tissue was told by the greyscale rule alone, no pen ink left out."""

    @property
    def tissue_tiles(self) -> int:
        """Tissue tiles: the kept ones, and the blurred ones left out."""
        return self.kept + (self.blurred if self.blur_excluded else 0)

    @property
    def blurred_fraction(self) -> float:
        """Blurred tiles over tissue tiles."""
        return self.blurred / self.tissue_tiles if self.tissue_tiles else 0.0

    @property
    def kept_fraction(self) -> float:
        return self.kept / self.tiles if self.tiles else 0.0


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
    sharpness: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # per kept tile
    rejected: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))  # left out ...
    rejected_reason: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # ... and why
    check: TissueCheck = field(default_factory=TissueCheck)
    tissue_settings: TissueSettings = field(default_factory=TissueSettings)

    def __post_init__(self) -> None:
        self.read_size = self.read_size or self.tile_size
        if len(self.sharpness) != len(self.coords):  # not measured (a grid from an older file)
            self.sharpness = np.full(len(self.coords), np.nan, np.float32)
        if len(self.rejected_reason) != len(self.rejected):
            raise ValueError(f"{len(self.rejected)} rejected tiles but {len(self.rejected_reason)} reasons")

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

    @property
    def out_of_focus(self) -> np.ndarray:
        """Which kept tiles are out of focus (`bigslide.tiling.blur.out_of_focus`; none when they were
        left out, `data.exclude_blurred`)."""
        settings = self.tissue_settings
        return out_of_focus(self.sharpness, settings.min_sharpness, self.check.focus_reference)

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
        tissue: TissueSettings = TissueSettings(),
    ) -> TileGrid:
        """Tile `slide` at `target_mpp` µm/px (else at pyramid `level` as stored); keep tiles with tissue
        >= `min_tissue` whose centre is sampled by `regions` (`bigslide.tiling.regions.centres_sampled`:
        inside an area to sample from, outside every excluded one).

        `tissue` says what tissue is (`TissueSettings`: stained tissue, not pen ink, marker or dust, by
        default; the Big-Layers greyscale rule [3, 230] with `GREYSCALE_RULE`) and whether blurred tiles
        are left out. filter "rule": that per-pixel rule measured per tile; "otsu": the Otsu tissue mask
        within it; "none": keep every tile (tissue still reports the rule's fraction). `regions=None`
        tiles the whole slide; an empty list keeps no tile.
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
        coords = full_grid(slide, level, plan.read_size, size0)
        greyscale = slide.greyscale and tissue.reject_ink
        if greyscale:  # grey tissue is as neutral as black ink: only the greyscale rule can tell it
            tissue = dataclasses.replace(tissue, reject_ink=False)
        if regions is not None:
            check_inside(regions, slide.dimensions, slide.path)
            coords = coords[centres_sampled(coords, size0, regions, tissue.exclude_classes)]
        measured = _measure(slide, coords, size0, filter, tissue)
        picked = _pick(slide, coords, size0, level, measured, filter, min_tissue, tissue)
        return cls(
            coords=picked.coords,
            tissue=picked.tissue.astype(np.float32),
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
            sharpness=picked.sharpness.astype(np.float32),
            rejected=picked.rejected,
            rejected_reason=picked.reason,
            check=dataclasses.replace(picked.check, greyscale=greyscale),
            tissue_settings=tissue,
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
            "tissue_settings": dataclasses.asdict(self.tissue_settings),
            "tissue_check": dataclasses.asdict(self.check),
        }

    def save(self, path: str | Path) -> Path:
        """Write coords, tissue, sharpness, the tiles left out (and why) and attributes (JSON) to an
        uncompressed `.npz` file."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        with path.open("wb") as f:
            np.savez(f, **self.arrays())  # type: ignore[arg-type]
        return path

    def arrays(self) -> dict[str, np.ndarray]:
        """What `save` writes (and `load` reads), by name."""
        return {
            "coords": self.coords,
            "tissue": self.tissue,
            "sharpness": self.sharpness,
            "rejected": self.rejected,
            "rejected_reason": self.rejected_reason,
            "attrs": np.array(json.dumps(self.attributes())),
        }

    @classmethod
    def load(cls, path: str | Path) -> TileGrid:
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                coords = data["coords"].astype(np.int64).reshape(-1, 2)
                tissue = data["tissue"].astype(np.float32)
                attrs = json.loads(str(data["attrs"]))
                extra = {k: data[k] for k in ("sharpness", "rejected", "rejected_reason") if k in data}
            mpp = attrs["mpp"]
            settings = attrs.get("tissue_settings")
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
                sharpness=extra.get("sharpness", np.zeros(0, np.float32)),
                rejected=extra.get("rejected", np.zeros((0, 2))).astype(np.int64).reshape(-1, 2),
                rejected_reason=extra.get("rejected_reason", np.zeros(0, np.uint8)),
                check=TissueCheck(**attrs.get("tissue_check", {})),
                # files from before the stain rule were made with the greyscale rule
                tissue_settings=TissueSettings.from_dict(settings) if settings else GREYSCALE_RULE,
            )
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise SlideError(f"{path}: not a tile grid file ({exc})") from exc


def full_grid(slide: Slide, level: int, tile_size: int, size0: int) -> np.ndarray:
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


class _Picked(NamedTuple):
    coords: np.ndarray
    tissue: np.ndarray
    sharpness: np.ndarray
    rejected: np.ndarray
    reason: np.ndarray
    check: TissueCheck


def _measure(
    slide: Slide, coords: np.ndarray, size0: int, filter: str, tissue: TissueSettings
) -> TileMeasure:
    measured = measure_tiles(slide, coords, size0, tissue)
    if filter != "otsu" or len(coords) == 0:
        return measured
    mask, mask_ds = tissue_mask(slide, settings=tissue)
    fractions = box_means(mask, footprints(coords, size0, mask_ds, mask.shape))
    return measured._replace(tissue=fractions)


def _textured_share(measured: TileMeasure, keep: np.ndarray) -> float:
    tissue = float(measured.tissue[keep].sum())
    # texture is judged on a sparser raster than tissue: the share can round past 1
    return round(min(1.0, float(measured.textured[keep].sum()) / tissue), 4) if tissue > 0 else 1.0


def _pick(
    slide: Slide,
    coords: np.ndarray,
    size0: int,
    read_level: int,
    measured: TileMeasure,
    filter: str,
    min_tissue: float,
    settings: TissueSettings,
) -> _Picked:
    """The tiles kept, their sharpness, and the tiles left out for ink or blur with the reason."""
    tissue = measured.tissue
    keep = tissue >= min_tissue if filter != "none" else np.ones(len(coords), bool)
    ink = ~keep & (tissue + measured.ink >= min_tissue) & (measured.ink > 0)
    films = ink & (measured.film > 0)
    if films.any():
        # what the film rule took for ink on the coarse level but shows cells on a finer one is tissue
        back = np.flatnonzero(films)[
            tiles_with_cells(slide, coords[films], size0, measured.glass, read_level)
        ]
        keep[back], ink[back] = True, False
        tissue = tissue.copy()
        tissue[back] += measured.ink[back]
    sharp = tile_sharpness(slide, coords[keep], size0, read_level)
    reference = focus_reference(sharp)
    blurred = out_of_focus(sharp, settings.min_sharpness, reference)
    rejected = [coords[ink]]
    reasons = [np.full(int(ink.sum()), INK, np.uint8)]
    if settings.exclude_blurred and blurred.any():
        kept = np.flatnonzero(keep)
        rejected.append(coords[kept[blurred]])
        reasons.append(np.full(int(blurred.sum()), BLUR, np.uint8))
        keep[kept[blurred]] = False
        sharp = sharp[~blurred]
    check = TissueCheck(
        tiles=len(coords),
        kept=int(keep.sum()),
        ink=int(ink.sum()),
        blurred=int(blurred.sum()),
        blur_excluded=settings.exclude_blurred,
        tissue_fraction=measured.slide_tissue,
        ink_fraction=measured.slide_ink,
        textured_fraction=_textured_share(measured, keep),
        focus_reference=reference,
    )
    order = np.lexsort((np.concatenate(rejected)[:, 0], np.concatenate(rejected)[:, 1]))
    return _Picked(
        coords[keep],
        tissue[keep],
        sharp,
        np.concatenate(rejected).astype(np.int64)[order],
        np.concatenate(reasons)[order],
        check,
    )
