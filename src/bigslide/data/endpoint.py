"""What a model predicts for a slide or case (its endpoint) and how a table row becomes its target.

classification: a class (cross-entropy; outputs are class probabilities).
regression: a number (squared error on the target standardised by the training set's mean and sd;
  the output is the number in the table's units).
survival: time to event with censoring. "nll" is the discrete-time likelihood (Zadeh & Schmid 2021, as
  in PORPOISE/MCAT): the model gives one hazard logit per time interval, cut at quantiles of the training
  set's event times; outputs are the survival probabilities S(t_k), risk = -sum_k S(t_k). "cox" is the
  partial likelihood over a batch; the model gives one log-hazard, which is the risk.
Higher risk always means an earlier event.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bigslide.data.table import SlideEntry, SlideTable
from bigslide.errors import DataError
from bigslide.tiling.annotations import instance_classes

Target = int | float | tuple[float, float, float]
"""A sample's target: the class index, the number, or (time, event, interval index)."""


@dataclass
class Endpoint:
    task: str = "classification"
    classes: list[str] = field(default_factory=list)
    survival_loss: str = "nll"
    bins: list[float] = field(default_factory=list)  # survival nll: inner edges of the time intervals
    mean: float = 0.0  # regression: the training targets' mean and sd
    sd: float = 1.0

    @property
    def n_outputs(self) -> int:
        if self.task == "classification":
            return len(self.classes)
        if self.task == "survival" and self.survival_loss == "nll":
            return len(self.bins) + 1
        return 1

    @property
    def instance_classes(self) -> list[str]:
        """The classes a teaching annotation may have: the task's classes (or "Lesion" for a task without
        classes), then "Not lesion"."""
        return instance_classes(self.classes if self.task == "classification" else [])

    @property
    def output_names(self) -> list[str]:
        """Column names of the outputs in predictions.csv."""
        if self.task == "classification":
            return [f"p_{c}" for c in self.classes]
        if self.task == "survival" and self.survival_loss == "nll":
            ends = [*(f"{b:g}" for b in self.bins), "end"]
            return [f"survival_{e}" for e in ends]
        return []

    def target(self, entry: SlideEntry) -> Target:
        """The row's target as datasets hand it to methods."""
        if self.task == "classification":
            try:
                return self.classes.index(entry.label)
            except ValueError:
                raise DataError(f"{entry.path}: label {entry.label!r} is not one of {self.classes}") from None
        # a row without its values (a slide to predict) gets NaN: the table reader refuses them for training
        if self.task == "regression":
            return math.nan if entry.target is None else float(entry.target)
        if entry.time is None or entry.event is None:
            return (math.nan, math.nan, 0.0)
        interval = int(np.searchsorted(np.asarray(self.bins), entry.time, side="left"))
        return (float(entry.time), float(entry.event), float(interval))

    def risk(self, outputs: np.ndarray) -> np.ndarray:
        """Survival: (n,) risk from (n, K) outputs; higher = earlier event."""
        outputs = np.atleast_2d(outputs)
        if self.survival_loss == "nll":
            return -outputs.sum(axis=1)
        return outputs[:, 0]

    def state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any] | None, classes: list[str]) -> Endpoint:
        """From a checkpoint; checkpoints written before endpoints are classification by `classes`."""
        return cls(**state) if state else cls(classes=list(classes))


def fit_endpoint(table: SlideTable, *, survival_loss: str = "nll", time_bins: int = 4) -> Endpoint:
    """The endpoint of `table`'s task, with what it learns from the training rows: the classes, the
    time intervals (quantiles of event times, as PORPOISE) or the targets' mean and sd."""
    train = [e for e in table.entries if e.split in (None, "train")] or table.entries
    if table.task == "classification":
        return Endpoint(classes=list(table.classes))
    if table.task == "regression":
        values = np.array([e.target for e in train], dtype=np.float64)
        sd = float(values.std()) if len(values) > 1 else 1.0
        return Endpoint("regression", mean=float(values.mean()), sd=sd if sd > 0 else 1.0)
    events = np.array([e.time for e in train if e.event == 1], dtype=np.float64)
    if survival_loss == "cox":
        bins: list[float] = []
    elif len(events) == 0:
        raise DataError("data.task survival: no training slide has an observed event (event 1)")
    else:
        inner = np.quantile(events, np.arange(1, time_bins) / time_bins)
        bins = sorted({float(b) for b in inner})
    return Endpoint("survival", survival_loss=survival_loss, bins=bins)
