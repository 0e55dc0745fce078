"""Plain event records yielded by a training run; the CLI prints them, the GUI plots them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Progress:
    step: int  # optimizer-independent: samples (bags / image batches) processed so far
    total: int
    epoch: int


@dataclass(frozen=True)
class Loss:
    step: int
    value: float


@dataclass(frozen=True)
class Metrics:
    epoch: int
    split: str  # "train" | "val"
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointSaved:
    path: str
    step: int


@dataclass(frozen=True)
class Message:
    text: str
    left_out: tuple[str, ...] = ()  # the slides a message says were left out (data.skip_bad_slides)


Event = Progress | Loss | Metrics | CheckpointSaved | Message
