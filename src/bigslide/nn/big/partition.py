"""Splitting a too-big (N, C, H, W) tensor into (batch, row) partitions that fit a device byte budget.

A partition is a run of whole samples (when one sample fits) or a run of rows of one sample. Layers that
read neighbouring rows (convolutions) add a halo: the extra input rows their kernel reaches into.
`DeviceMeter` records what the big layers place on the compute device, so the budget can be checked on
any machine, CPU included.

When the compute device is the host itself, a partition's input is a view of the host tensor (a copy only
where asymmetric edge padding or a dtype change needs one) and outputs are written into the host result,
so partitioning costs no transfers there. The meter still counts every partition tensor at its slice
size, as if it had been copied to a device: the budget keeps its CUDA meaning, and the same plan runs on
both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from bigslide.errors import ConfigError

Cost = Callable[[int, int], int]  # (samples, output rows) -> device bytes one partition needs


@dataclass(frozen=True)
class Partition:
    """Samples [b0, b1) and output rows [o0, o1); input rows [i0, i1) plus zero rows padded on each side."""

    b0: int
    b1: int
    o0: int
    o1: int
    i0: int
    i1: int
    pad_top: int = 0
    pad_bottom: int = 0


@dataclass
class DeviceMeter:
    """Largest tensor and largest set of live tensors a big layer placed on the compute device."""

    max_tensor_bytes: int = 0
    max_partition_bytes: int = 0
    partitions: int = 0

    def record(self, tensors: list[torch.Tensor | None]) -> None:
        sizes = [t.numel() * t.element_size() for t in tensors if t is not None]
        self.max_tensor_bytes = max(self.max_tensor_bytes, *sizes, 0)
        self.max_partition_bytes = max(self.max_partition_bytes, sum(sizes))
        self.partitions += 1


_ACTIVE_METERS: list[DeviceMeter] = []


@contextlib.contextmanager
def track_device_memory() -> Iterator[DeviceMeter]:
    """Within the block, every partition a big layer runs (forward and backward) is recorded."""
    meter = DeviceMeter()
    _ACTIVE_METERS.append(meter)
    try:
        yield meter
    finally:
        _ACTIVE_METERS.remove(meter)


def record_on_device(tensors: list[torch.Tensor | None]) -> None:
    """Called by the big layers with the tensors one partition holds on the compute device at once."""
    for meter in _ACTIVE_METERS:
        meter.record(tensors)


def conv_input_rows(o0: int, o1: int, stride: int, padding: int, reach: int, height: int) -> tuple[int, ...]:
    """Input rows (i0, i1, pad_top, pad_bottom) that output rows [o0, o1) read; `reach` = dilation·(k−1)."""
    start = o0 * stride - padding
    stop = (o1 - 1) * stride + reach + 1 - padding
    i0, i1 = max(start, 0), min(stop, height)
    return i0, i1, i0 - start, stop - i1


def _largest_fitting(limit: int, fits: Callable[[int], bool]) -> int:
    """Largest n in [0, limit] with fits(n), for a monotone `fits`."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_partitions(
    samples: int,
    out_rows: int,
    cost: Cost,
    budget_bytes: int,
    *,
    what: str,
    input_rows: Callable[[int, int], tuple[int, ...]] | None = None,
) -> list[Partition]:
    """Cover `samples` × `out_rows` with partitions whose `cost` is within `budget_bytes`.

    Whole samples are grouped when one sample fits, otherwise each sample is cut into row runs. The
    cost is the worst case for a run length (a full halo), so edge runs with clipped halos also fit.
    `input_rows(o0, o1)` gives the input rows of an output run (defaults to the same rows, no halo).
    """
    rows_of = input_rows or (lambda o0, o1: (o0, o1, 0, 0))
    if cost(1, out_rows) <= budget_bytes:
        per_chunk = _largest_fitting(samples, lambda n: cost(n, out_rows) <= budget_bytes)
        runs = [(b, min(b + per_chunk, samples), 0, out_rows) for b in range(0, samples, per_chunk)]
    else:
        per_run = _largest_fitting(out_rows, lambda r: cost(1, r) <= budget_bytes)
        if per_run == 0:
            raise ConfigError(
                f"budget_mb: the device budget ({budget_bytes / 2**20:.3g} MiB) is too small for {what}: "
                f"one output row needs {cost(1, 1) / 2**20:.3g} MiB on the device"
            )
        runs = [
            (b, b + 1, o, min(o + per_run, out_rows))
            for b in range(samples)
            for o in range(0, out_rows, per_run)
        ]
    return [Partition(b0, b1, o0, o1, *rows_of(o0, o1)) for b0, b1, o0, o1 in runs]


def to_compute(
    x: torch.Tensor, device: torch.device, dtype: torch.dtype, part: Partition, pad_rows: bool = True
) -> torch.Tensor:
    """The partition's input rows (zero-padded when `pad_rows`) on the compute device in `dtype`.

    On the host in the same dtype and without padding this is a view (no copy).
    """
    piece = x[part.b0 : part.b1, :, part.i0 : part.i1]
    if pad_rows and (part.pad_top or part.pad_bottom):
        piece = torch.nn.functional.pad(piece, (0, 0, part.pad_top, part.pad_bottom))
    return piece.to(device=device, dtype=dtype, non_blocking=piece.is_pinned())


def to_host(x: torch.Tensor) -> torch.Tensor:
    """A big layer's input in host memory, where it keeps its activations."""
    return x if x.device.type == "cpu" else x.cpu()


def to_source(y: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A big layer's host output on `device`, where its input came from: the layer is a drop-in for the
    native one (a device input gives a device output), while inside a big stack, whose inputs are host
    tensors, every output stays on the host."""
    return y if device.type == "cpu" else y.to(device, non_blocking=y.is_pinned())


def host_empty(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, zero: bool = False
) -> torch.Tensor:
    """A host buffer for activations or gradients; pinned when the compute device is CUDA."""
    pin = device.type == "cuda"
    make = torch.zeros if zero else torch.empty
    return make(shape, dtype=dtype, device="cpu", pin_memory=pin)
