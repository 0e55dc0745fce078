"""Splitting a too-big (N, C, H, W) tensor into (batch, row) partitions that fit a device byte budget.

A partition is a run of whole samples (when one sample fits) or a run of rows of one sample. Layers that
read neighbouring rows (convolutions) add a halo: the extra input rows their kernel reaches into.
`DeviceMeter` records what the big layers place on the compute device, so the budget can be checked on
any machine, CPU included.

When the compute device is the host itself, a partition's input is a view of the host tensor (a copy only
where asymmetric edge padding or a dtype change needs one) and outputs are written into the host result,
so partitioning costs no transfers there. The meter still counts every partition tensor at its slice
size, as if it had been copied to a device: the budget keeps its CUDA meaning, and the same plan runs on
both. On CUDA, host activations live in pinned memory and `Transfers` overlaps the copies in and out
with compute; host activations in channels-last memory (the layout of a channels-last encoder's input)
make each row partition one contiguous block, copied directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

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

    On the host in the same dtype and without padding this is a view (no copy). To a device the rows
    are copied as they lie, without the host waiting (from a pinned tensor in channels-last memory the
    rows of a partition are one block: one direct copy), and converted and padded there.
    """
    piece = x[part.b0 : part.b1, :, part.i0 : part.i1]
    pad = pad_rows and (part.pad_top or part.pad_bottom)
    if device.type == "cpu" and pad:
        piece = F.pad(piece, (0, 0, part.pad_top, part.pad_bottom))
    piece = to_compute_rows(piece, device, dtype)
    return F.pad(piece, (0, 0, part.pad_top, part.pad_bottom)) if pad and device.type != "cpu" else piece


def to_compute_rows(rows: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Rows of a host tensor on the compute device in `dtype`; to CUDA without the host waiting."""
    return rows.to(device=device, dtype=dtype, non_blocking=device.type == "cuda")


def to_host(x: torch.Tensor) -> torch.Tensor:
    """A big layer's input in host memory, where it keeps its activations."""
    return x if x.device.type == "cpu" else x.cpu()


def to_source(y: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A big layer's host output on `device`, where its input came from: the layer is a drop-in for the
    native one (a device input gives a device output), while inside a big stack, whose inputs are host
    tensors, every output stays on the host."""
    return y if device.type == "cpu" else y.to(device, non_blocking=y.is_pinned())


def is_nhwc(x: torch.Tensor) -> bool:
    """Whether a 4-D tensor lies in channels-last memory (and not also in the standard layout)."""
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def host_empty(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, like: torch.Tensor | None = None
) -> torch.Tensor:
    """A host buffer for activations or gradients, in the memory layout of `like` (when given): pinned
    when the compute device is CUDA, so copies to and from it run without the host waiting."""
    layout = torch.channels_last if like is not None and is_nhwc(like) else torch.contiguous_format
    return torch.empty(
        shape, dtype=dtype, device="cpu", pin_memory=device.type == "cuda", memory_format=layout
    )


def partition_budget(budget_bytes: int, device: torch.device) -> int:
    """What one partition may use of a big layer's device budget: on CUDA two partitions are on the
    device at once (`Transfers`: one computing, the next arriving), so each gets half."""
    return budget_bytes // 2 if device.type == "cuda" else budget_bytes


Load = Callable[[Partition], tuple[torch.Tensor, ...]]


class Transfers:
    """One big layer's traffic between host and device, over a pass of its partitions.

    On CUDA, each partition's inputs are copied in on a side stream one partition ahead, while the
    compute stream works on the previous partition; results are copied out to pinned host memory on
    another side stream once the compute stream has made them; events order the three, so copies in
    both directions overlap compute. The host waits once, in `finish`, before it reads the results.
    On the host every load and store happens at once, in order.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.compute = torch.cuda.current_stream(device)
            self.inbound = torch.cuda.Stream(device)
            self.outbound = torch.cuda.Stream(device)
        self.stored = False
        self.adds: list[tuple[torch.Tensor, torch.Tensor]] = []  # (host target, pinned copy) for `finish`

    def loaded(
        self, parts: list[Partition], load: Load
    ) -> Iterator[tuple[Partition, tuple[torch.Tensor, ...]]]:
        """Each partition with `load(partition)`: its tensors on the device, ready on the compute stream."""
        if not self.cuda:
            for part in parts:
                yield part, load(part)
            return

        def issue(part: Partition) -> tuple[tuple[torch.Tensor, ...], torch.cuda.Event]:
            with torch.cuda.stream(self.inbound):
                tensors = load(part)
            return tensors, self.inbound.record_event()

        ahead = issue(parts[0]) if parts else None
        for index, part in enumerate(parts):
            assert ahead is not None
            tensors, ready = ahead
            ahead = issue(parts[index + 1]) if index + 1 < len(parts) else None
            self.compute.wait_event(ready)
            for t in tensors:  # made on the inbound stream: freed only after the compute stream's use
                t.record_stream(self.compute)
            yield part, tensors

    def store(self, target: torch.Tensor, value: torch.Tensor, *, add: bool = False) -> None:
        """Host `target` = device `value` (+= with `add`), once the work queued so far on the compute stream
        has made `value`; on CUDA without the host waiting (sums land in `finish`)."""
        if not self.cuda:
            if add:
                target += value.to(target.device, target.dtype)
            else:
                target.copy_(value)
            return
        self.stored = True
        # Converted here, on the compute stream: a copy that also converts goes through a pageable buffer.
        value = value.to(target.dtype)
        self.outbound.wait_stream(self.compute)
        value.record_stream(self.outbound)
        with torch.cuda.stream(self.outbound):
            if add:
                staged = host_empty(tuple(value.shape), value.dtype, self.device, like=value)
                staged.copy_(value, non_blocking=True)
                self.adds.append((target, staged))
            else:
                target.copy_(value, non_blocking=True)

    def finish(self) -> None:
        """The stored results are on the host (the host waits for the outbound copies here, once)."""
        if self.stored:
            self.outbound.synchronize()
        for target, staged in self.adds:
            target += staged.to(target.dtype)
        self.adds.clear()
