"""Metrics in a pathologist's words: the names shown for them, and why one cannot be computed on a set of
slides (never "nan")."""

from __future__ import annotations

import math
from collections.abc import Mapping

SHOWN = {
    "accuracy": "accuracy",
    "balanced_accuracy": "balanced accuracy",
    "auc": "AUC",
    "mae": "mean absolute error",
    "pearson_r": "correlation",
    "c_index": "C-index",
}
"""The figures summaries name, in a pathologist's words (the others are in the metrics files)."""
WHY_MISSING = {
    "auc": "the {split} slides are all of one class",
    "balanced_accuracy": "the {split} slides are all of one class",
    "pearson_r": "the {split} targets (or predictions) are all the same",
    "c_index": "no two {split} cases can be ordered by their times",
}
SPLIT_WORDS = {"val": "validation", "train": "training"}


def why_missing(key: str, split: str = "val") -> str:
    """Why metric `key` of `split` ("train", "val", "test", or words for a set of slides) cannot be
    computed, in words."""
    words = SPLIT_WORDS.get(split, split)
    return WHY_MISSING.get(key, "it cannot be computed on these {split} slides").format(split=words)


def in_words(values: Mapping[str, float], split: str) -> str:
    """The SHOWN figures of `values` ("AUC 0.917, balanced accuracy 0.833"), those that cannot be computed
    left out with the reason; "no figure" when none is shown."""
    shown, missing = [], []
    for key, words in SHOWN.items():
        if key not in values:
            continue
        if math.isfinite(values[key]):
            shown.append(f"{words} {values[key]:.3f}")
        else:
            missing.append(f"{words} left out: {why_missing(key, split)}")
    text = ", ".join(shown) if shown else "no figure"
    return text + (f" ({'; '.join(missing)})" if missing else "")
