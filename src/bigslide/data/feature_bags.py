"""Bags of stored tile features (`data.features`): item i = rows of case i's feature files (one per
slide; without a case column each slide is its own case).

The rows are sampled exactly as `BagDataset` samples tiles, from (seed, epoch, slide, repeat), so a bigslide
file, whose rows are the slide's tile grid in order, gives the same tiles as reading the pixels would. The
files are attached by the engine once it knows the encoder (`attach`), which first writes the missing ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bigslide.data.bags import BagDataset, by_slide
from bigslide.data.endpoint import Endpoint
from bigslide.data.feature_store import (
    ExpectedTiles,
    FeatureFile,
    StoreSettings,
    check_unique_names,
    feature_path,
    open_feature_file,
)
from bigslide.data.instance_labels import AnnotatedTiles
from bigslide.data.processes import Pool
from bigslide.data.sample import Sample, SlidePart
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideTable
from bigslide.data.tile_cache import slide_bytes
from bigslide.errors import DataError
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.pixel_classes import TissueSettings
from bigslide.wsi.resolution import DEFAULT_MPP


class FeatureBagDataset(BagDataset):
    """Bags of `bag_size` rows of each case's feature files in `folder` (0 = every row), its slides' files
    one after the other as `BagDataset` takes their tiles, unaugmented. Files, grids and `path` are per
    table row (slide); items are cases.

    `foreign_dim` > 0 also takes files of other tools (CLAM, TRIDENT) of that width: their rows are their
    own tiles, not this run's grid, and nothing is extracted for a slide without a file.
    """

    decodes_tiles = False  # the loader starts no decoding processes for it

    def __init__(
        self,
        table: SlideTable,
        folder: str | Path,
        *,
        tile_size: int,
        target_mpp: float = DEFAULT_MPP,
        bag_size: int = 32,
        min_tissue: float = 0.6,
        tissue: TissueSettings = TissueSettings(),
        seed: int = 0,
        slides: SlideCache | None = None,
        endpoint: Endpoint | None = None,
        foreign_dim: int = 0,
        instance_classes: list[str] | None = None,
    ) -> None:
        # Not BagDataset.__init__: a slide's tile grid is needed only to extract or check bigslide's own
        # files, so it is made on demand (`grid`), and foreign files need none.
        self.items = list(table.cases().values())  # table rows of each case, in table order
        self.table = table
        self.folder = Path(folder)
        self.endpoint = endpoint or Endpoint(classes=list(table.classes))
        self.tile_size = tile_size
        self.target_mpp = target_mpp
        self.bag_size = bag_size
        self.min_tissue = min_tissue
        self.tissue = tissue
        self.augment = False  # stored features are of the tiles as read
        self.seed = seed
        self.epoch = 0
        self.slides = slides or SlideCache()
        self.foreign_dim = foreign_dim
        self.grids: list[TileGrid] = []  # unused: rows come from the files
        self._grids: dict[int, TileGrid] = {}
        self.files: list[FeatureFile | None] = [None] * len(table)
        # labelled as each file is attached: a file's rows are its own tiles (foreign files too)
        self.instance_classes = instance_classes
        self.annotated = (
            AnnotatedTiles.unlabelled(len(table)) if instance_classes and table.annotated() else None
        )
        check_unique_names(self.folder, [e.path for e in table.entries])

    def path(self, i: int) -> Path:
        return feature_path(self.folder, self.table.entries[i].path)

    def grid(self, i: int) -> TileGrid:
        """Slide i's tile grid at this run's tile size, resolution and tissue threshold."""
        grid = self._grids.get(i)
        if grid is None:
            entry = self.table.entries[i]
            grid = self.slides.grid(entry, self.tile_size, self.target_mpp, self.min_tissue, self.tissue)
            if len(grid) == 0:
                raise DataError(
                    f"{entry.path}: no tile of {self.tile_size} px at {self.target_mpp} µm/px has tissue "
                    f">= {self.min_tissue}"
                    + (f" inside the regions of {entry.regions}" if entry.regions else "")
                )
            self._grids[i] = grid
        return grid

    def expected_tiles(self, i: int) -> ExpectedTiles:
        grid = self.grid(i)
        mpp = grid.slide_mpp or (DEFAULT_MPP, DEFAULT_MPP)
        return ExpectedTiles(
            grid.coords,
            grid.tile_size_level0,
            (float(mpp[0]), float(mpp[1])),
            slide_bytes(Path(self.table.entries[i].path)),
        )

    def attach(self, i: int, settings: StoreSettings) -> FeatureFile:
        """Open and check slide i's feature file (it must exist by now); a bigslide file must hold this
        run's tile grid of the slide, row for row."""
        path = self.path(i)
        if not path.is_file():
            raise DataError(
                f"{self.table.entries[i].path}: no feature file {path}"
                + (" (bigslide does not extract features beside foreign ones)" if self.foreign_dim else "")
            )
        file = open_feature_file(path, settings, foreign_dim=self.foreign_dim)
        if not file.foreign:
            self.expected_tiles(i).check(file)
        self.files[i] = file
        if self.annotated is not None and self.instance_classes is not None:
            self.annotated.label_row(
                self.table.entries[i], i, file.coords, file.tile_size_level0, self.instance_classes
            )
        return file

    def file(self, i: int) -> FeatureFile:
        file = self.files[i]
        if file is None:
            raise RuntimeError(f"{self.path(i)}: feature file not attached (the engine attaches it)")
        return file

    def tile_count(self, i: int) -> int:
        """Rows of case i's files, over all its slides."""
        return sum(self.file(row).rows for row in self.items[i])

    def read_bag(self, i: int, indices: np.ndarray, pool: Pool = None) -> Sample:
        """Rows `indices` (increasing) of case i's features, its slides' files one after the other, with
        their tiles' level-0 corners."""
        rows = self.items[i]
        files = [self.file(row) for row in rows]
        features: list[np.ndarray] = []
        coords: list[np.ndarray] = []
        parts: list[SlidePart] = []
        for k, mine, places in by_slide([f.rows for f in files], indices):
            file = files[k]
            parts.append(SlidePart(str(self.table.entries[rows[k]].path), places, file.tile_size_level0))
            features.append(file.read(None if len(mine) == file.rows else mine))
            coords.append(file.coords[mine])
        entry = self.table.entries[rows[0]]
        return Sample(
            x=torch.from_numpy(features[0] if len(features) == 1 else np.concatenate(features)),
            y=self.endpoint.target(entry),
            slide=str(entry.path),
            coords=np.concatenate(coords),
            tile_size_level0=files[0].tile_size_level0,
            features=True,
            parts=tuple(parts) if len(rows) > 1 else (),
            instance_labels=None if self.annotated is None else self.annotated.labels(rows)[indices],
        )

    def load(self, i: int, pool: Pool) -> Sample:
        return self.read_bag(i, self.tile_indices(i))
