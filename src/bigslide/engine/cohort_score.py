"""How a cohort's predictions score against the labels its slide table gives: the figures a run reports on
its test split, per case, with classes called by the checkpoint's decision, so that a model can be checked
on another lab's or another year's slides with `bigslide predict` alone.

A case is scored when the table gives the task's values for it (a label; a time and an event; a target)
and every one of its slides was predicted; cases without them are counted, not scored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.data.endpoint import Endpoint
from bigslide.data.table import SlideTable
from bigslide.engine.decision import Decision
from bigslide.engine.metric_words import in_words
from bigslide.engine.metrics import endpoint_metrics
from bigslide.engine.slide_prediction import SlideFailure, SlidePrediction
from bigslide.files import atomic_write_text
from bigslide.words import counted

FILE_NAME = "cohort_metrics.json"
"""Where `bigslide predict` writes a labelled cohort's score, beside predictions.csv."""


@dataclass(frozen=True)
class CohortScore:
    """The figures of the `cases` scored (`metrics` as `endpoint_metrics` gives them, NaN where a figure
    cannot be computed); `unlabelled` and `failed` cases were predicted without a label, or not at all.
    Classification: `labelled` cases per class and `confusion[i][j]`, the cases of class i called j (by
    `decision`, in words)."""

    task: str
    cases: int
    metrics: dict[str, float]
    unlabelled: int = 0
    failed: int = 0
    classes: list[str] = field(default_factory=list)
    labelled: dict[str, int] = field(default_factory=dict)
    confusion: list[list[int]] = field(default_factory=list)
    decision: str = ""
    unit: str = "case"  # "slide" where every case is one slide

    def lines(self) -> list[str]:
        """What the score says, in words: the figures, then how each class was called."""
        left = [
            f"{counted(n, self.unit)} {why}"
            for n, why in ((self.unlabelled, "without a label"), (self.failed, "not predicted"))
            if n
        ]
        head = f"scored against the table: {counted(self.cases, self.unit)}" + (
            f" ({', '.join(left)}, not scored)" if left else ""
        )
        lines = [f"{head}: {in_words(self.metrics, 'labelled')}"]
        if self.confusion:
            lines.append(self._called())
        return lines

    def _called(self) -> str:
        """How many cases of each class were called that class ('5 of 6 tumor cases called tumor')."""
        parts = []
        for i, name in enumerate(self.classes):
            total = sum(self.confusion[i])
            if total:
                parts.append(
                    f"{self.confusion[i][i]} of {counted(total, f'{name} {self.unit}')} called {name}"
                )
        return f"called by {self.decision}: " + ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["metrics"] = {k: (v if math.isfinite(v) else None) for k, v in self.metrics.items()}
        return out

    def write(self, folder: Path) -> Path:
        """`cohort_metrics.json` in `folder` (written whole or not at all); a figure that cannot be
        computed is null."""
        return atomic_write_text(folder / FILE_NAME, json.dumps(self.as_dict(), indent=2) + "\n")


def _calling(decision: Decision | None, classes: list[str]) -> str:
    """How classes were called, in a few words."""
    if decision is None or decision.source == "argmax" or len(classes) != 2:
        return "the most probable class"
    return f"P({classes[1]}) >= {decision.threshold:.4g}"


def score_cohort(
    table: SlideTable,
    results: Sequence[SlidePrediction | SlideFailure],
    endpoint: Endpoint | None = None,
    decision: Decision | None = None,
) -> CohortScore | None:
    """The score of `results` (one per slide predicted, e.g. `predict_slides`') against `table`'s labels,
    per case; None when the table labels none of the predicted cases. `endpoint` and `decision` default to
    the predictions' own (the checkpoint's)."""
    made = [r for r in results if isinstance(r, SlidePrediction)]
    if endpoint is None:
        endpoint = next((p.endpoint for p in made if p.endpoint is not None), None)
        endpoint = endpoint or Endpoint(classes=made[0].classes if made else [])
    if decision is None:
        decision = next((p.decision for p in made if p.decision is not None), None)
    by_slide = {Path(r.slide): r for r in results}
    targets, outputs = [], []
    unlabelled = failed = 0
    for rows in table.cases().values():
        entries = [table.entries[i] for i in rows]
        got = [by_slide.get(Path(e.path)) for e in entries]
        if any(g is None for g in got):
            continue  # not reached (a run stopped, or another rank's)
        if any(isinstance(g, SlideFailure) for g in got):
            failed += 1
        elif not entries[0].labelled(endpoint.task):
            unlabelled += 1
        else:
            first = got[0]
            assert isinstance(first, SlidePrediction)
            targets.append(endpoint.target(entries[0]))
            outputs.append(np.atleast_1d(np.asarray(first.probs, dtype=np.float64)))
    if not targets:
        return None
    y, probs = np.asarray(targets), np.stack(outputs)
    metrics = endpoint_metrics(endpoint, y, probs, decision)
    classes, counts, confusion, words = list(endpoint.classes), {}, [], ""
    if endpoint.task == "classification":
        called = decision.classes(probs) if decision is not None else probs.argmax(axis=1)
        matrix = np.zeros((len(classes), len(classes)), np.int64)
        np.add.at(matrix, (y.astype(np.int64), called), 1)
        confusion = matrix.tolist()
        counts = {c: int(matrix[i].sum()) for i, c in enumerate(classes)}
        words = _calling(decision, classes)
    return CohortScore(
        endpoint.task,
        len(targets),
        {k: float(v) for k, v in metrics.items() if k != "threshold"},
        unlabelled,
        failed,
        classes,
        counts,
        confusion,
        words,
        "case" if any(e.case is not None for e in table.entries) else "slide",
    )
