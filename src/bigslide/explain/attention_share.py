"""How much of a map's attention falls inside outlines a person drew: the figure that says whether teaching by
annotation moved the model's eye onto the lesions and off what is not lesion."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import shapely

from bigslide.explain.heatmap import ScoreGrid


def attention_share(grid: ScoreGrid, areas: Sequence[shapely.Geometry]) -> float | None:
    """Share of `grid`'s attention inside `areas` (level-0 geometries): the scores of the cells whose centre
    lies inside, over the scores of every scored cell. Scores below zero (a head's raw scores rather than
    weights) are counted from the lowest. None when there is no area, no scored cell or no attention."""
    if grid.is_rgb:
        raise ValueError(f"{grid.name}: an RGB map has no attention to share out")
    rows, cols = np.nonzero(np.isfinite(grid.scores))
    if not areas or not len(rows):
        return None
    scores = grid.scores[rows, cols].astype(np.float64)
    if scores.min() < 0:
        scores -= scores.min()
    total = scores.sum()
    if total <= 0:
        return None
    p = grid.cell_size_level0
    x = grid.origin[0] + (cols + 0.5) * p
    y = grid.origin[1] + (rows + 0.5) * p
    inside = np.asarray(shapely.contains_xy(shapely.union_all(list(areas)), x, y), dtype=bool)
    return float(scores[inside].sum() / total)
