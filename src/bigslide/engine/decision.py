"""The decision threshold of a two-class model: chosen on the validation split, kept in the checkpoint,
and used wherever a slide is called one class or the other (`bigslide predict`, napari, test metrics).

A model can rank every slide right (AUC 1.0) and still call them all one class at 0.5: after a few
epochs, or on slides of another lab, its probabilities sit on one side of 0.5. The threshold that
maximises balanced accuracy on the validation slides (the same as Youden's J, TPR + TNR - 1) is the
decision the model was checked against; where several thresholds tie, the middle of the widest tied
interval of probabilities is taken, as far as possible from any validation slide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_THRESHOLD = 0.5


@dataclass(frozen=True)
class Decision:
    """Call a slide `classes[1]` when its probability of it is >= `threshold`. `source`: "validation"
    (chosen there, with `balanced_accuracy` on those slides), "default" (0.5: no validation split with
    both classes), or "argmax" (more than two classes: the most probable one)."""

    threshold: float = DEFAULT_THRESHOLD
    source: str = "default"
    balanced_accuracy: float = math.nan
    epoch: int = -1  # the epoch whose validation chose it

    def classes(self, probs: np.ndarray) -> np.ndarray:
        """Class index per row of `probs` (n, K)."""
        probs = np.asarray(probs, dtype=np.float64)
        if probs.shape[1] != 2 or self.source == "argmax":
            return probs.argmax(axis=1)
        return (probs[:, 1] >= self.threshold).astype(np.int64)

    def describe(self, classes: list[str] | None = None) -> str:
        """One line: what decides a slide's class."""
        if self.source == "argmax":
            return "decision: the most probable class"
        name = f"P({classes[1]})" if classes and len(classes) == 2 else "P(class 1)"
        if self.source == "validation":
            return (
                f"decision: {name} >= {self.threshold:.4g}, chosen on the validation split "
                f"(balanced accuracy {self.balanced_accuracy:.3f}, epoch {self.epoch + 1})"
            )
        return f"decision: {name} >= {self.threshold:.4g} (default; no validation split with both classes)"

    def state(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "source": self.source,
            "balanced_accuracy": self.balanced_accuracy,
            "epoch": self.epoch,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any] | None, n_classes: int = 2) -> Decision:
        """The checkpoint's decision; a checkpoint without one calls at 0.5 (or argmax)."""
        if not state:
            return cls(source="argmax") if n_classes != 2 else cls()
        return cls(
            float(state["threshold"]),
            str(state["source"]),
            float(state.get("balanced_accuracy", math.nan)),
            int(state.get("epoch", -1)),
        )


def choose_threshold(labels: np.ndarray, probs: np.ndarray, *, epoch: int = -1) -> Decision:
    """The threshold on P(class 1) that maximises balanced accuracy on (`labels`, `probs` (n, K))."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] != 2:
        return Decision(source="argmax")
    y = np.asarray(labels, dtype=np.int64)
    score = probs[:, 1]
    if len(np.unique(y)) < 2:
        return Decision()
    values = np.unique(score)
    # every distinct cut: below all, between neighbours, above all
    cuts = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2, [values[-1] + 1.0]])
    positive = score[None, :] >= cuts[:, None]
    tpr = (positive & (y == 1)).sum(axis=1) / (y == 1).sum()
    tnr = (~positive & (y == 0)).sum(axis=1) / (y == 0).sum()
    balanced = (tpr + tnr) / 2
    best = balanced.max()
    # the widest run of tied cuts (cut k separates values[k-1] and values[k]); its interval's middle
    tied = np.flatnonzero(np.isclose(balanced, best))
    runs = np.split(tied, np.flatnonzero(np.diff(tied) > 1) + 1)
    edges = np.concatenate([[0.0], values, [1.0]])
    widest = max(runs, key=lambda run: edges[run[-1] + 1] - edges[run[0]])
    threshold = float((edges[widest[0]] + edges[widest[-1] + 1]) / 2)
    return Decision(threshold, "validation", float(best), epoch)
