"""What a trained checkpoint says of one slide (`SlidePrediction`: its class probabilities, risk or value in
words, and its heatmaps), or why it says nothing (`SlideFailure`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.data.endpoint import Endpoint
from bigslide.engine.decision import Decision
from bigslide.explain.heatmap import ScoreGrid


@dataclass
class SlidePrediction:
    slide: Path
    probs: np.ndarray
    classes: list[str]
    grids: dict[str, ScoreGrid]
    titles: dict[str, str] = field(default_factory=dict)  # heatmap name -> title, from the method
    epochs: int = 0  # epochs the checkpoint's weights were trained for
    endpoint: Endpoint | None = None  # None: classification into `classes`
    case: str | None = None  # the case the slide is part of: its prediction is the case's
    # survival: the risks of the run's last validation (else training) cases, that a risk is read against
    risk_reference: dict[str, Any] | None = None
    thinned: int = 1  # a preview: one tile in thinned x thinned was read, its score drawn over the block
    decision: Decision | None = None  # how a class is called (None: the most probable)
    read_mpp: float | None = None  # the µm/px the model read the slide at (None: a pyramid level)

    @property
    def task(self) -> str:
        return self.endpoint.task if self.endpoint is not None else "classification"

    @property
    def risk(self) -> float:
        """Survival: the predicted risk (higher = earlier event)."""
        assert self.endpoint is not None
        return float(self.endpoint.risk(self.probs)[0])

    def context(self) -> str:
        """Where a survival risk or a regression estimate falls among the training cohort's, in words
        ('' for classes): a risk has no unit of its own."""
        if self.task == "survival":
            risks = np.asarray((self.risk_reference or {}).get("risks", []), dtype=float)
            if not risks.size:
                return "higher = earlier event"
            below = float(np.mean(risks < self.risk))
            group = "high" if self.risk > float(np.median(risks)) else "low"
            split = (self.risk_reference or {}).get("split", "reference")
            return (
                f"higher than {below:.0%} of the {risks.size} {split} cases' risks: {group}-risk group "
                "(split at their median); higher = earlier event"
            )
        if self.task == "regression" and self.endpoint is not None and self.endpoint.sd:
            value = float(self.probs[0])
            sds = (value - self.endpoint.mean) / self.endpoint.sd
            return (
                f"the training targets' mean is {self.endpoint.mean:.4g} (sd {self.endpoint.sd:.3g}): "
                f"{abs(sds):.1f} sd {'above' if sds >= 0 else 'below'} it, in the table's units"
            )
        return ""

    @property
    def label(self) -> str:
        """The prediction in words: the class, the number, or the risk."""
        if self.task == "regression":
            return f"{float(self.probs[0]):.4g}"
        if self.task == "survival":
            return f"risk {self.risk:.3g}"
        if self.decision is not None:
            return self.classes[int(self.decision.classes(np.atleast_2d(self.probs))[0])]
        return self.classes[int(np.argmax(self.probs))]


@dataclass
class SlideFailure:
    """A slide that has no prediction: the file would not open or decode, or the model failed on it."""

    slide: Path
    error: str  # one line
