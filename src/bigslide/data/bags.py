"""Bags of tiles for MIL methods: N tiles per slide from its TileGrid, read lazily, augmented per slide."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from bigslide.data.endpoint import Endpoint
from bigslide.data.processes import Pool, read_slide_squares
from bigslide.data.sample import Sample, as_float
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideTable
from bigslide.errors import DataError
from bigslide.grid import TileGrid
from bigslide.resolution import DEFAULT_MPP


def augment_bag(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """One random flip/rotation and brightness/contrast change, the same for every tile of the bag
    (Big-Layers §4.2.6): the bag stays one coherent view of the slide. uint8 bags stay uint8."""
    k = int(rng.integers(4))
    if k:
        x = torch.rot90(x, k, dims=(-2, -1))
    if rng.random() < 0.5:
        x = torch.flip(x, dims=(-1,))
    brightness = float(rng.uniform(-0.05, 0.05))
    contrast = float(rng.uniform(0.9, 1.1))
    f = as_float(x)
    mean = f.mean()
    f = ((f - mean) * contrast + mean + brightness).clamp_(0.0, 1.0)
    return f.mul_(255).round_().to(torch.uint8) if x.dtype == torch.uint8 else f


class BagDataset(Dataset[Sample]):
    """Item i = a bag from slide i: `bag_size` tiles sampled without replacement (0 = every tile).

    Sampling depends on (seed, epoch, i) only, so runs are reproducible and resumable; call
    `set_epoch` each epoch for fresh bags.
    """

    def __init__(
        self,
        table: SlideTable,
        *,
        tile_size: int,
        target_mpp: float = DEFAULT_MPP,
        bag_size: int = 32,
        min_tissue: float = 0.6,
        augment: bool = False,
        seed: int = 0,
        slides: SlideCache | None = None,
        endpoint: Endpoint | None = None,
    ) -> None:
        self.table = table
        self.endpoint = endpoint or Endpoint(classes=list(table.classes))
        self.tile_size = tile_size
        self.target_mpp = target_mpp
        self.bag_size = bag_size
        self.augment = augment
        self.seed = seed
        self.epoch = 0
        self.slides = slides or SlideCache()
        self.grids: list[TileGrid] = []
        for entry in table.entries:
            grid = self.slides.grid(entry, tile_size, target_mpp, min_tissue)
            if len(grid) == 0:
                raise DataError(
                    f"{entry.path}: no tile of {tile_size} px at {target_mpp} µm/px has tissue "
                    f">= {min_tissue}" + (f" inside the regions of {entry.regions}" if entry.regions else "")
                )
            self.grids.append(grid)

    def __len__(self) -> int:
        return len(self.table)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def tile_count(self, i: int) -> int:
        """Tiles of slide i a bag is sampled from."""
        return len(self.grids[i])

    def tile_indices(self, i: int, *, repeat: int = 0) -> np.ndarray:
        n = self.tile_count(i)
        if self.bag_size <= 0 or self.bag_size >= n:
            return np.arange(n)
        rng = np.random.default_rng([self.seed, self.epoch, i, repeat])
        return np.sort(rng.choice(n, self.bag_size, replace=False))

    def read_bag(self, i: int, indices: np.ndarray, pool: Pool = None) -> Sample:
        """The bag of tiles `indices` of slide i; file tiles are decoded once, on `pool` when given."""
        entry, grid = self.table.entries[i], self.grids[i]
        squares = read_slide_squares(self.slides, entry.path, grid.plan, grid.coords[indices], pool)
        x = torch.from_numpy(squares)
        if self.augment:
            x = augment_bag(x, np.random.default_rng([self.seed, self.epoch, i, 7919]))
        return Sample(
            x=x,
            y=self.endpoint.target(entry),
            slide=str(entry.path),
            coords=grid.coords[indices],
            tile_size_level0=grid.tile_size_level0,
        )

    def __getitem__(self, i: int) -> Sample:
        return self.read_bag(i, self.tile_indices(i))

    def load(self, i: int, pool: Pool) -> Sample:
        """Item i, decoding on `pool` (the loader's processes)."""
        return self.read_bag(i, self.tile_indices(i), pool)


def slide_name(path: str | Path) -> str:
    return Path(path).name
