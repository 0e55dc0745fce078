"""Cheap layers that run on the host tensors themselves: ReLU, max pooling, normalisation.

They cost little compute per byte, so moving their data to the device would cost more than it saves.
Residual additions (`x += shortcut` inside timm's blocks) need no module: both operands are host
tensors, so the native add already runs on the host.
"""

from __future__ import annotations

import torch
from torch import nn

from bigslide.nn.backbones import Normalize


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
    """The encoder's input normalisation, applied on the host so a whole image never visits the device."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _on_host(x)
        return (x - self.mean.to(x.device, x.dtype)) / self.std.to(x.device, x.dtype)


class SendToComputeDevice:
    """Forward hook on the last big module: its host output continues on the device of `probe`'s weights."""

    def __init__(self, probe: nn.Module) -> None:
        self.probe = probe

    def __call__(self, module: nn.Module, inputs: object, output: torch.Tensor) -> torch.Tensor:
        device = next(self.probe.parameters()).device
        return output.to(device, non_blocking=output.is_pinned())
