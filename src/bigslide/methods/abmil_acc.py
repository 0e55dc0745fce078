"""ABMIL-ACC: the exact full-bag gradient of encoder + attention-MIL head at chunk-sized memory.

Andersson et al., Eq. 1, through `replay_backward`: (1) encode the whole bag chunk by chunk without
grad, keeping only Z (N, D); (2) run the head once on Z with grad, which gives the head's gradients and
dL/dZ; (3) replay the encoder chunk by chunk with grad and push dL/dZ[chunk] through it. Only one
chunk's activations are alive at a time, and the head runs once per bag.

Exactness: the result equals the full-bag gradient when the encoder computes every instance
independently of the others. Encoder BatchNorm therefore runs in eval mode ("eval", the default) or
eval with frozen affine parameters ("frozen"). "batch" keeps train-mode BatchNorm with per-chunk
statistics: a different function from full-bag BatchNorm, so the gradient is not the full-bag one
(an `InexactGradientWarning` says so). Dropout and drop-path are exact: each chunk's RNG state is
saved in pass 1 and restored for its replay, so the replay draws the same masks.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from bigslide.errors import ConfigError
from bigslide.methods.base import (
    Batch,
    Method,
    MethodParams,
    Prediction,
    Sample,
    Stepper,
    StepResult,
    register,
)
from bigslide.methods.batchnorm import freeze_batchnorm_affine
from bigslide.methods.replay import (
    AutocastFactory,
    BackwardFn,
    InexactGradientWarning,
    batchnorm_layers,
    encode_chunks,
    replay_backward,
)
from bigslide.nn.backbones import create_encoder
from bigslide.nn.mil import Aggregator, LossFn, bag_loss, make_aggregator

if TYPE_CHECKING:
    from bigslide.memory.targets import Candidate, Settings, Target

BNMode = Literal["eval", "frozen", "batch"]


class BagStep(NamedTuple):
    loss: torch.Tensor  # detached scalar
    logits: torch.Tensor  # (1, C), detached
    attention: torch.Tensor | None  # (N,), detached; None when the aggregator returns bare logits


def split_head_output(output: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(logits (1, C), attention or None)` from a MIL head's output: `(logits, attention)` or bare logits.

    A head that gives no per-instance scores gets None, not made-up uniform scores: a flat heatmap would
    look like a result. Bare (C,) logits get the bag axis.
    """
    if isinstance(output, tuple | list) and len(output) == 2 and isinstance(output[0], torch.Tensor):
        logits, attention = output
        if attention is not None and not isinstance(attention, torch.Tensor):
            raise TypeError(f"aggregator output: attention must be a tensor or None, got {type(attention)}")
    elif isinstance(output, torch.Tensor):
        logits, attention = output, None
    else:
        raise TypeError(
            f"aggregator output: expected logits or (logits, attention) tensors, got {type(output).__name__}"
        )
    return (logits.unsqueeze(0) if logits.ndim == 1 else logits), attention


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


def accumulated_bag_backward(
    encoder: nn.Module,
    aggregator: nn.Module,
    bag: torch.Tensor,
    target: torch.Tensor,
    loss_fn: LossFn | None = None,
    *,
    chunk_size: int,
    forward_chunk_size: int | None = None,
    autocast: AutocastFactory | None = None,
    backward: BackwardFn | None = None,
    bn_mode: str = "eval",
    stochastic: bool | None = None,
    device: torch.device | None = None,
) -> BagStep:
    """ABMIL-ACC on one bag: leaves the full-bag gradients in `.grad` (accumulating, like `.backward()`).

    `aggregator`: any module mapping the (N, D) features to `(logits, attention)` or to bare logits
    (then `BagStep.attention` is None); an `aux_loss(target)` method, if it has one, adds to the loss.

    `chunk_size`: instances per replayed (with-grad) encoder call; sets the peak memory.
    `forward_chunk_size`: instances per no-grad encoder call in pass 1 (may be larger: nothing is kept).
    It is ignored, and pass 1 uses `chunk_size`, when the encoder is stochastic (each replay chunk must
    draw the same dropout masks as its pass-1 chunk) or uses per-chunk batch statistics.
    `stochastic`: whether the encoder draws random numbers; None detects dropout/drop-path layers.
    `backward(loss)` runs the head's backward (e.g. a stepper's, for loss scaling); dL/dZ inherits
    its scale, so the encoder's gradient is scaled the same way.
    `bag` may stay on the host, and should: each pass moves one chunk at a time to `device` (default:
    the encoder's), so device memory does not grow with the bag. On CUDA the bag is pinned (once, if
    it is not already) so the chunk copies are asynchronous.
    """

    def loss_of(Z: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None]]:
        logits, attention = split_head_output(aggregator(Z))
        loss = bag_loss(aggregator, logits, target, loss_fn)
        return loss, (logits.detach(), None if attention is None else attention.detach())

    with bn_policy(encoder, bn_mode):
        batch_stats = bn_mode == "batch" and any(layer.training for layer in batchnorm_layers(encoder))
        loss, (logits, attention) = replay_backward(
            encoder,
            bag,
            loss_of,
            chunk_size=chunk_size,
            forward_chunk_size=forward_chunk_size,
            autocast=autocast,
            backward=backward,
            batch_stats=batch_stats,
            stochastic=stochastic,
            device=device,
        )
    return BagStep(loss, logits, attention)


def bag_backward(
    encoder: nn.Module,
    aggregator: nn.Module,
    bag: torch.Tensor,
    target: torch.Tensor,
    loss_fn: LossFn | None = None,
    *,
    chunk_size: int,
    forward_chunk_size: int | None = None,
    autocast: AutocastFactory | None = None,
    bn_mode: str = "eval",
) -> torch.Tensor:
    """`accumulated_bag_backward`, returning only the detached loss."""
    return accumulated_bag_backward(
        encoder,
        aggregator,
        bag,
        target,
        loss_fn,
        chunk_size=chunk_size,
        forward_chunk_size=forward_chunk_size,
        autocast=autocast,
        bn_mode=bn_mode,
    ).loss


# ---------------------------------------------------------------------------------------------------
# Methods sharing an encoder + aggregator model.


class MILModel(nn.Module):
    """Encoder and MIL head; `forward` is the plain full-bag graph."""

    def __init__(self, encoder: nn.Module, aggregator: Aggregator) -> None:
        super().__init__()
        self.encoder = encoder
        self.aggregator = aggregator

    def forward(self, bag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.aggregator(self.encoder(bag))


@dataclass
class MILParams(MethodParams):
    aggregator: Literal["abmil", "abmil_gated", "transmil", "dtfd"] = field(
        default="abmil", metadata={"help": "MIL head: ABMIL, gated ABMIL, TransMIL or DTFD-MIL"}
    )
    hidden: int = field(
        default=256, metadata={"min": 1, "help": "size of the head's projection of the features"}
    )
    attention_dim: int = field(
        default=128,
        metadata={
            "shown_with": {"aggregator": ("abmil", "abmil_gated", "dtfd")},
            "min": 1,
            "help": "hidden size of the attention scorer",
        },
    )
    dropout: float = field(
        default=0.0, metadata={"min": 0, "max": 0.99, "help": "dropout after the head's projection"}
    )
    heads: int = field(
        default=8,
        metadata={"shown_with": {"aggregator": ("transmil",)}, "min": 1, "help": "TransMIL: attention heads"},
    )
    pseudo_bags: int = field(
        default=4,
        metadata={"shown_with": {"aggregator": ("dtfd",)}, "min": 1, "help": "DTFD: pseudo-bags per bag"},
    )
    distill: Literal["afs", "maxs"] = field(
        default="afs",
        metadata={
            "shown_with": {"aggregator": ("dtfd",)},
            "help": "DTFD: tier-2 features (attention-pooled or max-scoring instance)",
        },
    )
    inference_chunk_size: int = field(
        default=128, metadata={"min": 1, "help": "tiles per encoder call at prediction"}
    )


@dataclass
class EndToEndParams(MILParams):
    bn_mode: Literal["eval", "frozen", "batch"] = field(
        default="eval",
        metadata={"help": "encoder BatchNorm: eval (exact), frozen (exact, no BN updates), batch (inexact)"},
    )


@dataclass
class ABMILACCParams(EndToEndParams):
    chunk_size: int = field(
        default=32, metadata={"min": 1, "help": "tiles per replayed encoder call (sets memory)"}
    )
    forward_chunk_size: int = field(
        default=0, metadata={"min": 0, "help": "tiles per no-grad encoder call; 0 = 4 x chunk_size"}
    )


def aggregator_kwargs(p: MILParams) -> dict[str, Any]:
    if p.aggregator == "transmil":
        return {"hidden": p.hidden, "heads": p.heads, "dropout": p.dropout}
    kwargs: dict[str, Any] = {"hidden": p.hidden, "attention_dim": p.attention_dim, "dropout": p.dropout}
    if p.aggregator == "dtfd":
        kwargs.update(pseudo_bags=p.pseudo_bags, distill=p.distill)
    return kwargs


class MILMethod(Method):
    """Shared parts of the bag methods: model building and chunked, gradient-free prediction."""

    kind = "bag"
    takes_uint8 = True
    map_titles: ClassVar[dict[str, str]] = {"attention": "attention"}
    Params: ClassVar[type[MethodParams]] = MILParams

    @property
    def mil_params(self) -> MILParams:
        assert isinstance(self.params, MILParams)
        return self.params

    @property
    def mil_model(self) -> MILModel:
        assert isinstance(self.model, MILModel)
        return self.model

    def build_model(self) -> nn.Module:
        p = self.mil_params
        encoder = create_encoder(
            self.spec.backbone, pretrained=self.spec.pretrained, weights=self.spec.weights
        )
        aggregator = make_aggregator(p.aggregator, encoder.dim, self.spec.num_classes, **aggregator_kwargs(p))
        if getattr(p, "bn_mode", None) == "frozen":
            freeze_batchnorm_affine(encoder)
        return MILModel(encoder, aggregator)

    def features(self, sample: Sample | None, bag: torch.Tensor) -> torch.Tensor:
        """Encoder features of a bag without grad (overridden by the frozen-encoder method's cache)."""
        chunk = max(1, self.mil_params.inference_chunk_size)
        return encode_chunks(self.mil_model.encoder, bag, chunk, device=self.device)

    def predict(self, sample: Sample) -> Prediction:
        # The bag stays on the host: `features` moves one chunk at a time.
        with torch.no_grad():
            logits, attention = self.mil_model.aggregator(self.features(sample, sample.x))
            probs = F.softmax(logits.float(), dim=-1)[0]
        return Prediction(probs=probs.cpu().numpy(), instance_scores=attention.float().cpu().numpy())


@register
class ABMILACC(MILMethod):
    name = "abmil_acc"
    Params = ABMILACCParams
    summary = "End-to-end attention MIL on whole bags: exact full-bag gradients, chunk-sized memory."
    memory_params = ("chunk_size", "forward_chunk_size")
    plan_preference = 3

    @classmethod
    def plan(cls, target: Target, settings: Settings) -> list[Candidate]:
        from bigslide.memory.targets import Candidate
        from bigslide.methods.calibration import calibrate_abmil_acc

        chunks = [c for c in (256, 128, 64, 32, 16, 8, 4, 2, 1) if c <= target.bag]
        model = calibrate_abmil_acc(settings, target.tile, chunks[0], name=cls.name)
        input_bytes = 12 * target.bag * target.tile**2
        return [
            Candidate(
                cls.name,
                {"chunk_size": c},
                model.peak(tiles=target.bag, chunk=c, input_bytes=input_bytes),
                note=f"{math.ceil(target.bag / c)} replay chunks",
                rank=math.ceil(target.bag / c),
            )
            for c in chunks
        ]

    def train_step(self, batch: Batch, stepper: Stepper) -> StepResult:
        p = self.params
        assert isinstance(p, ABMILACCParams)
        model = self.mil_model
        step = accumulated_bag_backward(
            model.encoder,
            model.aggregator,
            batch.x,  # host memory (pinned on CUDA): moved chunk by chunk, never whole
            batch.y.to(self.device),
            chunk_size=p.chunk_size,
            forward_chunk_size=p.forward_chunk_size or 4 * p.chunk_size,
            autocast=stepper.autocast,
            backward=stepper.backward,
            bn_mode=p.bn_mode,
            device=self.device,
        )
        stepper.step()
        return StepResult(loss=float(step.loss), logits=step.logits.float())
