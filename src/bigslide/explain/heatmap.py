"""Per-cell scores on a regular level-0 grid, and how to export and display them aligned with the slide.

Cell (i, j) covers level-0 pixels x in [x0 + j·P, x0 + (j+1)·P), y in [y0 + i·P, y0 + (i+1)·P) with
P = `cell_size_level0`; `bigslide.explain.placement` says where that lands in a viewer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from bigslide.explain.placement import Placement

Normalisation = Literal["raw", "rank", "percentile", "minmax"]


@dataclass
class ScoreGrid:
    scores: np.ndarray  # (rows, cols) float, NaN where no tile; or (rows, cols, 3) RGB in [0, 1]
    cell_size_level0: float
    origin: tuple[float, float] = (0.0, 0.0)  # level-0 (x, y) of cell (0, 0)'s top-left corner
    mpp: tuple[float, float] | None = None
    name: str = "attention"

    @classmethod
    def from_tiles(
        cls,
        coords: np.ndarray,
        values: np.ndarray,
        tile_size_level0: int,
        *,
        mpp: tuple[float, float] | None = None,
        name: str = "attention",
    ) -> ScoreGrid:
        """Scatter per-tile values (tiles on a regular grid, top-left `coords` (N, 2) as (x, y))."""
        coords = np.asarray(coords, dtype=np.int64)
        values = np.asarray(values, dtype=np.float32)
        if len(coords) == 0:
            return cls(np.full((0, 0), np.nan, np.float32), tile_size_level0, (0.0, 0.0), mpp, name)
        x0, y0 = coords.min(axis=0)
        cols = (coords[:, 0] - x0) // tile_size_level0
        rows = (coords[:, 1] - y0) // tile_size_level0
        grid = np.full((int(rows.max()) + 1, int(cols.max()) + 1), np.nan, np.float32)
        sums = np.zeros_like(grid)
        counts = np.zeros_like(grid)
        np.add.at(sums, (rows, cols), values)  # repeated tiles (inference repeats) are averaged
        np.add.at(counts, (rows, cols), 1)
        seen = counts > 0
        grid[seen] = sums[seen] / counts[seen]
        return cls(grid, float(tile_size_level0), (float(x0), float(y0)), mpp, name)

    @property
    def is_rgb(self) -> bool:
        return self.scores.ndim == 3

    def layer_transform(
        self, placement: Placement | None = None
    ) -> tuple[tuple[float, float], tuple[float, float]]:
        """(scale, translate) in napari (row, col) world units over a slide placed at `placement`
        (default: at the origin with the grid's own mpp; µm when known, else level-0 pixels)."""
        return (placement or Placement(self.mpp)).raster(self.cell_size_level0, self.origin)

    def normalized(self, mode: Normalisation = "raw") -> np.ndarray:
        """Scores mapped for display; NaN cells stay NaN. rank/percentile/minmax give [0, 1]."""
        s = self.scores.astype(np.float32)
        if mode == "raw" or self.is_rgb:
            return s
        out = np.full_like(s, np.nan)
        ok = np.isfinite(s)
        v = s[ok]
        if v.size == 0:
            return out
        if mode == "rank":
            out[ok] = (average_ranks(v) - 1) / max(v.size - 1, 1)
        elif mode == "percentile":
            lo, hi = np.percentile(v, [1, 99])
            out[ok] = np.clip((v - lo) / (hi - lo if hi > lo else 1.0), 0, 1)
        elif mode == "minmax":
            out[ok] = (v - v.min()) / (np.ptp(v) or 1.0)
        else:
            raise ValueError(f"normalisation must be raw, rank, percentile or minmax, got {mode!r}")
        return out

    def cell_of(self, x: float, y: float) -> tuple[int, int]:
        """(row, col) of the cell holding level-0 point (x, y)."""
        p = self.cell_size_level0
        return int((y - self.origin[1]) // p), int((x - self.origin[0]) // p)

    def save_npz(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            path,
            scores=self.scores,
            cell_size_level0=self.cell_size_level0,
            origin=np.asarray(self.origin),
            mpp=np.asarray(self.mpp if self.mpp else (np.nan, np.nan)),
            name=self.name,
        )
        return path

    @classmethod
    def load_npz(cls, path: str | Path) -> ScoreGrid:
        with np.load(path) as data:
            mpp = tuple(float(v) for v in data["mpp"])
            return cls(
                scores=data["scores"],
                cell_size_level0=float(data["cell_size_level0"]),
                origin=(float(data["origin"][0]), float(data["origin"][1])),
                mpp=None if np.isnan(mpp[0]) else (mpp[0], mpp[1]),
                name=str(data["name"]),
            )


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (scipy's `rankdata`, whose module takes half a second
    to import: a viewer's first heatmap would wait for it)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    counts = np.diff(np.r_[starts, len(values)])
    ranks = np.empty(len(values), np.float64)
    ranks[order] = np.repeat(starts + (counts + 1) / 2, counts)
    return ranks
