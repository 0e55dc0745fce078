"""What a training run says about itself: what it predicts, and what to change when it cannot go on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bigslide.data.endpoint import Endpoint
from bigslide.engine.config import TrainConfig
from bigslide.methods.base import Method


def predicts(endpoint: Endpoint) -> str:
    """What a run predicts, in words (its first message)."""
    if endpoint.task == "classification":
        return f"classes {', '.join(endpoint.classes)}"
    if endpoint.task == "regression":
        return f"regression (target mean {endpoint.mean:.3g}, sd {endpoint.sd:.3g})"
    if endpoint.survival_loss == "cox":
        return "survival (Cox partial likelihood)"
    cuts = ", ".join(f"{b:.3g}" for b in endpoint.bins)
    return f"survival ({len(endpoint.bins) + 1} time intervals, cut at {cuts})"


def out_of_memory(config: TrainConfig, method: Method, step: int, ckpt: Path) -> str:
    """Name the settings that bound this method's memory, with smaller values to try."""
    knobs = method.memory_knobs(dataclasses.asdict(config.data))
    tries = ", ".join(f"{key}={_half(value)} (now {value})" for key, value in knobs.items() if value)
    kept = f"; the last good checkpoint is {ckpt}" if ckpt.is_file() else ""
    amp = " or run.amp=bf16" if config.run.amp == "none" else ""
    return f"out of memory at step {step} ({method.name} on {method.device}): try {tries}{amp}{kept}"


def _half(value: float) -> float:
    return max(1, int(value) // 2) if isinstance(value, int) else value / 2
