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
        self.scaler = make_scaler(self.device, amp)
        self.accumulate = max(1, accumulate)
        self.grad_sync = grad_sync
        self.steps = 0
        self._pending = 0

    def state_dict(self) -> dict[str, Any]:
        """What an exact resume needs between batches: the accumulation count, the partly accumulated
        gradients (in optimizer parameter order) and the gradient scaler."""
        return {
            "steps": self.steps,
            "pending": self._pending,
            "grads": [p.grad.detach().cpu().clone() if p.grad is not None else None for p in self._params()],
            "scaler": self.scaler.state_dict() if self.scaler else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self._pending = int(state["pending"])
        params = self._params()
        grads = state["grads"]
        if len(grads) != len(params):
            raise ValueError(f"stepper state has {len(grads)} gradients for {len(params)} parameters")
        for p, g in zip(params, grads, strict=True):
            p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

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
        params = self._params()
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


def make_scaler(device: torch.device, amp: str | None) -> torch.amp.GradScaler | None:
    """fp16's gradient scaler on CUDA (a function so that tests can give the CPU one)."""
    return torch.amp.GradScaler("cuda") if amp == "fp16" and device.type == "cuda" else None
