"""Tile labels from teaching annotations, for the tiles of a bag dataset's slides.

Each slide's grid is labelled once (`bigslide.tiling.annotations.label_tiles`); a training bag then
holds every annotated tile of its case, up to half the bag, so a bag still shows the rest of the slide
(a tumour slide's bag made only of tiles annotated "Not lesion" would teach its slide label to normal
tissue).
Above half, a fresh draw of the annotated tiles each epoch; the rest of the bag is drawn from all the
other tiles as without annotations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bigslide.data.table import SlideEntry, SlideTable
from bigslide.tiling.annotations import UNLABELLED, label_tiles, read_annotations
from bigslide.tiling.grid import TileGrid


@dataclass
class AnnotatedTiles:
    """Per table row, each grid tile's instance label (`UNLABELLED` outside the annotations)."""

    per_row: list[np.ndarray]

    @classmethod
    def of(
        cls, table: SlideTable, grids: Sequence[TileGrid], classes: Sequence[str] | None
    ) -> AnnotatedTiles | None:
        """The labels of every row's grid tiles among `classes` (`instance_classes(...)`); None when no
        classes are asked for or no row has annotations. A class the task lacks is a `DataError`
        naming the file and the annotation."""
        if classes is None or not table.annotated():
            return None
        tiles = cls.unlabelled(len(table))
        for row, (entry, grid) in enumerate(zip(table.entries, grids, strict=True)):
            tiles.label_row(entry, row, grid.coords, grid.tile_size_level0, classes)
        return tiles

    @classmethod
    def unlabelled(cls, rows: int) -> AnnotatedTiles:
        """Rows without tiles yet (`label_row` fills them)."""
        return cls([np.full(0, UNLABELLED, dtype=np.int64) for _ in range(rows)])

    def label_row(
        self, entry: SlideEntry, row: int, coords: np.ndarray, tile_size_level0: float, classes: Sequence[str]
    ) -> None:
        """Label table row `row`'s tiles (level-0 top-left `coords`) from its annotations file, if any."""
        labels = np.full(len(coords), UNLABELLED, dtype=np.int64)
        if entry.annotations is not None:
            annotations = read_annotations(entry.annotations)
            labels = label_tiles(annotations, coords, tile_size_level0, classes, entry.annotations)
        self.per_row[row] = labels

    def labels(self, rows: Sequence[int]) -> np.ndarray:
        """The labels of a case's tiles, its slides' grids one after the other."""
        return np.concatenate([self.per_row[r] for r in rows])

    def count(self, row: int) -> int:
        """Annotated tiles of a table row."""
        return int((self.per_row[row] != UNLABELLED).sum())

    def pick(self, rows: Sequence[int], bag_size: int, rng: np.random.Generator) -> np.ndarray | None:
        """Sorted indices of a bag of `bag_size` tiles of the case holding its annotated tiles (at most
        half the bag, drawn when there are more); None when the case has no annotated tile."""
        labels = self.labels(rows)
        annotated = np.flatnonzero(labels != UNLABELLED)
        if not len(annotated):
            return None
        most = (bag_size + 1) // 2
        if len(annotated) > most:
            annotated = rng.choice(annotated, most, replace=False)
        others = np.setdiff1d(np.arange(len(labels)), annotated)
        rest = rng.choice(others, bag_size - len(annotated), replace=False)
        return np.sort(np.concatenate([annotated, rest]))
