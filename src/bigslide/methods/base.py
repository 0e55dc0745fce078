"""The one method protocol: every training method is a `Method` subclass registered by name.

The engine, the CLI and the napari plugin only talk to this interface. A method owns its trainable
modules (`self.model`, checkpointed as one state dict), does its own backward passes and asks the
engine's `Stepper` to take optimizer steps, so methods with inner loops (PatchGD) and methods with
replayed backward passes (ABMIL-ACC) fit the same loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
import torch
from torch import nn

from bigslide.errors import ConfigError

Kind = Literal["bag", "image"]


@dataclass
class Sample:
    """One item from a dataset.

    kind "bag": `x` is (N, 3, t, t) float in [0, 1], `coords` the (N, 2) level-0 top-left (x, y) of each tile.
    kind "image": `x` is (3, H, W) float in [0, 1]; image pixel (r, c) covers level-0 pixels starting at
    `origin + (c, r) * downsample`.
    """

    x: torch.Tensor
    y: int
    slide: str
    coords: np.ndarray | None = None
    tile_size_level0: int = 0
    origin: tuple[int, int] = (0, 0)
    downsample: float = 1.0


@dataclass
class Batch:
    """Collated samples: bags come one per batch (N varies), images are stacked (B, 3, H, W).

    `x` stays in host memory (pinned on CUDA); each method moves what it needs to its device.
    """

    x: torch.Tensor
    y: torch.Tensor
    samples: list[Sample]


@dataclass
class StepResult:
    loss: float
    logits: torch.Tensor  # (B, C), detached, for metrics
    optimizer_steps: int = 1


@dataclass
class Prediction:
    """What inference gives for one sample.

    `instance_scores`: one score per tile, in the sample's tile order (attention for MIL methods).
    `maps`: named maps on the image's patch grid, (rows, cols) or (rows, cols, 3) (PatchGD Z-block maps);
    cell (r, c) starts at input pixel (map_offset + r·map_stride, map_offset + c·map_stride).
    """

    probs: np.ndarray
    instance_scores: np.ndarray | None = None
    maps: dict[str, np.ndarray] = field(default_factory=dict)
    map_stride: float = 0.0  # input pixels between map cells; 0 = input side / map columns
    map_offset: float = 0.0  # input pixels from the image corner to cell (0, 0)'s corner


class Stepper(Protocol):
    """Supplied by the engine: owns the optimizer, schedule, gradient clipping and mixed precision."""

    def autocast(self) -> contextlib.AbstractContextManager[Any]: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> None: ...


@dataclass
class MethodParams:
    """Base of every method's parameters. Fields must be int, float, bool, str or a Literal of str:
    the GUI builds its form from them. `metadata={"help": ...}` gives the tooltip."""


@dataclass
class ModelSpec:
    """Choices shared by all methods."""

    backbone: str = "resnet18"
    pretrained: bool = False
    weights: str | None = None  # a local state-dict file for the backbone
    num_classes: int = 2


class Method(ABC):
    name: ClassVar[str]
    kind: ClassVar[Kind]
    Params: ClassVar[type[MethodParams]]
    summary: ClassVar[str] = ""

    def __init__(self, params: MethodParams, spec: ModelSpec, device: torch.device) -> None:
        self.params = params
        self.spec = spec
        self.device = device
        self.model: nn.Module = self.build_model()
        self.model.to(device)

    @abstractmethod
    def build_model(self) -> nn.Module:
        """All trainable modules of the method, as one module (its state dict is the checkpoint)."""

    @abstractmethod
    def train_step(self, batch: Batch, stepper: Stepper) -> StepResult:
        """Forward and backward on one batch, calling `stepper.step()` whenever a gradient is complete."""

    @abstractmethod
    def predict(self, sample: Sample) -> Prediction:
        """Inference on one sample (the model is put in eval mode by the caller)."""

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.model.parameters() if p.requires_grad)


_REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator adding a method to the registry under `cls.name`."""
    if cls.name in _REGISTRY:
        raise ValueError(f"method {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def available_methods() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_method(name: str) -> type[Method]:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"method: unknown method {name!r}; choose one of {sorted(_REGISTRY)}") from None


def make_params(name: str, values: dict[str, Any] | None = None) -> MethodParams:
    """The method's params dataclass filled from a plain dict; unknown keys are a `ConfigError`."""
    cls = get_method(name).Params
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"method.params: {name} has no parameter(s) {unknown}; known: {sorted(known)}")
    return cls(**values)


def _load_builtin() -> None:
    # Importing the package registers the built-in methods.
    import bigslide.methods  # noqa: F401
