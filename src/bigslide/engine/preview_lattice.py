"""A preview's lattice: a large slide read one tile in s x s (`thin_grids`) and its map drawn with each read
tile's score over its s x s block of cells (`coarse_map`), so a whole slide is seen at a bounded cost."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from bigslide.data.bags import BagDataset
from bigslide.explain.heatmap import ScoreGrid


def thin_grids(dataset: BagDataset, max_tiles: int, rows: Iterable[int] | None = None) -> dict[int, int]:
    """Keep one tile in s x s of each grid (of `rows`, else all) with more than `max_tiles` (a lattice
    from its first tile); returns s per table row that was thinned. Bags of stored features have no
    grids: nothing is thinned, every row is read (as cheaply as a thinned slide)."""
    steps: dict[int, int] = {}
    if not dataset.grids:
        return steps
    for row in range(len(dataset.grids)) if rows is None else rows:
        grid = dataset.grids[row]
        if len(grid) <= max_tiles:
            continue
        step = math.ceil(math.sqrt(len(grid) / max_tiles))
        t = grid.tile_size_level0
        lattice = (grid.coords - grid.coords.min(axis=0)) // t % step
        keep = (lattice == 0).all(axis=1)
        if keep.any():
            dataset.grids[row] = replace(grid, coords=grid.coords[keep], tissue=grid.tissue[keep])
            steps[row] = step
    return steps


def coarse_map(grid: ScoreGrid, step: int) -> ScoreGrid:
    """A thinned slide's map with each read tile's score over its step x step block of cells (bags give
    one score per tile: no RGB maps here); step 1: the map as it is."""
    if step == 1:
        return grid
    rows, cols = np.nonzero(np.isfinite(grid.scores))
    coords = np.stack([cols, rows], axis=1) * grid.cell_size_level0 + np.asarray(grid.origin)
    cell = round(grid.cell_size_level0 * step)
    return ScoreGrid.from_tiles(coords, grid.scores[rows, cols], cell, mpp=grid.mpp, name=grid.name)
