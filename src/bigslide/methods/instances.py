"""The instance loss: tiles inside teaching annotations (`bigslide.tiling.annotations`) get labels beside the
slide's label, and the bag methods add a loss on them to the bag loss.

Two forms (`data.instance_loss`):
- "attention": the head's attention score of each annotated tile (before the softmax) is pushed up for
  a tile of one of the task's classes and down for a "Not lesion" tile (binary cross-entropy on the
  score): the annotations say where to look. Needs a head that scores each tile on its own (ABMIL,
  gated ABMIL, DTFD's tier 1); TransMIL's attention mixes tiles through self-attention.
- "tiles": a per-tile classifier on the encoder's features (the task's classes and "Not lesion",
  cross-entropy): the annotations shape the encoder's features. Any head; not with a frozen encoder,
  whose features it cannot change.

Either way the loss depends on each tile's features only, so ABMIL-ACC gives its exact gradient: the
term joins the head's loss on Z, its dL/dz rows join dL/dZ and each chunk's replay pushes both through
the encoder, while the tile classifier gets its gradient once, with the head's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from bigslide.data.transfer import send
from bigslide.errors import ConfigError
from bigslide.tiling.annotations import UNLABELLED

if TYPE_CHECKING:
    from bigslide.data.sample import Batch
    from bigslide.methods.base import ModelSpec


def instance_class_count(spec: ModelSpec) -> int:
    """Labels an annotated tile may have: the task's classes (one for a task without classes) and
    "Not lesion", the last."""
    if spec.endpoint is not None:
        return len(spec.endpoint.instance_classes)
    return spec.num_classes + 1


def tile_classifier(spec: ModelSpec, dim: int) -> nn.Linear | None:
    """The per-tile classifier a model carries when annotations teach "tiles" (None otherwise)."""
    return nn.Linear(dim, instance_class_count(spec)) if spec.instance_loss == "tiles" else None


def scores_tiles(aggregator: nn.Module) -> bool:
    """Whether a MIL head gives each tile an attention score of its own (`instance_logits`)."""
    return callable(getattr(aggregator, "instance_logits", None))


def check_support(spec: ModelSpec, aggregator: nn.Module, *, frozen_encoder: bool, method: str) -> None:
    """A `ConfigError` naming why annotations cannot teach this model in the form asked for."""
    if spec.instance_loss == "attention" and not scores_tiles(aggregator):
        raise ConfigError(
            f"data.instance_loss: attention: {method}'s MIL head ({type(aggregator).__name__}) gives no "
            "tile an attention score of its own (TransMIL's mixes tiles through self-attention); set "
            "data.instance_loss: tiles, or another method.params.aggregator"
        )
    if spec.instance_loss == "tiles" and frozen_encoder:
        raise ConfigError(
            f"data.instance_loss: tiles: {method} keeps its encoder frozen, and a tile classifier on "
            "frozen features cannot change what the attention sees; set data.instance_loss: attention"
        )


@dataclass
class InstanceTerm:
    """The weighted instance loss of a batch's annotated tiles, as a function of their features.

    `labels`: (N,) one per tile of the batch, in the order of its features (`UNLABELLED` where none);
    `mode`: "attention" or "tiles"; `not_lesion`: the label of "Not lesion" (the last).
    """

    labels: torch.Tensor
    weight: float
    mode: str
    not_lesion: int
    tile_head: nn.Module | None = None

    def __call__(self, aggregator: nn.Module, z: torch.Tensor) -> torch.Tensor:
        """`weight` times the mean loss over the annotated tiles of `z` (N, D)."""
        # The annotated rows are found where the labels are (the host): a mask on the device would make
        # the host wait for its count.
        rows = (self.labels != UNLABELLED).nonzero().squeeze(1)
        z, labels = z.index_select(0, send(rows, z.device)), send(self.labels[rows], z.device)
        if self.mode == "tiles":
            assert self.tile_head is not None
            loss = F.cross_entropy(self.tile_head(z), labels)
        else:
            scores = aggregator.instance_logits(z)  # type: ignore[operator]
            loss = F.binary_cross_entropy_with_logits(scores, (labels != self.not_lesion).to(scores.dtype))
        return self.weight * loss


def instance_term(spec: ModelSpec, batch: Batch, tile_head: nn.Module | None) -> InstanceTerm | None:
    """The batch's instance term, or None when annotations do not teach this run or no tile of the batch
    is annotated."""
    labels = batch.instance_labels
    if spec.instance_loss is None or labels is None or not bool((labels != UNLABELLED).any()):
        return None
    return InstanceTerm(
        labels, spec.instance_weight, spec.instance_loss, instance_class_count(spec) - 1, tile_head
    )


def with_instances(
    loss: torch.Tensor, term: InstanceTerm | None, aggregator: nn.Module, z: torch.Tensor
) -> torch.Tensor:
    """`loss` plus the instance term on features `z` (the loss alone without one)."""
    return loss if term is None else loss + term(aggregator, z)
