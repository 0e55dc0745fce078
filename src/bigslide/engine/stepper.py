"""The engine's side of `Stepper`: optimizer step, gradient clipping, mixed precision.

The learning-rate schedule advances once per batch in the engine, not here: methods such as PatchGD
take several optimizer steps per batch."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class OptimStepper:
    """Methods call `backward(loss)` for each partial loss and `step()` once a gradient is complete.

    `amp` ("bf16" / "fp16") only takes effect on CUDA; fp16 uses a gradient scaler.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        grad_clip: float | None = None,
        amp: str | None = None,
        device: torch.device | None = None,
        accumulate: int = 1,
        grad_sync: Callable[[list[torch.nn.Parameter]], None] | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.grad_clip = grad_clip
        self.device = device or torch.device("cpu")
        self.amp_dtype = AMP_DTYPES.get(amp or "") if self.device.type == "cuda" else None
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype is torch.float16 else None
        self.accumulate = max(1, accumulate)
        self.grad_sync = grad_sync
        self.steps = 0
        self._pending = 0

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self) -> None:
        """A complete gradient is in `.grad`: every `accumulate`-th call averages, syncs ranks and steps."""
        self._pending += 1
        if self._pending < self.accumulate:
            return
        self._pending = 0
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        if self.accumulate > 1:
            for p in params:
                if p.grad is not None:
                    p.grad /= self.accumulate
        if self.grad_sync is not None:
            self.grad_sync(params)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.grad_clip:
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], self.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
