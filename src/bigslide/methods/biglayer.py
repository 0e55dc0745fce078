"""Big-Layer methods: end-to-end training on whole bags and whole images with host-held early layers.

"biglayer_mil" encodes a whole bag of tiles as one batch and pools it with a MIL aggregator.
Its encoder BatchNorm (`bn_mode`) uses the running statistics by default ("eval"), as ABMIL-ACC's and
the full-bag step's do: each tile's features depend on that tile alone, so the attention reads tiles
and a slide with one small lesion is called positive. "batch" normalises with the statistics of the
whole bag, exactly (the big layers see the whole bag at once), in training and at prediction alike; a
bag is one slide's tiles, so every tile's features are then relative to its own slide. On the learning
bench's tumour slides that model ranked the slides by the share of tumour in the bag: it put its
attention on the normal tiles (their features shift when tumour raises the bag mean), ranked tumour
tiles last, and called a slide with one tumour tile among normal ones negative. Read its attention
as a lesion map only with "eval" or "frozen".

"biglayer_image" runs one large image through a big ResNet and a linear classifier, without patching;
its `bn_mode` is full_image's (see `bigslide.methods.batchnorm`: "eval" for batches of one slide).
In both, the stem and the first `stages` ResNet stages keep their activations in host RAM and compute
in partitions of at most `budget_mb` on the device; the rest of the network runs on the device as usual.

Mixed precision: under the stepper's autocast (bf16/fp16 on CUDA) the big layers compute in the
autocast dtype on the device and keep their activations in that dtype on the host; BatchNorm
statistics are always accumulated in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from bigslide.data.colour import RowColour
from bigslide.data.sample import as_float
from bigslide.errors import ConfigError
from bigslide.methods.base import (
    Batch,
    Method,
    MethodParams,
    ModelSpec,
    Prediction,
    Sample,
    Stepper,
    StepResult,
    register,
)
from bigslide.methods.batchnorm import (
    IMAGE_BN_MODE_HELP,
    ImageBnMode,
    freeze_batchnorm_affine,
    frozen_batchnorm,
)
from bigslide.methods.encoder_layout import wants_channels_last
from bigslide.methods.instances import check_support, instance_term, tile_classifier, with_instances
from bigslide.methods.mil import BN_WORDS, MILParams, aggregator_kwargs, bn_policy
from bigslide.methods.replay import batchnorm_mode, is_channels_last
from bigslide.nn.backbones import Encoder
from bigslide.nn.big import make_big
from bigslide.nn.mil import bag_loss, make_aggregator

if TYPE_CHECKING:
    from bigslide.memory.targets import Candidate, Settings, Target

_STAGES_HELP = "ResNet stages after the stem that run as Big-Layers (activations in host RAM); 0 = stem only"
_BUDGET_HELP = "Device memory one partition of a Big-Layer may use, in MiB (input rows, output rows, weights)"
_MIL_BN_HELP = (
    "encoder BatchNorm: eval = running statistics, each tile on its own (attention reads tiles); "
    "frozen = eval, no BN updates; batch = statistics of the whole bag in training and prediction "
    "(every tile relative to its slide; attention is no lesion map)"
)


def _big_encoder(spec: ModelSpec, stages: int, budget_mb: float, device: torch.device) -> Encoder:
    encoder = spec.encoder()
    make_big(encoder, stages, int(budget_mb * 2**20))
    if wants_channels_last(spec.channels_last, encoder, device):
        # the host activations follow the input's layout: channels-last rows are one block per partition
        encoder = encoder.to(memory_format=torch.channels_last)
    return encoder


class BigMILModel(nn.Module):
    """Big encoder over the whole bag, then a MIL aggregator (and the tile classifier annotations train,
    when they teach "tiles").

    (N, 3, t, t) -> (logits (1, C), attention (N,)).
    """

    def __init__(self, encoder: Encoder, aggregator: nn.Module, tiles: nn.Module | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.aggregator = aggregator
        self.tiles = tiles

    def forward(self, bag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.aggregator(self.encoder(bag))


class BigImageModel(nn.Module):
    """Big encoder over whole images, then a linear classifier: (B, 3, H, W) -> (B, C)."""

    def __init__(self, encoder: Encoder, num_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(images))


_STAGES = {"label": "Big-Layer stages", "min": 0, "max": 4, "help": _STAGES_HELP}
_BUDGET = {"label": "memory per partition (MiB)", "min": 0.001, "help": _BUDGET_HELP}


@dataclass
class BigLayerMILParams(MILParams):
    """The MIL head's settings (shared with the other bag methods) plus the Big-Layer ones."""

    stages: int = field(default=2, metadata=_STAGES)
    budget_mb: float = field(default=1024.0, metadata=_BUDGET)
    bn_mode: Literal["eval", "frozen", "batch"] = field(
        default="eval",
        metadata={"label": "tile encoder normalisation", "choices": BN_WORDS, "help": _MIL_BN_HELP},
    )


@dataclass
class BigLayerImageParams(MethodParams):
    stages: int = field(default=2, metadata=_STAGES)
    budget_mb: float = field(default=1024.0, metadata=_BUDGET)
    bn_mode: ImageBnMode = field(
        default="batch", metadata={"label": "encoder normalisation", "help": IMAGE_BN_MODE_HELP}
    )


def _to_host(x: torch.Tensor, colour: RowColour | None, model: nn.Module) -> torch.Tensor:
    # The big layers read their input from host memory; a device copy would defeat them. The stain maps
    # are applied there too, where the big layers' partitions read them from. A channels-last model
    # gets its input in that layout, made by the same pass that scales uint8 pixels.
    x = x if x.device.type == "cpu" else x.cpu()
    if not is_channels_last(model):
        return as_float(x, colour)
    if x.dtype == torch.uint8:
        x = x.to(torch.float32, memory_format=torch.channels_last).div_(255)
    return as_float(x, colour).contiguous(memory_format=torch.channels_last)


@register
class BigLayerMIL(Method[BigLayerMILParams]):
    name = "biglayer_mil"
    display_name = "Big-Layer, tiles"
    kind = "bag"
    takes_uint8 = True
    Params = BigLayerMILParams
    summary = "Whole bag as one batch through a Big-Layer encoder into a MIL aggregator"
    memory_params = ("budget_mb",)
    map_titles: ClassVar[dict[str, str]] = {"attention": "attention", "lesion": "tile classifier: lesion"}
    plan_preference = 5

    @classmethod
    def plan(cls, target: Target, settings: Settings) -> list[Candidate]:
        return plan_big_layers(cls.name, target, settings, image=False)

    model: BigMILModel

    def batch_size(self, requested: int) -> int:
        return 1  # the whole bag is the encoder's batch

    def build_model(self) -> nn.Module:
        p, spec = self.params, self.spec
        encoder = _big_encoder(spec, p.stages, p.budget_mb, self.device)
        aggregator = make_aggregator(p.aggregator, encoder.dim, spec.outputs, **aggregator_kwargs(p))
        if p.bn_mode == "frozen":
            freeze_batchnorm_affine(encoder)
        return BigMILModel(encoder, aggregator, tile_classifier(spec, encoder.dim))

    def check_instances(self) -> None:
        check_support(self.spec, self.model.aggregator, frozen_encoder=False, method=self.title())

    def train_step(self, batch: Batch, stepper: Stepper) -> StepResult:
        target = batch.y.to(self.device)
        model = self.model
        # The whole bag is one batch, so "batch" statistics are exact: no chunking to warn about.
        with stepper.autocast(), bn_policy(model.encoder, self.params.bn_mode, chunked=False):
            z = model.encoder(_to_host(batch.x, self.colour(batch.samples), self.model))
            logits, _ = model.aggregator(z)
            loss = bag_loss(model.aggregator, logits.float(), target, self.loss)
            loss = with_instances(loss, instance_term(self.spec, batch, model.tiles), model.aggregator, z)
        stepper.backward(loss)
        stepper.step()
        return StepResult(loss=loss.detach(), logits=logits.detach().float(), optimizer_steps=1)

    def predict(self, sample: Sample) -> Prediction:
        # The statistics the training steps used: the bag's own ("batch"; the running ones are left as
        # they were) or the running ones.
        whole_bag = self.params.bn_mode == "batch"
        model = self.model
        with torch.no_grad(), batchnorm_mode(model.encoder, whole_bag, keep_statistics=True):
            z = model.encoder(_to_host(sample.x, self.colour([sample]), model))
            logits, attention = model.aggregator(z)
            maps = {}
            if model.tiles is not None:  # what the tile classifier calls each tile
                maps["lesion"] = (1 - torch.softmax(model.tiles(z).float(), dim=1)[:, -1]).cpu().numpy()
        probs = self.outputs(logits)[0]
        scores = attention.float().cpu().numpy()
        return Prediction(probs=probs.cpu().numpy(), instance_scores=scores, instance_maps=maps)


@register
class BigLayerImage(Method[BigLayerImageParams]):
    name = "biglayer_image"
    display_name = "Big-Layer, whole image"
    kind = "image"
    takes_uint8 = True
    Params = BigLayerImageParams
    summary = "Whole large images through a Big-Layer ResNet and a linear classifier, without patching"
    memory_params = ("budget_mb",)
    plan_preference = 4

    @classmethod
    def plan(cls, target: Target, settings: Settings) -> list[Candidate]:
        return plan_big_layers(cls.name, target, settings, image=True)

    model: BigImageModel

    def build_model(self) -> nn.Module:
        p, spec = self.params, self.spec
        encoder = _big_encoder(spec, p.stages, p.budget_mb, self.device)
        return BigImageModel(encoder, spec.outputs)

    def train_step(self, batch: Batch, stepper: Stepper) -> StepResult:
        target = batch.y.to(self.device)
        with stepper.autocast(), frozen_batchnorm(self.model, self.params.bn_mode == "eval"):
            logits = self.model(_to_host(batch.x, self.colour(batch.samples), self.model))
            loss = self.loss(logits.float(), target)
        stepper.backward(loss)
        stepper.step()
        return StepResult(loss=loss.detach(), logits=logits.detach().float(), optimizer_steps=1)

    def predict(self, sample: Sample) -> Prediction:
        with torch.no_grad():
            logits = self.model(_to_host(sample.x[None], self.colour([sample]), self.model))
        probs = self.outputs(logits)[0]
        return Prediction(probs=np.asarray(probs.cpu().numpy()))


def plan_big_layers(name: str, target: Target, settings: Settings, *, image: bool) -> list[Candidate]:
    """Candidates over big stages 1-2 and device budgets; the activations live in host RAM."""
    from bigslide.memory.targets import Candidate
    from bigslide.methods.calibration import calibrate_biglayer

    side = target.image if image else target.tile
    px = target.batch * target.image**2 if image else target.bag * target.tile**2
    out = []
    for stages in (1, 2):
        try:
            model = calibrate_biglayer(settings, name, stages, side, tiles=target.bag)
        except ConfigError as err:  # not a ResNet-family backbone
            return [Candidate(name, {}, 0, note=f"not available: {err}", rank=99)]
        host = model.total_peak(px=px, input_bytes=12 * px)
        for budget in (2048, 1024, 512, 256):
            # A partition never holds more than the whole big part would.
            peak = model.device_peak(px=px, budget_bytes=min(budget * 2**20, host))
            params = {"stages": stages, "budget_mb": float(budget)}
            out.append(
                Candidate(name, params, peak, note="host + device, all on CPU", rank=stages * 10, host=host)
            )
    return out
