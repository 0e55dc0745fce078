"""What the attention-MIL methods share: the encoder + head model, the head's parameters, the
encoder BatchNorm policy, and chunked, gradient-free prediction. ABMIL-ACC, the full-bag and
frozen-encoder baselines and Big-Layer MIL build on it."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple, TypeVar

import numpy as np
import torch
from torch import nn

from bigslide.errors import ConfigError
from bigslide.methods.base import Batch, Method, MethodParams, Prediction, Sample
from bigslide.methods.batchnorm import freeze_batchnorm_affine
from bigslide.methods.encoder_layout import wants_channels_last
from bigslide.methods.instances import InstanceTerm, check_support, instance_term, tile_classifier
from bigslide.methods.replay import InexactGradientWarning, batchnorm_layers, encode_chunks
from bigslide.nn.backbones import Encoder, NoEncoder
from bigslide.nn.mil import Aggregator, make_aggregator
from bigslide.nn.mil.base import split_head_output

BNMode = Literal["eval", "frozen", "batch"]
BN_WORDS = {"eval": "eval (exact)", "frozen": "frozen (exact)", "batch": "batch statistics (inexact)"}
AGGREGATOR_WORDS = {
    "abmil": "ABMIL",
    "abmil_gated": "gated ABMIL",
    "transmil": "TransMIL",
    "dtfd": "DTFD-MIL",
}


class BagStep(NamedTuple):
    loss: torch.Tensor  # detached scalar
    logits: torch.Tensor  # (1, C), detached
    attention: torch.Tensor | None  # (N,), detached; None when the aggregator returns bare logits


@contextlib.contextmanager
def bn_policy(encoder: nn.Module, mode: str, *, chunked: bool = True) -> Iterator[None]:
    """Puts the encoder's BatchNorm layers in the state `mode` asks for, and restores them after.

    "eval": running statistics (exact); "frozen": running statistics and no gradient to the BN
    affine parameters (exact); "batch": leave the layers as they are (train mode = batch statistics;
    inexact when `chunked`, which warns).
    """
    if mode not in ("eval", "frozen", "batch"):
        raise ConfigError(f"method.params.bn_mode: {mode!r} is not one of 'eval', 'frozen', 'batch'")
    layers = batchnorm_layers(encoder)
    if mode == "batch":
        if chunked and any(layer.training for layer in layers):
            warnings.warn(
                "bn_mode='batch': encoder BatchNorm uses per-chunk batch statistics, so the accumulated "
                "gradient differs from the full-bag gradient; bn_mode='eval' or 'frozen' is exact",
                InexactGradientWarning,
                stacklevel=3,
            )
        yield
        return
    training = [layer.training for layer in layers]
    frozen = (
        [p for layer in layers for p in layer.parameters() if p.requires_grad] if mode == "frozen" else []
    )
    try:
        for layer in layers:
            layer.eval()
        for p in frozen:
            p.requires_grad_(False)
        yield
    finally:
        for layer, was_training in zip(layers, training):
            layer.train(was_training)
        for p in frozen:
            p.requires_grad_(True)


class MILModel(nn.Module):
    """Encoder and MIL head; `forward` is the plain full-bag graph. `tiles`: the per-tile classifier
    teaching annotations train ("tiles"), when they do."""

    def __init__(self, encoder: nn.Module, aggregator: Aggregator, tiles: nn.Module | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.aggregator = aggregator
        self.tiles = tiles

    def forward(self, bag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.aggregator(self.encoder(bag))


@dataclass
class MILParams(MethodParams):
    aggregator: Literal["abmil", "abmil_gated", "transmil", "dtfd"] = field(
        default="abmil",
        metadata={
            "label": "tile pooling (MIL head)",
            "choices": AGGREGATOR_WORDS,
            "help": "MIL head: ABMIL, gated ABMIL, TransMIL or DTFD-MIL",
        },
    )
    hidden: int = field(
        default=256,
        metadata={"label": "head width", "min": 1, "help": "size of the head's projection of the features"},
    )
    attention_dim: int = field(
        default=128,
        metadata={
            "label": "attention width",
            "shown_with": {"aggregator": ("abmil", "abmil_gated", "dtfd")},
            "min": 1,
            "help": "hidden size of the attention scorer",
        },
    )
    attention: Literal["softmax", "sigmoid"] = field(
        default="softmax",
        metadata={
            "label": "attention weights",
            "shown_with": {"aggregator": ("abmil", "abmil_gated")},
            "help": "softmax: weights sum to 1 (what the slide holds); sigmoid: each in (0, 1), mean over "
            "the bag (how much of it: burden-like survival or regression endpoints)",
        },
    )
    dropout: float = field(
        default=0.0,
        metadata={
            "label": "head dropout",
            "min": 0,
            "max": 0.99,
            "help": "dropout after the head's projection",
        },
    )
    heads: int = field(
        default=8,
        metadata={
            "label": "attention heads",
            "shown_with": {"aggregator": ("transmil",)},
            "min": 1,
            "help": "TransMIL: attention heads",
        },
    )
    pseudo_bags: int = field(
        default=4,
        metadata={
            "label": "pseudo-bags per slide",
            "shown_with": {"aggregator": ("dtfd",)},
            "min": 1,
            "help": "DTFD: pseudo-bags per bag",
        },
    )
    distill: Literal["afs", "maxs"] = field(
        default="afs",
        metadata={
            "label": "second-tier features",
            "shown_with": {"aggregator": ("dtfd",)},
            "help": "DTFD: tier-2 features (attention-pooled or max-scoring instance)",
        },
    )
    inference_chunk_size: int = field(
        default=128,
        metadata={
            "label": "tiles per pass when predicting",
            "min": 1,
            "help": "tiles per encoder call at prediction",
        },
    )


@dataclass
class EndToEndParams(MILParams):
    bn_mode: Literal["eval", "frozen", "batch"] = field(
        default="eval",
        metadata={
            "label": "tile encoder normalisation",
            "choices": BN_WORDS,
            "help": "encoder BatchNorm: eval (exact), frozen (exact, no BN updates), batch (inexact)",
        },
    )


def aggregator_kwargs(p: MILParams) -> dict[str, Any]:
    if p.aggregator == "transmil":
        return {"hidden": p.hidden, "heads": p.heads, "dropout": p.dropout}
    kwargs: dict[str, Any] = {"hidden": p.hidden, "attention_dim": p.attention_dim, "dropout": p.dropout}
    if p.aggregator in ("abmil", "abmil_gated"):
        kwargs["attention"] = p.attention
    if p.aggregator == "dtfd":
        kwargs.update(pseudo_bags=p.pseudo_bags, distill=p.distill)
    return kwargs


P = TypeVar("P", bound=MILParams)


class MILMethod(Method[P]):
    """Shared parts of the bag methods: model building and chunked, gradient-free prediction."""

    kind = "bag"
    takes_uint8 = True
    map_titles: ClassVar[dict[str, str]] = {
        "attention": "attention",
        "risk": "tile contribution to the risk",
        "value": "tile contribution to the value",
        "lesion": "tile classifier: lesion",
    }
    Params: ClassVar[type[MethodParams]] = MILParams
    attention_samples = 0  # > 0: predictions add the "attention_spread" map (`attention_spread`)

    @property
    def mil_model(self) -> MILModel:
        assert isinstance(self.model, MILModel)
        return self.model

    def build_model(self) -> nn.Module:
        p = self.params
        encoder: Encoder | NoEncoder = (
            NoEncoder(self.spec.feature_dim) if self.spec.feature_dim else self.spec.encoder()
        )
        aggregator = make_aggregator(p.aggregator, encoder.dim, self.spec.outputs, **aggregator_kwargs(p))
        if getattr(p, "bn_mode", None) == "frozen":
            freeze_batchnorm_affine(encoder)
        if wants_channels_last(self.spec.channels_last, encoder, self.device):
            # the tiles follow the weights' layout (`replay.move_chunk`), converted on the device
            encoder = encoder.to(memory_format=torch.channels_last)
        return MILModel(encoder, aggregator, tile_classifier(self.spec, encoder.dim))

    def check_instances(self) -> None:
        frozen = self.frozen_encoder() is not None
        check_support(self.spec, self.mil_model.aggregator, frozen_encoder=frozen, method=self.title())

    def instances(self, batch: Batch) -> InstanceTerm | None:
        """The batch's instance term (None without annotated tiles)."""
        return instance_term(self.spec, batch, self.mil_model.tiles)

    def features(self, sample: Sample | None, bag: torch.Tensor) -> torch.Tensor:
        """Encoder features of a bag without grad (overridden by the frozen-encoder method's cache)."""
        chunk = max(1, self.params.inference_chunk_size)
        colour = self.colour([sample]) if sample is not None else None
        return encode_chunks(self.mil_model.encoder, bag, chunk, device=self.device, colour=colour)

    def predict(self, sample: Sample) -> Prediction:
        # The bag stays on the host: `features` moves one chunk at a time.
        aggregator = self.mil_model.aggregator
        with torch.no_grad():
            z = self.features(sample, sample.x)
            logits, attention = split_head_output(aggregator(z))
            probs = self.outputs(logits)[0]
        # a head that scores no instance gives no heatmap, rather than a flat one that looks like a result
        scores = None if attention is None else attention.float().reshape(-1).cpu().numpy()
        maps = {}
        contributions = getattr(aggregator, "contributions", None)
        if self.explains_score and contributions is not None:
            with torch.no_grad():
                maps[self.score_map] = contributions(z, self.score).float().cpu().numpy()
        if self.attention_samples and attention is not None:
            maps["attention_spread"] = self.attention_spread(z, self.attention_samples)
        if self.mil_model.tiles is not None:  # what the tile classifier calls each tile
            with torch.no_grad():
                not_lesion = torch.softmax(self.mil_model.tiles(z).float(), dim=1)[:, -1]
            maps["lesion"] = (1 - not_lesion).cpu().numpy()
        return Prediction(probs=probs.cpu().numpy(), instance_scores=scores, instance_maps=maps)

    def attention_spread(self, z: torch.Tensor, samples: int, drop: float = 0.25) -> np.ndarray:
        """How unsure the head is where to look: over `samples` draws of dropout on the tile features
        (a fixed seed, so a slide always gets the same map), the standard deviation of each tile's
        attention rank as a fraction of the bag (0: always ranked alike; about 0.29: anywhere)."""
        generator = torch.Generator(device=z.device).manual_seed(0)
        ranks = []
        with torch.no_grad():
            for _ in range(samples):
                keep = torch.rand(z.shape, generator=generator, device=z.device) >= drop
                _, attention = split_head_output(self.mil_model.aggregator(z * keep / (1 - drop)))
                assert attention is not None
                order = attention.float().reshape(-1).argsort().argsort()
                ranks.append(order.float() / max(1, order.numel() - 1))
        return torch.stack(ranks).std(dim=0, correction=0).cpu().numpy()

    @property
    def score_map(self) -> str:
        """The name of the per-tile map of what the endpoint's score owes each tile."""
        return "risk" if self.spec.endpoint is not None and self.spec.endpoint.task == "survival" else "value"
