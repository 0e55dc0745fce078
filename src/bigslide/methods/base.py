"""The one method protocol: every training method is a `Method` subclass registered by name.

The engine, the CLI and the napari plugin only talk to this interface. A method owns its trainable
modules (`self.model`, checkpointed as one state dict), does its own backward passes and asks the
engine's `Stepper` to take optimizer steps, so methods with inner loops (PatchGD) and methods with
replayed backward passes (ABMIL-ACC) fit the same loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from bigslide.coerce import build_dataclass, check_ranges
from bigslide.data.colour import RowColour, row_colour
from bigslide.data.endpoint import Endpoint
from bigslide.data.sample import Batch, Sample
from bigslide.data.stain_norm import StainFit
from bigslide.errors import ConfigError
from bigslide.nn.backbone_args import backbone_arguments, card_arguments
from bigslide.nn.backbones import Encoder, create_encoder
from bigslide.nn.losses import endpoint_loss, endpoint_outputs, endpoint_score

if TYPE_CHECKING:
    from bigslide.memory.targets import Candidate, Settings, Target

Kind = Literal["bag", "image"]


class StepResult:
    """What one training step gives the engine: its loss, the (B, C) detached logits (for metrics) and
    the optimizer steps it took.

    `loss` may be given as a scalar tensor on the device: reading it makes the host wait for the step's
    kernels, so a step hands it over unread and it is read once, when `loss` is first asked for (the
    step's only wait for the device).
    """

    def __init__(self, loss: float | torch.Tensor, logits: torch.Tensor, optimizer_steps: int = 1) -> None:
        self._loss = loss
        self.logits = logits
        self.optimizer_steps = optimizer_steps

    @property
    def loss(self) -> float:
        if isinstance(self._loss, torch.Tensor):
            self._loss = float(self._loss)
        return self._loss

    def __repr__(self) -> str:
        return f"StepResult(loss={self._loss!r}, optimizer_steps={self.optimizer_steps})"


@dataclass
class Prediction:
    """What inference gives for one sample.

    `instance_scores`: one score per tile, in the sample's tile order (attention for MIL methods);
    `instance_maps` more of them (each tile's contribution to the risk).
    `maps`: named maps on the image's patch grid, (rows, cols) or (rows, cols, 3) (PatchGD Z-block maps);
    cell (r, c) starts at input pixel (map_offset + r·map_stride, map_offset + c·map_stride).
    """

    probs: np.ndarray  # the endpoint's outputs (`Method.outputs`): class probabilities for classes
    instance_scores: np.ndarray | None = None
    instance_maps: dict[str, np.ndarray] = field(default_factory=dict)  # more per-tile maps, by name
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
    the GUI builds its form from them. `metadata={"label": ...}` names the field in the form (in words,
    with its unit), `"help"` gives the tooltip, `"min"` / `"max"` (inclusive) and `"above"` (exclusive)
    bound the value (checked here and in the form), `"choices": {value: words}` says how a Literal's
    values read, `"shown_with": {"other_field": (values, ...)}` shows the field in the form only while
    another field has one of those values."""

    def __post_init__(self) -> None:
        check_ranges(self, "method.params")


@dataclass
class ModelSpec:
    """Choices shared by all methods."""

    backbone: str = "resnet18"
    pretrained: bool = False
    weights: str | None = None  # a local state-dict file for the backbone
    backbone_args: dict[str, Any] = field(default_factory=dict)  # `model.backbone_args`, as written
    num_classes: int = 2  # outputs of a classifier when no endpoint is given
    endpoint: Endpoint | None = None  # what is predicted (None: `num_classes` classes)
    feature_dim: int | None = None  # features stored by another tool's encoder (None: the backbone's)
    # what teaching annotations teach ("attention" | "tiles"; None: nothing) and the weight of their loss
    instance_loss: str | None = None
    instance_weight: float = 0.0
    # the tile encoder's memory layout ("auto": channels-last for a CNN on CUDA; `encoder_layout`)
    channels_last: str = "auto"
    # how a checkpoint's hub encoder is built without the hub (`bigslide.nn.hub_models.hub_recipe`)
    recipe: dict[str, Any] | None = None
    # the side of the tiles the encoder reads (a bag method's data.tile_size; None: unknown), on which a
    # plain module's output is measured
    tile_side: int | None = None

    @property
    def outputs(self) -> int:
        """Logits the model gives per item."""
        return self.endpoint.n_outputs if self.endpoint is not None else self.num_classes

    def encoder(self, out_dim: int | None = None, **kwargs: Any) -> Encoder:
        """The tile encoder this spec names, with its starting weights (`create_encoder`)."""
        try:
            return create_encoder(
                self.backbone,
                pretrained=self.pretrained,
                weights=self.weights,
                out_dim=out_dim,
                recipe=self.recipe,
                tile_side=self.tile_side,
                **{**backbone_arguments(card_arguments(self.backbone, self.backbone_args)), **kwargs},
            )
        except TypeError as err:
            if kwargs or not self.backbone_args:
                raise  # the method's own arguments: it may build the encoder again without them
            raise ConfigError(
                f"model.backbone_args: {self.backbone} failed with them (TypeError: {err}): an argument it "
                "does not take, or a value of the wrong type"
            ) from None


P = TypeVar("P", bound=MethodParams)


class Method(ABC, Generic[P]):
    """A training method, generic over its parameters' dataclass (`Method[MyParams]`). Besides training
    and inference it describes itself to the engine (batching, memory knobs), the planner (`plan`) and
    the viewers (`map_titles`), so none of them names a method."""

    name: ClassVar[str]
    kind: ClassVar[Kind]
    Params: ClassVar[type[MethodParams]]
    summary: ClassVar[str] = ""
    display_name: ClassVar[str] = ""  # how people call it (the panels show it); "" = `name`
    # Parameters that bound a step's memory: an out-of-memory error suggests halving them.
    memory_params: ClassVar[tuple[str, ...]] = ()
    # The heatmaps `predict` gives (`instance_scores` are "attention"), with their titles in the viewers.
    map_titles: ClassVar[dict[str, str]] = {}
    # Among methods that fit a memory limit the planner recommends the lowest.
    plan_preference: ClassVar[int] = 100
    # True: the method takes pixels as read (uint8; `to_device` scales them on its device, a quarter of
    # float32's transfer, and applies `colour(samples)` there). False: the engine hands it floats in
    # [0, 1], stain maps applied.
    takes_uint8: ClassVar[bool] = False

    @classmethod
    def title(cls) -> str:
        """The method's name as people say it (its registry name when it has no other)."""
        return cls.display_name or cls.name

    def __init__(self, params: P, spec: ModelSpec, device: torch.device) -> None:
        self.params: P = params
        self.spec = spec
        self.device = device
        # The stain every slide is mapped onto (data.stain_normalise); saved in the checkpoint.
        self.stain_reference: StainFit | None = None
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

    def colour(self, samples: Sequence[Sample]) -> RowColour | None:
        """The per-row colour maps of these samples' pixels, in the order a batch holds them: stain
        normalisation onto `stain_reference` and the samples' stain augmentation; None when neither
        applies (pass it to `to_device` / `as_float` with the pixels, sliced like them)."""
        return row_colour(samples, self.stain_reference) if samples else None

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The endpoint's loss of (B, K) logits against the batch's targets."""
        return endpoint_loss(self.spec.endpoint, logits, y)

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        """What a prediction reports for (B, K) logits: class probabilities, a number, S(t) or a risk."""
        return endpoint_outputs(self.spec.endpoint, logits.float())

    @property
    def explains_score(self) -> bool:
        """Whether heatmaps explain one score per item (`score`), rather than a class's logit."""
        return self.spec.endpoint is not None and self.spec.endpoint.task != "classification"

    def score(self, logits: torch.Tensor) -> torch.Tensor:
        """(B,) what heatmaps explain for survival (the risk) and regression (the standardised value)."""
        return endpoint_score(self.spec.endpoint, logits.float())

    def frozen_encoder(self) -> nn.Module | None:
        """The encoder whose tile features stay fixed through training, so that features stored once
        (`data.features`) can stand in for it; None when the method trains its encoder. A method that
        returns one takes bags of stored features (`Sample.features`) in `train_step` and `predict`."""
        return None

    def check_instances(self) -> None:
        """Called when the training slides carry teaching annotations (`spec.instance_loss` set): a
        `ConfigError` naming why this method cannot learn from annotated tiles, if it cannot."""
        raise ConfigError(
            f"{self.title()} does not learn from annotated tiles (the slide table's annotations); set "
            "data.instance_weight: 0 to train it without them"
        )

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.model.parameters() if p.requires_grad)

    def batch_size(self, requested: int) -> int:
        """Samples per batch for a requested `data.batch_size` (methods that take one bag at a time
        override it)."""
        return max(1, requested)

    def memory_knobs(self, data: Mapping[str, Any]) -> dict[str, float]:
        """The settings that bound this method's step memory, by config key, with their values now."""
        knobs: dict[str, float] = {
            f"method.params.{name}": value
            for name in self.memory_params
            if isinstance(value := getattr(self.params, name, None), int | float)
            and not isinstance(value, bool)
        }
        sizes = ("bag_size",) if self.kind == "bag" else ("image_size", "batch_size")
        knobs.update({f"data.{name}": data[name] for name in sizes if data.get(name)})
        return knobs

    @classmethod
    def plan(cls, target: Target, settings: Settings) -> list[Candidate] | None:
        """Candidate settings with their predicted peak memory at `target`, from a calibration on this
        machine; None when the method has no memory model (the planner says so)."""
        return None


_REGISTRY: dict[str, type[Method[Any]]] = {}
M = TypeVar("M", bound="Method[Any]")


def register(cls: type[M]) -> type[M]:
    """Class decorator adding a method to the registry under `cls.name`."""
    if cls.name in _REGISTRY:
        raise ValueError(f"method {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


ENTRY_POINT_GROUP = "bigslide.methods"
"""Installed packages add methods under this entry-point group: `name = "package.module:MethodClass"`
(or a module whose import registers its methods with `@register`)."""
_PLUGIN_ERRORS: dict[str, str] = {}
_plugins_loaded = False


def available_methods() -> list[str]:
    _load_methods()
    return sorted(_REGISTRY)


def get_method(name: str) -> type[Method[Any]]:
    _load_methods()
    try:
        return _REGISTRY[name]
    except KeyError:
        broken = f"; {name!r} failed to load: {_PLUGIN_ERRORS[name]}" if name in _PLUGIN_ERRORS else ""
        raise ConfigError(
            f"method: unknown method {name!r}; choose one of {sorted(_REGISTRY)}{broken}"
        ) from None


def make_params(name: str, values: dict[str, Any] | None = None) -> MethodParams:
    """The method's params dataclass filled from a plain dict; unknown keys are a `ConfigError`."""
    cls = get_method(name).Params
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"method.params: {name} has no parameter(s) {unknown}; known: {sorted(known)}")
    params: MethodParams = build_dataclass(cls, values, "method.params")
    return params


def _load_methods() -> None:
    """Installed packages' methods, once. (The built-in ones registered when `bigslide.methods` was
    imported, which Python does before any of its modules, this one included.)"""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except Exception as err:  # a broken plugin must not take bigslide down; its name says why
            _PLUGIN_ERRORS[entry.name] = f"{entry.value}: {type(err).__name__}: {err}"
            continue
        if isinstance(loaded, type) and issubclass(loaded, Method) and loaded.name not in _REGISTRY:
            register(loaded)
