"""`BigConv2d`: a Conv2d whose input and output live in host memory and are processed in row partitions.

Forward: for each partition, the input rows it needs (with halo) go to the compute device (the device of
the weight), are convolved there, and the output rows come back to a host tensor. Backward replays the
same partitions without recomputing the forward (∇W needs only the input slice and ∇Y, ∇X only ∇Y and
W): ∇W and ∇b accumulate on the device, each partition's ∇X comes back to the host, where halo rows
shared with the previous partition are added and the rest copied in. The result equals `nn.Conv2d`.
On the host, partitions are views and outputs go straight into the host result (see `partition`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from bigslide.nn.big.partition import (
    Partition,
    Transfers,
    conv_input_rows,
    host_empty,
    partition_budget,
    plan_partitions,
    record_on_device,
    to_compute,
    to_compute_rows,
    to_host,
    to_source,
)


def compute_dtype(x: torch.Tensor, device: torch.device) -> torch.dtype:
    """The dtype the device computes in: the autocast dtype when autocast is on there, else x's dtype."""
    if x.dtype in (torch.float32, torch.float16, torch.bfloat16) and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return x.dtype


@dataclass(frozen=True)
class ConvGeometry:
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    budget_bytes: int
    name: str


def plan_conv(
    x_shape: torch.Size,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    geom: ConvGeometry,
    dtype: torch.dtype,
) -> tuple[list[Partition], tuple[int, int]]:
    """Partitions of a convolution's output and its output size (rows, cols)."""
    n, c_in, h, w = x_shape
    c_out, _, k_h, k_w = weight.shape
    (s_h, s_w), (p_h, p_w), (d_h, d_w) = geom.stride, geom.padding, geom.dilation
    reach = d_h * (k_h - 1)
    h_out = (h + 2 * p_h - reach - 1) // s_h + 1
    w_out = (w + 2 * p_w - d_w * (k_w - 1) - 1) // s_w + 1
    item = torch.empty((), dtype=dtype).element_size()
    params = weight.numel() + (bias.numel() if bias is not None else 0)
    param_item = weight.element_size()
    weight_bytes = params * (param_item if dtype == weight.dtype else param_item + item)

    def cost(samples: int, rows: int) -> int:
        # Backward holds x, ∇y and ∇x of the partition plus weight, its ∇ and the ∇ accumulator.
        in_rows = (rows - 1) * s_h + reach + 1
        x_bytes = samples * c_in * in_rows * w * item
        y_bytes = samples * c_out * rows * w_out * item
        return 2 * x_bytes + y_bytes + 3 * weight_bytes

    parts = plan_partitions(
        n,
        h_out,
        cost,
        partition_budget(geom.budget_bytes, weight.device),
        what=geom.name,
        input_rows=lambda o0, o1: conv_input_rows(o0, o1, s_h, p_h, reach, h),
    )
    return parts, (h_out, w_out)


def _row_padding(part: Partition) -> tuple[bool, int]:
    """Symmetric halo padding is left to the convolution (no copy); asymmetric padding is explicit."""
    if part.pad_top == part.pad_bottom:
        return False, part.pad_top
    return True, 0


def _input_rows(x: torch.Tensor, device: torch.device, dtype: torch.dtype, part: Partition) -> torch.Tensor:
    """The rows a partition's convolution reads, padded where the convolution does not pad them."""
    return to_compute(x, device, dtype, part, _row_padding(part)[0])


class _BigConv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geom: ConvGeometry
    ) -> torch.Tensor:
        device = weight.device
        dtype = compute_dtype(x, device)
        parts, (h_out, w_out) = plan_conv(x.shape, weight, bias, geom, dtype)
        transfers = Transfers(device)
        with torch.autocast(device.type, enabled=False):
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            single = len(parts) == 1 and device.type == "cpu"
            y = None if single else host_empty((x.shape[0], w.shape[0], h_out, w_out), dtype, device, like=x)
            for part, (xp,) in transfers.loaded(parts, lambda part: (_input_rows(x, device, dtype, part),)):
                conv_pad = _row_padding(part)[1]
                yp = F.conv2d(xp, w, b, geom.stride, (conv_pad, geom.padding[1]), geom.dilation, geom.groups)
                record_on_device([xp, yp, weight, w if w is not weight else None, bias])
                if y is None:
                    y = yp
                else:
                    transfers.store(y[part.b0 : part.b1, :, part.o0 : part.o1], yp)
        transfers.finish()
        ctx.save_for_backward(x, weight, bias)
        ctx.geom, ctx.dtype = geom, dtype
        assert y is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, bias = ctx.saved_tensors
        geom: ConvGeometry = ctx.geom
        dtype: torch.dtype = ctx.dtype
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        device = weight.device
        parts, _ = plan_conv(x.shape, weight, bias, geom, dtype)
        # One partition covering every input row on the CPU: its ∇x is already the whole ∇x.
        whole = len(parts) == 1 and device.type == "cpu" and (parts[0].i0, parts[0].i1) == (0, x.shape[2])
        grad_x = None if whole or not need_x else host_empty(tuple(x.shape), x.dtype, device, like=x)
        transfers = Transfers(device)
        stitch = _GradStitcher(grad_x, x.shape[2], transfers) if grad_x is not None else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b and bias is not None else None
        w = weight.to(dtype)
        bias_sizes = [bias.shape[0]] if bias is not None else None

        def load(part: Partition) -> tuple[torch.Tensor, torch.Tensor]:
            rows = grad_y[part.b0 : part.b1, :, part.o0 : part.o1]
            return _input_rows(x, device, dtype, part), to_compute_rows(rows, device, dtype)

        for part, (xp, gyp) in transfers.loaded(parts, load):
            pad_rows, conv_pad = _row_padding(part)
            gxp, gwp, gbp = torch.ops.aten.convolution_backward(
                gyp,
                xp,
                w,
                bias_sizes,
                list(geom.stride),
                [conv_pad, geom.padding[1]],
                list(geom.dilation),
                False,
                [0, 0],
                geom.groups,
                [need_x, need_w, need_b and bias is not None],
            )
            record_on_device(
                [xp, gyp, gxp, weight, w if w is not weight else None, gwp, grad_w, bias, grad_b]
            )
            if grad_w is not None:
                grad_w += gwp.to(grad_w.dtype)
            if grad_b is not None:
                grad_b += gbp.to(grad_b.dtype)
            if need_x:
                if pad_rows:
                    gxp = gxp[:, :, part.pad_top : part.pad_top + part.i1 - part.i0]
                if stitch is None:
                    grad_x = gxp.to(x.dtype)
                else:
                    stitch.place(part, gxp)
        if stitch is not None:
            stitch.finish()
        transfers.finish()
        return grad_x, grad_w, grad_b, None


class _GradStitcher:
    """Assembles ∇x from partition gradients without a zero-filled buffer.

    Partitions come sample run by sample run, rows ascending, so a partition's halo can only overlap
    rows the previous partition of the same run wrote: those rows are added, the rest are copied in
    (through `transfers`: on CUDA the copies run beside the compute, the sums land when it finishes).
    Rows no partition reads (a stride larger than the kernel, unused trailing rows) are zeroed.
    """

    def __init__(self, grad_x: torch.Tensor, height: int, transfers: Transfers) -> None:
        self.grad_x, self.height, self.transfers = grad_x, height, transfers
        self.run: tuple[int, int] | None = None
        self.done = 0  # rows [0, done) of the current run hold their final or partial gradient

    def _zero(self, r0: int, r1: int) -> None:
        if self.run is not None and r1 > r0:
            self.grad_x[self.run[0] : self.run[1], :, r0:r1].zero_()

    def place(self, part: Partition, gxp: torch.Tensor) -> None:
        if self.run != (part.b0, part.b1):
            self.finish()
            self.run, self.done = (part.b0, part.b1), 0
        self._zero(self.done, part.i0)
        target = self.grad_x[part.b0 : part.b1]
        overlap = max(0, min(self.done, part.i1) - part.i0)
        if overlap:
            self.transfers.store(target[:, :, part.i0 : part.i0 + overlap], gxp[:, :, :overlap], add=True)
        if part.i0 + overlap < part.i1:
            self.transfers.store(target[:, :, part.i0 + overlap : part.i1], gxp[:, :, overlap:])
        self.done = max(self.done, part.i1)

    def finish(self) -> None:
        self._zero(self.done, self.height)
        self.run = None


class BigConv2d(nn.Conv2d):
    """Drop-in `nn.Conv2d` (same parameters and state dict) that keeps activations in host memory.

    `budget_bytes` bounds what one partition holds on the compute device (input rows with halo, output
    rows, weights and their gradients, in bytes of the compute dtype). The compute device is the device
    of `weight`. An input on a device is brought to the host first and the output goes back to that
    device, as the native layer's would; a host input gives a host output.
    """

    budget_bytes: int

    @classmethod
    def from_native(cls, conv: nn.Conv2d, budget_bytes: int) -> BigConv2d:
        """A big conv sharing `conv`'s parameters (the same Parameter objects)."""
        big = cls(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,  # type: ignore[arg-type]
            stride=conv.stride,  # type: ignore[arg-type]
            padding=conv.padding,  # type: ignore[arg-type]
            dilation=conv.dilation,  # type: ignore[arg-type]
            groups=conv.groups,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
            device="meta",
        )
        big.weight = conv.weight
        big.bias = conv.bias
        big.budget_bytes = budget_bytes
        big.train(conv.training)
        return big

    def __init__(self, *args: Any, budget_bytes: int = 256 * 2**20, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.budget_bytes = budget_bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        source = x.device
        x = to_host(x)
        padding = self.padding
        if isinstance(padding, str) or self.padding_mode != "zeros":
            # 'same' (possibly asymmetric) and non-zero modes: pad once on the host, then convolve unpadded.
            mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=mode)
            padding = (0, 0)
        geom = ConvGeometry(
            stride=self.stride,  # type: ignore[arg-type]
            padding=padding,  # type: ignore[arg-type]
            dilation=self.dilation,  # type: ignore[arg-type]
            groups=self.groups,
            budget_bytes=int(self.budget_bytes),
            name=f"BigConv2d({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size})",
        )
        return to_source(_BigConv2dFunction.apply(x, self.weight, self.bias, geom), source)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, budget_bytes={self.budget_bytes}"
