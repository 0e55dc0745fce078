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

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from bigslide.data.colour import RowColour
from bigslide.data.transfer import send
from bigslide.methods.base import (
    Batch,
    Stepper,
    StepResult,
    register,
)
from bigslide.methods.instances import InstanceTerm, with_instances
from bigslide.methods.mil import BagStep, EndToEndParams, MILMethod, bn_policy
from bigslide.methods.replay import (
    AutocastFactory,
    BackwardFn,
    batchnorm_layers,
    replay_backward,
)
from bigslide.nn.mil import LossFn
from bigslide.nn.mil.base import batch_loss

if TYPE_CHECKING:
    from bigslide.memory.targets import Candidate, Settings, Target


def accumulated_bag_backward(
    encoder: nn.Module,
    aggregator: nn.Module,
    bag: torch.Tensor,
    target: torch.Tensor,
    loss_fn: LossFn | None = None,
    *,
    chunk_size: int,
    sizes: Sequence[int] | None = None,
    forward_chunk_size: int | None = None,
    autocast: AutocastFactory | None = None,
    backward: BackwardFn | None = None,
    bn_mode: str = "eval",
    stochastic: bool | None = None,
    device: torch.device | None = None,
    colour: RowColour | None = None,
    instance: InstanceTerm | None = None,
) -> BagStep:
    """ABMIL-ACC on one bag, or a batch of bags: leaves the full-batch gradients in `.grad`
    (accumulating, like `.backward()`).

    `sizes`: the batch's bags lie one after another in `bag`, `sizes[b]` tiles each (None: one bag).
    The encoder treats every tile on its own, so the bags are encoded together and the head runs on
    each bag's features; `loss_fn` then sees all the bags' logits at once (Cox over a batch).

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
    it is not already) so the chunk copies are asynchronous. `colour`: the tiles' stain maps, applied
    to each chunk on the device. `instance`: the loss on annotated tiles, added to the bag loss on Z, so
    its dL/dZ rows are replayed with the bag loss's (`bigslide.methods.instances`).
    """

    def loss_of(Z: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None]]:
        loss, logits, attention = batch_loss(aggregator, Z, sizes or [Z.shape[0]], target, loss_fn)
        loss = with_instances(loss, instance, aggregator, Z)
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
            colour=colour,
        )
    return BagStep(loss, logits, attention)


def bag_backward(*args: Any, **kwargs: Any) -> torch.Tensor:
    """`accumulated_bag_backward` with the same arguments, returning only the detached loss."""
    return accumulated_bag_backward(*args, **kwargs).loss


@dataclass
class ABMILACCParams(EndToEndParams):
    chunk_size: int = field(
        default=32,
        metadata={
            "label": "tiles per pass with gradients",
            "min": 1,
            "help": "tiles per replayed encoder call (sets memory)",
        },
    )
    forward_chunk_size: int = field(
        default=0,
        metadata={
            "label": "tiles per pass without gradients (0 = auto)",
            "min": 0,
            "help": "tiles per no-grad encoder call; 0 = 4 x chunk_size",
        },
    )


@register
class ABMILACC(MILMethod[ABMILACCParams]):
    name = "abmil_acc"
    display_name = "ABMIL-ACC"
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
        model = self.mil_model
        step = accumulated_bag_backward(
            model.encoder,
            model.aggregator,
            batch.x,  # host memory (pinned on CUDA): moved chunk by chunk, never whole
            send(batch.y, self.device),
            self.loss,
            chunk_size=p.chunk_size,
            sizes=batch.sizes,
            forward_chunk_size=p.forward_chunk_size or 4 * p.chunk_size,
            autocast=stepper.autocast,
            backward=stepper.backward,
            bn_mode=p.bn_mode,
            device=self.device,
            colour=self.colour(batch.samples),
            instance=self.instances(batch),
        )
        stepper.step()
        return StepResult(loss=step.loss, logits=step.logits.float())
