"""`BigBatchNorm2d`: BatchNorm over a host tensor with exact whole-tensor statistics.

Training forward makes two passes over partitions: the first merges per-partition (count, mean, M2)
with Chan's parallel form of Welford's update, the second normalises. Running statistics are updated
once per call exactly like `nn.BatchNorm2d` (unbiased variance, momentum or cumulative average). The
backward pass needs two global reductions (Σ∇y and Σ∇y·(x−μ)), also gathered over partitions first.
Both passes centre each partition on the global mean before multiplying, as native BatchNorm does, so
float32 keeps native's accuracy when |μ| ≫ σ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from bigslide.nn.big.partition import (
    Partition,
    Transfers,
    host_empty,
    is_nhwc,
    partition_budget,
    plan_partitions,
    record_on_device,
    to_compute,
    to_compute_rows,
    to_host,
    to_source,
)

_DIMS = (0, 2)  # of the (N, C, H·W) view: every dimension but the channel


def _flat(t: torch.Tensor) -> torch.Tensor:
    """(N, C, H·W) view: reductions over a contiguous last dimension are much faster than over (0, 2, 3)."""
    return t.reshape(t.shape[0], t.shape[1], -1)


@dataclass(frozen=True)
class NormSetup:
    use_batch_stats: bool
    update_running: bool
    momentum: float | None
    eps: float
    budget_bytes: int
    name: str


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def plan_norm(
    x_shape: torch.Size, dtype: torch.dtype, setup: NormSetup, device: torch.device
) -> list[Partition]:
    n, c, h, w = x_shape
    item = torch.empty((), dtype=_acc_dtype(dtype)).element_size()

    def cost(samples: int, rows: int) -> int:
        # Backward holds x, ∇y and ∇x of the partition, plus a few per-channel vectors.
        return 3 * samples * c * rows * w * item + 8 * c * item

    return plan_partitions(n, h, cost, partition_budget(setup.budget_bytes, device), what=setup.name)


def _channel(v: torch.Tensor) -> torch.Tensor:
    return v.view(1, -1, 1, 1)


def _moments(xp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and biased variance of one partition."""
    if xp.device.type == "cpu":
        # BatchNorm's own two-pass statistics kernel: several times faster than var_mean on the host,
        # also on strided row views, and just as exact.
        mean, var = torch.batch_norm_update_stats(xp, None, None, 0.0)
        return mean, var
    if is_nhwc(xp):  # channels last: (N·H·W, C) is a view, reduced along its rows
        var, mean = torch.var_mean(xp.permute(0, 2, 3, 1).reshape(-1, xp.shape[1]), dim=0, correction=0)
    else:
        var, mean = torch.var_mean(_flat(xp), dim=_DIMS, correction=0)
    return mean, var


def batch_moments(
    x: torch.Tensor, device: torch.device, parts: list[Partition]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-channel mean and biased variance over (N, H, W), merged across partitions (Chan et al.).

    Rounded like native BatchNorm's when |μ| ≫ σ (the centred backward inherits the mean's error): a
    partition mean far from zero rounds at the scale of |μ|, too coarse for the merge. Such channels
    are measured about a shift s, the first partition's mean (x − s is an exact float subtraction near
    s), at the cost of a temporary and one more pass per partition, and on the host only then (on a
    device always, with s = 0 where no shift is needed, so the host never waits for the decision). The
    merge runs in float64 and rounds once.
    """
    acc = _acc_dtype(x.dtype)
    shift = torch.zeros(x.shape[1], dtype=acc, device=device)
    shifting = False  # decided on the first partition
    counts: list[int] = []
    means: list[torch.Tensor] = []
    variances: list[torch.Tensor] = []
    loaded = Transfers(device).loaded(parts, lambda p: (to_compute(x, device, acc, p),))
    for index, (_, (xp,)) in enumerate(loaded):
        if index == 0 or not shifting:
            mean_p, var_p = _moments(xp)
            record_on_device([xp, mean_p, var_p])
        if index == 0:
            shift = torch.where(mean_p.abs() > 4 * var_p.sqrt(), mean_p, 0.0)
            # On a device, reading the decision would make the host wait for the stream once per layer:
            # there every partition is measured about the shift, 0 where none is needed (x − 0 is x).
            shifting = device.type != "cpu" or bool(shift.any())
        if shifting:
            shifted = xp - _channel(shift)
            record_on_device([xp, shifted, mean_p, var_p])
            mean_p, var_p = _moments(shifted)
        counts.append(xp.numel() // xp.shape[1])
        means.append(mean_p)
        variances.append(var_p)
    # Chan's merge of every partition at once: M2 = Σ n_p·var_p + Σ n_p·(mean_p − mean)².
    count = sum(counts)
    # a few numbers: staged by the driver without the host waiting for the stream
    n = torch.tensor(counts, dtype=torch.float64).to(device, non_blocking=True).unsqueeze(1)
    part_means, part_vars = torch.stack(means).double(), torch.stack(variances).double()
    mean = (n * part_means).sum(0) / count
    m2 = (n * part_vars).sum(0) + (n * (part_means - mean).square()).sum(0)
    return (mean + shift).to(acc), (m2 / count).to(acc), count


class _BigBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        setup: NormSetup,
    ) -> torch.Tensor:
        device = next((t.device for t in (weight, running_mean) if t is not None), torch.device("cpu"))
        acc = _acc_dtype(x.dtype)
        parts = plan_norm(x.shape, x.dtype, setup, device)
        if setup.use_batch_stats:
            mean, var, count = batch_moments(x, device, parts)
            if count <= 1:
                raise ValueError(
                    f"Expected more than 1 value per channel when training, got input size {x.shape}"
                )
            if setup.update_running and running_mean is not None and running_var is not None:
                factor = setup.momentum if setup.momentum is not None else 0.0
                running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
                unbiased = var * (count / (count - 1))
                running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        else:
            assert running_mean is not None
            assert running_var is not None
            mean, var = running_mean.to(acc), running_var.to(acc)
        invstd = torch.rsqrt(var + setup.eps)
        scale = invstd * weight.to(acc) if weight is not None else invstd
        shift = bias.to(acc) - mean * scale if bias is not None else -mean * scale
        single = len(parts) == 1 and device.type == "cpu"
        y = None if single else host_empty(tuple(x.shape), x.dtype, device, like=x)
        in_place = device.type == "cpu" and acc == x.dtype
        transfers = Transfers(device)
        for part, (xp,) in transfers.loaded(parts, lambda p: (to_compute(x, device, acc, p),)):
            if y is None:
                y = torch.addcmul(_channel(shift), xp, _channel(scale)).to(x.dtype)
                record_on_device([xp, y, mean, invstd, scale, shift])
            elif in_place:
                # The host is the compute device: write the partition where it belongs, no extra copy.
                yp = y[part.b0 : part.b1, :, part.o0 : part.o1]
                torch.addcmul(_channel(shift), xp, _channel(scale), out=yp)
                record_on_device([xp, yp, mean, invstd, scale, shift])
            else:
                yp = torch.addcmul(_channel(shift), xp, _channel(scale))
                record_on_device([xp, yp, mean, invstd, scale, shift])
                transfers.store(y[part.b0 : part.b1, :, part.o0 : part.o1], yp)
        transfers.finish()
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.setup = setup
        assert y is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, invstd = ctx.saved_tensors
        setup: NormSetup = ctx.setup
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        device, acc = mean.device, mean.dtype
        parts = plan_norm(x.shape, x.dtype, setup, device)
        gain = invstd * weight.to(acc) if weight is not None else invstd
        transfers = Transfers(device)

        def grad_rows(part: Partition) -> torch.Tensor:
            return to_compute_rows(grad_y[part.b0 : part.b1, :, part.o0 : part.o1], device, acc)

        # Partition sums add up in float64: with many partitions, float32 running totals would drift.
        sum_gy = torch.zeros_like(mean, dtype=torch.float64)
        sum_gy_xmu = torch.zeros_like(sum_gy)
        # Batch statistics make every ∇x depend on the two global sums: gather them first.
        gather_first = setup.use_batch_stats and need_x
        if gather_first or need_w or need_b:
            ones = torch.ones_like(mean)
            sums: list[torch.Tensor] = []
            for _, (xp, gyp) in transfers.loaded(
                parts, lambda p: (to_compute(x, device, acc, p), grad_rows(p))
            ):
                # Centred with the global μ inside the sum, as native BatchNorm does: Σ∇y·x − μΣ∇y
                # cancels catastrophically when |μ| ≫ σ (a float32 mean offset of 1000 cost ~3 more
                # digits than native). Native's own reduction kernel gives Σ∇y·(x − μ)·s and Σ∇y for a
                # given μ and s in one pass; with s = 1 it is the sum itself.
                _, part_gy_xmu, part_gy = torch.ops.aten.native_batch_norm_backward(
                    gyp, xp, ones, None, None, mean, ones, True, 0.0, [False, True, True]
                )
                sums.append(torch.stack([part_gy, part_gy_xmu]))
                record_on_device([xp, gyp, part_gy, part_gy_xmu])
            sum_gy, sum_gy_xmu = torch.stack(sums).double().sum(0)
        grad_x = None
        if need_x:
            count = x.numel() // x.shape[1]
            mean_gy = sum_gy / count
            proj = sum_gy_xmu * invstd.square() / count
            slope = (-proj * gain).to(acc)
            offset = (-mean_gy * gain).to(acc)
            single = len(parts) == 1 and device.type == "cpu"
            grad_x = None if single else host_empty(tuple(x.shape), x.dtype, device, like=x)
            in_place = device.type == "cpu" and acc == x.dtype

            def load(part: Partition) -> tuple[torch.Tensor, ...]:
                # x only for batch statistics: with running ones ∇x = ∇y·gain
                if setup.use_batch_stats:
                    return grad_rows(part), to_compute(x, device, acc, part)
                return (grad_rows(part),)

            for part, loaded in transfers.loaded(parts, load):
                gyp = loaded[0]
                target = None
                if grad_x is not None and in_place:
                    target = grad_x[part.b0 : part.b1, :, part.o0 : part.o1]
                if setup.use_batch_stats:
                    # ∇x = (∇y − mean(∇y) − (x − μ)·proj)·gain in three passes over one buffer: x − μ,
                    # then ·k + c, then + ∇y·gain. Centring first keeps |μ| ≫ σ from cancelling digits.
                    xp = loaded[1]
                    gxp = torch.sub(xp, _channel(mean), out=target)
                    torch.addcmul(_channel(offset), gxp, _channel(slope), out=gxp)
                    gxp.addcmul_(gyp, _channel(gain))
                    record_on_device([xp, gyp, gxp, mean_gy, proj, gain])
                else:  # running statistics are constants: ∇x = ∇y·gain, x is not needed
                    gxp = torch.mul(gyp, _channel(gain), out=target)
                    record_on_device([gyp, gxp, gain])
                if grad_x is None:
                    grad_x = gxp.to(x.dtype)
                elif target is None:
                    transfers.store(grad_x[part.b0 : part.b1, :, part.o0 : part.o1], gxp)
        transfers.finish()
        grad_w = (sum_gy_xmu * invstd).to(weight.dtype) if need_w else None
        grad_b = sum_gy.to(weight.dtype) if need_b else None
        return grad_x, grad_w, grad_b, None, None, None


class BigBatchNorm2d(nn.BatchNorm2d):
    """Drop-in `nn.BatchNorm2d` (same parameters, buffers and state dict) for host-held activations.

    Statistics, scale and shift live on the compute device (that of the parameters / buffers); the
    activations stay on the host and are processed in partitions of at most `budget_bytes`. An input on
    a device gives its output on that device, as the native layer's would; a host input a host output.
    """

    budget_bytes: int

    @classmethod
    def from_native(cls, bn: nn.BatchNorm2d, budget_bytes: int) -> BigBatchNorm2d:
        """A big BatchNorm sharing `bn`'s parameters and buffers (the same tensor objects)."""
        big = cls(
            bn.num_features,
            eps=bn.eps,
            momentum=bn.momentum,
            affine=bn.affine,
            track_running_stats=bn.track_running_stats,
            device="meta",
        )
        big.weight, big.bias = bn.weight, bn.bias
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            big._buffers[name] = bn._buffers.get(name)
        big.budget_bytes = budget_bytes
        big.train(bn.training)
        return big

    def __init__(self, *args: Any, budget_bytes: int = 256 * 2**20, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.budget_bytes = budget_bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        source = x.device
        x = to_host(x)
        momentum = self.momentum
        update = self.training and self.track_running_stats and self.num_batches_tracked is not None
        if update:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
            if momentum is None:  # cumulative moving average, as nn.BatchNorm2d
                momentum = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        setup = NormSetup(
            use_batch_stats=use_batch_stats,
            update_running=update,
            momentum=momentum,
            eps=self.eps,
            budget_bytes=int(self.budget_bytes),
            name=f"BigBatchNorm2d({self.num_features})",
        )
        running_mean = self.running_mean if not self.training or self.track_running_stats else None
        running_var = self.running_var if not self.training or self.track_running_stats else None
        y = _BigBatchNormFunction.apply(x, self.weight, self.bias, running_mean, running_var, setup)
        return to_source(y, source)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, budget_bytes={self.budget_bytes}"
