"""Cheap layers that run on the host tensors themselves: ReLU, max pooling, normalisation.

They cost little compute per byte, so moving their data to the device would cost more than it saves.
Residual additions (`x += shortcut` inside timm's blocks) need no module: both operands are host
tensors, so the native add already runs on the host.
"""

from __future__ import annotations

import torch
from torch import nn

from bigslide.nn.backbones import Normalize
from bigslide.nn.big.partition import host_empty


def _on_host(x: torch.Tensor) -> torch.Tensor:
    return x if x.device.type == "cpu" else x.cpu()


class HostReLU(nn.ReLU):
    """`nn.ReLU` on a host tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(_on_host(x))


class HostMaxPool2d(nn.MaxPool2d):
    """`nn.MaxPool2d` on a host tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(_on_host(x))


class HostNormalize(Normalize):
    """The encoder's input normalisation, applied on the host so a whole image never visits the device.

    Its constants stay on the host beside the buffers (which follow the model to the compute device), so
    no forward waits for a copy back. With the model on CUDA the result goes to pinned memory, in the
    input's layout, so the first big layer's partitions reach the device without the host waiting."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__(mean, std)
        self.host_mean, self.host_std = self.mean.clone(), self.std.clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _on_host(x)
        mean, std = self.host_mean.to(x.dtype), self.host_std.to(x.dtype)
        if self.mean.device.type == "cpu" or (torch.is_grad_enabled() and x.requires_grad):
            return (x - mean) / std
        out = host_empty(tuple(x.shape), x.dtype, self.mean.device, like=x)
        return torch.sub(x, mean, out=out).div_(std)


class SendToComputeDevice:
    """Forward hook on the last big module: its host output continues on the device of `probe`'s weights."""

    def __init__(self, probe: nn.Module) -> None:
        self.probe = probe

    def __call__(self, module: nn.Module, inputs: object, output: torch.Tensor) -> torch.Tensor:
        device = next(self.probe.parameters()).device
        return output.to(device, non_blocking=output.is_pinned())
