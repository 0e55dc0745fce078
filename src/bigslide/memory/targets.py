"""What the planner is asked (`Target`), how it calibrates (`Settings`) and what it offers
(`Candidate`): plain types, so methods can describe their memory without importing the planner."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

CUDA_CONTEXT_BYTES = 512 * 2**20  # CUDA context and library handles: device memory no tensor counts


@dataclass(frozen=True)
class Target:
    gpu_bytes: int
    backbone: str = "resnet50"
    image: int = 0  # image side (image methods)
    batch: int = 1  # images per batch
    tile: int = 256  # PatchGD patch side / MIL tile side
    bag: int = 0  # tiles per bag (bag methods)
    method: str = "auto"
    dtype: str = "fp32"
    device: str = "auto"
    margin: float = 0.2
    cap_px: int = 0  # largest calibration input; 0 = by device

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_bytes * (1 - self.margin)) - CUDA_CONTEXT_BYTES


@dataclass
class Candidate:
    method: str
    params: dict[str, Any]
    peak: int
    fits: bool = False
    note: str = ""
    rank: int = 0  # lower = faster among settings of one method
    host: int = 0  # host RAM the method needs besides the device (Big-Layer activations)
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items()) or "-"


@dataclass(frozen=True)
class Settings:
    backbone: str = "resnet18"
    device: str = "cpu"
    autocast_dtype: torch.dtype | None = None
    cap_px: int = 320 * 320  # largest calibration input (pixels with grad)
    num_classes: int = 2


def powers_of_two(limit: int) -> list[int]:
    values = [2**i for i in range(int(math.log2(max(limit, 1))) + 1)]
    return sorted({*values, limit})
