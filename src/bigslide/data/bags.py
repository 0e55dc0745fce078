"""Bags of tiles for MIL methods: N tiles per slide from its TileGrid, read lazily, augmented per bag."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from bigslide.data.colour import SampleStain, SampleView
from bigslide.data.endpoint import Endpoint
from bigslide.data.instance_labels import AnnotatedTiles
from bigslide.data.processes import Pool, read_slide_squares
from bigslide.data.sample import Sample, SlidePart, as_float
from bigslide.data.slides import SlideCache
from bigslide.data.stain import draw_stain_jitter
from bigslide.data.stain_norm import StainFit, fit_slide_stain
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.errors import DataError, RegionError, SlideError
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.pixel_classes import TissueSettings
from bigslide.wsi.resolution import DEFAULT_MPP


def draw_view(x: torch.Tensor, rng: np.random.Generator) -> SampleView:
    """One random turn, mirror and brightness/contrast change for the whole bag `x` (Big-Layers §4.2.6):
    the bag stays one coherent view of the slide. Contrast is about the bag's mean, estimated from every
    8th row and column of each tile; the pixels are left as read: the method's device applies the view
    where they become floats (`bigslide.data.colour`), so the host never makes a transformed copy."""
    turns = int(rng.integers(4))
    mirror = bool(rng.random() < 0.5)
    brightness = float(rng.uniform(-0.05, 0.05))
    contrast = float(rng.uniform(0.9, 1.1))
    mean = float(as_float(x[..., ::8, ::8]).mean())
    return SampleView(turns, mirror, contrast, mean * (1 - contrast) + brightness)


class BagDataset(Dataset[Sample]):
    """Item i = a bag from case i: `bag_size` tiles sampled without replacement (0 = every tile) from
    all of the case's slides together. Without a case column each slide is its own case.

    Sampling depends on (seed, epoch, i) only, so runs are reproducible and resumable; call
    `set_epoch` each epoch for fresh bags. `stain_augment` > 0: a stain perturbation of that strength
    per slide, drawn from (seed, epoch, i); `stain_normalise`: each sample carries its slide's stain
    fit (made once per slide; a case's bag, each of its slides'), which the method maps onto its reference
    (`bigslide.data.colour`).
    `skip_bad`: a slide that cannot be tiled (or has no tile with tissue) is left out of the table, and
    named in `left_out`, instead of being an error.
    `instance_classes`: label each tile from its slide's teaching annotations (`Sample.instance_labels`),
    and put the annotated tiles in every training bag (`AnnotatedTiles.pick`).
    """

    def __init__(
        self,
        table: SlideTable,
        *,
        tile_size: int,
        target_mpp: float = DEFAULT_MPP,
        bag_size: int = 32,
        min_tissue: float = 0.6,
        tissue: TissueSettings = TissueSettings(),
        augment: bool = False,
        seed: int = 0,
        slides: SlideCache | None = None,
        endpoint: Endpoint | None = None,
        stain_augment: float = 0.0,
        stain_normalise: str = "none",
        skip_bad: bool = False,
        instance_classes: list[str] | None = None,
    ) -> None:
        self.endpoint = endpoint or Endpoint(classes=list(table.classes))
        self.tile_size = tile_size
        self.target_mpp = target_mpp
        self.bag_size = bag_size
        self.augment = augment
        self.seed = seed
        self.epoch = 0
        self.slides = slides or SlideCache()
        self.stain_augment = stain_augment
        self.stain_normalise = stain_normalise
        self._stain_fits: dict[int, StainFit] = {}  # by table row: each slide's own stain
        self.min_tissue = min_tissue
        self.tissue = tissue
        self.grids: list[TileGrid] = []
        self.left_out: dict[str, str] = {}  # each slide left out (skip_bad): why
        kept = []
        # every slide tiled at once, in the decode workers when the slides have them
        made = self.slides.grids(table.entries, tile_size, target_mpp, min_tissue, tissue)
        for entry, grid in zip(table.entries, made, strict=True):
            try:
                self.grids.append(self._checked(entry, grid))
                kept.append(entry)
            except (SlideError, DataError, RegionError) as err:
                if not skip_bad:
                    raise
                self.left_out[str(entry.path)] = str(err)
        if self.left_out and not kept:
            first = next(iter(self.left_out.values()))
            raise DataError(f"every slide of the table was left out (data.skip_bad_slides): {first}")
        self.table = table.like(kept) if self.left_out else table
        self.items = list(self.table.cases().values())  # table rows of each case, in table order
        self.annotated = AnnotatedTiles.of(self.table, self.grids, instance_classes)

    def _checked(self, entry: SlideEntry, grid: TileGrid | Exception) -> TileGrid:
        """The slide's grid, or its error raised (a grid without a tile is one)."""
        if isinstance(grid, Exception):
            raise grid
        if len(grid) == 0:
            raise DataError(
                f"{entry.path}: no tile of {self.tile_size} px at {self.target_mpp} µm/px has tissue "
                f">= {self.min_tissue}" + (f" inside the regions of {entry.regions}" if entry.regions else "")
            )
        return grid

    def __len__(self) -> int:
        return len(self.items)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def tile_count(self, i: int) -> int:
        """Tiles of case i a bag is sampled from, over all its slides."""
        return sum(len(self.grids[row]) for row in self.items[i])

    def tile_indices(self, i: int, *, repeat: int = 0) -> np.ndarray:
        """Indices into the case's tiles, its slides' grids one after the other."""
        n = self.tile_count(i)
        if self.bag_size <= 0 or self.bag_size >= n:
            return np.arange(n)
        rng = np.random.default_rng([self.seed, self.epoch, i, repeat])
        picked = None if self.annotated is None else self.annotated.pick(self.items[i], self.bag_size, rng)
        return picked if picked is not None else np.sort(rng.choice(n, self.bag_size, replace=False))

    def read_bag(self, i: int, indices: np.ndarray, pool: Pool = None) -> Sample:
        """The bag of tiles `indices` of case i; file tiles are decoded once, on `pool` when given."""
        rows = self.items[i]
        squares: list[np.ndarray] = []
        coords: list[np.ndarray] = []
        parts: list[SlidePart] = []
        read: list[int] = []  # the rows of the slides the bag holds tiles of
        for k, mine, places in by_slide([len(self.grids[r]) for r in rows], indices):
            row = rows[k]
            grid, path = self.grids[row], self.table.entries[row].path
            squares.append(read_slide_squares(self.slides, path, grid.plan, grid.coords[mine], pool))
            parts.append(SlidePart(str(path), places, grid.tile_size_level0))
            coords.append(grid.coords[mine])
            read.append(row)
        # one slide: the worker's buffer as it is; several: one array (the reads' buffers are let go)
        x = torch.from_numpy(squares[0] if len(squares) == 1 else np.concatenate(squares))
        view = draw_view(x, np.random.default_rng([self.seed, self.epoch, i, 7919])) if self.augment else None
        entry = self.table.entries[rows[0]]
        return Sample(
            x=x,
            y=self.endpoint.target(entry),
            slide=str(entry.path),
            coords=np.concatenate(coords),
            tile_size_level0=self.grids[rows[0]].tile_size_level0,
            parts=tuple(parts) if len(rows) > 1 else (),
            stain=self.sample_stain(i, read),
            view=view,
            instance_labels=None if self.annotated is None else self.annotated.labels(rows)[indices],
        )

    def sample_stain(self, i: int, rows: list[int] | None = None) -> SampleStain | None:
        """Item i's stain fits (normalisation: its slide's, or each of the `rows` its bag read from, those of
        a case of several slides) and this epoch's perturbation (augmentation, one draw per case), if
        asked for."""
        if self.stain_normalise == "none" and self.stain_augment <= 0:
            return None
        rows = self.items[i] if rows is None else rows
        fits = tuple(self._slide_stain(r) for r in rows) if self.stain_normalise != "none" else ()
        jitter = None
        if self.stain_augment > 0:
            rng = np.random.default_rng([self.seed, self.epoch, i, 4177])
            jitter = draw_stain_jitter(rng, self.stain_augment)
        if len(self.items[i]) > 1:
            return SampleStain(None, jitter, fits)
        return SampleStain(fits[0] if fits else None, jitter)

    def _slide_stain(self, row: int) -> StainFit:
        """The stain of the slide of table row `row`, fitted once."""
        if row not in self._stain_fits:
            self._stain_fits[row] = fit_slide_stain(
                self.stain_normalise,
                self.table.entries[row].path,
                tile_size=self.tile_size,
                target_mpp=self.target_mpp,
                min_tissue=self.min_tissue,
                tissue=self.tissue,
                slides=self.slides,
            )
        return self._stain_fits[row]

    def __getitem__(self, i: int) -> Sample:
        return self.read_bag(i, self.tile_indices(i))

    def load(self, i: int, pool: Pool) -> Sample:
        """Item i, decoding on `pool` (the loader's processes)."""
        return self.read_bag(i, self.tile_indices(i), pool)


def by_slide(sizes: Sequence[int], indices: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """A case's bag split by slide: `indices` (increasing) into its slides' tiles one after the other
    (slide k has `sizes[k]`) as (k, the indices into slide k's own tiles, their places in the bag), for each
    slide the bag holds tiles of (a case of one slide: that slide, always)."""
    starts = np.cumsum([0, *sizes])
    out = []
    done = 0
    for k in range(len(sizes)):
        mine = indices[(indices >= starts[k]) & (indices < starts[k + 1])] - starts[k]
        if len(mine) or len(sizes) == 1:
            out.append((k, mine, np.arange(done, done + len(mine))))
            done += len(mine)
    return out


def slide_name(path: str | Path) -> str:
    return Path(path).name


def item_slides(dataset: Any, i: int) -> tuple[str, ...]:
    """The slide files item `i` of `dataset` is read from (a case's several); none for a dataset of
    images that are not slides."""
    if not isinstance(dataset, BagDataset):
        return ()
    return tuple(str(dataset.table.entries[row].path) for row in dataset.items[i])
