"""How well a score map finds known lesions: the AUC of its cells, lesion cells against other tissue cells."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bigslide.explain.heatmap import ScoreGrid
from bigslide.synthetic.slides import lesion_fraction

LESION_CELL_FRACTION = 0.1  # a cell counts as lesion when more than this share of it is lesion


def cell_lesion_fraction(grid: ScoreGrid, lesions: Sequence[np.ndarray]) -> np.ndarray:
    """(rows, cols) exact share of each grid cell covered by the lesion polygons (level-0 (x, y))."""
    rows, cols = grid.scores.shape[:2]
    p = grid.cell_size_level0
    yy, xx = np.mgrid[0:rows, 0:cols]
    corners = np.stack([grid.origin[0] + xx.ravel() * p, grid.origin[1] + yy.ravel() * p], axis=1)
    return lesion_fraction(lesions, corners, p).reshape(rows, cols)


def lesion_cell_auc(grid: ScoreGrid, lesions: Sequence[np.ndarray]) -> float:
    """AUC of the scores of tissue cells (finite score) with more than 10 % lesion against the others.

    NaN when the slide has no lesion cell or only lesion cells (the AUC is undefined there).
    """
    from sklearn.metrics import roc_auc_score  # here: sklearn takes a second to import

    if grid.is_rgb:
        raise ValueError(f"{grid.name}: an RGB grid has no scalar score to rank")
    seen = np.isfinite(grid.scores)
    truth = cell_lesion_fraction(grid, lesions)[seen] > LESION_CELL_FRACTION
    if truth.all() or not truth.any():
        return float("nan")
    return float(roc_auc_score(truth, grid.scores[seen]))
