"""Peak memory of a piece of training code, on CUDA or on the CPU, split into compute and update phases.

CUDA: `torch.cuda.max_memory_allocated` above the allocation at the start (the caching allocator's own
count of live tensor bytes, cuDNN workspaces included).

CPU: `TensorBytes`, a dispatch mode that sees every aten call, adds up the storage bytes of each new
output tensor and notices freed storages through weak references before the next call. Its peak is the
largest sum of live tensor bytes created inside the block at any op boundary: what CUDA's
`memory_allocated` would count, without the allocator's rounding, kernel workspaces (im2col, cuDNN) or
fragmentation. The resident set size is no substitute: glibc keeps freed blocks and oneDNN caches.

Phases: a training step's peak is the larger of the forward/backward peak ("compute", grows with the
input) and the optimizer update's peak ("update": gradients plus the optimizer's temporaries, fixed).
`MeasuringStepper` marks the boundary each time the method asks for an optimizer step.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bigslide.errors import ConfigError
from bigslide.memory.stepper import OptimStepper

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})


def parse_size(text: str, name: str = "--gpu-mem") -> int:
    """Bytes in a size such as "16GB", "512MB", "0.5GiB" (GB = 10^9, GiB = 2^30; a bare number is GB)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match:
        raise ConfigError(f"{name}: {text!r} is not a size; write e.g. 16GB, 512MB or 0.5GiB")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _UNITS:
        raise ConfigError(
            f"{name}: unknown unit {match.group(2)!r} in {text!r}; use B, KB, MB, GB, KiB, MiB or GiB"
        )
    value = int(number * (_UNITS[unit] if unit else 1e9))
    if value <= 0:
        raise ConfigError(f"{name}: {text!r} must be more than zero bytes")
    return value


def format_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


class TensorBytes(TorchDispatchMode):
    """Live bytes of the tensors created inside the block (see the module docstring); `phase` names
    the part of the step running now and `peaks` holds each phase's peak."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.phase = "compute"
        self.peaks: dict[str, int] = {}

    def _release_dead(self) -> None:
        dead = [key for key, (ref, _) in self._live.items() if ref.expired()]
        for key in dead:
            self.current -= self._live.pop(key)[1]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self._release_dead()
        out = func(*args, **(kwargs or {}))
        # In-place ops and views return storages that existed before: only new storages count.
        inputs = {
            t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in inputs or key in self._live:
                continue
            self._live[key] = (StorageWeakRef(storage), size)
            self.current += size
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), self.current)
        return out

    def set_phase(self, phase: str) -> None:
        self._release_dead()
        self.phase = phase
        self.peaks[phase] = max(self.peaks.get(phase, 0), self.current)


@dataclass
class PhasePeaks:
    """Peak bytes above the start of the block, per phase ("compute", "update")."""

    peaks: dict[str, int] = field(default_factory=dict)

    @property
    def compute(self) -> int:
        return self.peaks.get("compute", 0)

    @property
    def update(self) -> int:
        return self.peaks.get("update", 0)

    @property
    def total(self) -> int:
        return max(self.peaks.values(), default=0)


class PeakMeter:
    """Measures phase peaks of a block on `device`; `phase(name)` switches the phase being recorded."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._tracker: TensorBytes | None = None
        self._base = 0
        self._phase = "compute"
        self.result = PhasePeaks()

    @contextlib.contextmanager
    def measure(self) -> Iterator[PhasePeaks]:
        self.result = PhasePeaks()
        self._phase = "compute"
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            try:
                yield self.result
            finally:
                self._close_cuda_phase()
            return
        self._tracker = TensorBytes()
        try:
            with self._tracker:
                yield self.result
        finally:
            self.result.peaks.update(self._tracker.peaks)
            self._tracker = None

    def phase(self, name: str) -> None:
        if self._tracker is not None:
            self._tracker.set_phase(name)
        elif self.device.type == "cuda":
            self._close_cuda_phase()
            self._phase = name
            torch.cuda.reset_peak_memory_stats(self.device)

    def _close_cuda_phase(self) -> None:
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - self._base
        self.result.peaks[self._phase] = max(self.result.peaks.get(self._phase, 0), peak)


class MeasuringStepper(OptimStepper):
    """The engine's stepper, telling a `PeakMeter` when an optimizer update starts and ends.

    `autocast_dtype` also applies on the CPU (the engine's stepper ignores it there), so a CPU calibration
    sees half-precision activations where CUDA autocast would make them.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, meter: PeakMeter, autocast_dtype: torch.dtype | None
    ) -> None:
        super().__init__(optimizer, device=meter.device)
        self.meter = meter
        self.autocast_dtype = autocast_dtype

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.meter.device.type, dtype=self.autocast_dtype)

    def step(self) -> None:
        self.meter.phase("update")
        super().step()
        self.meter.phase("compute")


def state_bytes(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes held between steps: parameters, buffers and optimizer state (shared storages counted once)."""
    seen: dict[int, int] = {}
    tensors: list[torch.Tensor] = [*module.parameters(), *module.buffers()]
    if optimizer is not None:
        tensors += [
            v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
        ]
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
