"""The aggregator interface shared by every MIL pooling head."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

# A loss on (logits (1, C), target (1,)) returning a scalar.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Aggregator(nn.Module):
    """Pools one bag of instance features into bag logits.

    `forward(z)` takes (N, D) features and returns `(logits (1, C), attention (N,))`, where attention is
    a non-negative per-instance score (summing to at most 1) used for heatmaps. Heads with an auxiliary
    training objective (DTFD's tier-1 loss) return it from `aux_loss` after a forward; it is added to
    the bag loss by `bag_loss`.
    """

    in_dim: int
    num_classes: int

    def aux_loss(self, target: torch.Tensor) -> torch.Tensor | None:
        """Extra loss from the last forward pass, or None."""
        return None


def bag_loss(
    aggregator: nn.Module,
    logits: torch.Tensor,
    target: torch.Tensor,
    loss_fn: LossFn | None = None,
) -> torch.Tensor:
    """`loss_fn(logits, target)` (cross-entropy by default) plus the aggregator's auxiliary loss (DTFD's
    tier 1), when it has an `aux_loss`: a plain head module from a script has none."""
    loss = (loss_fn or F.cross_entropy)(logits, target)
    aux_loss = getattr(aggregator, "aux_loss", None)
    aux = aux_loss(target) if aux_loss is not None else None
    return loss if aux is None else loss + aux


def attention_mlp(in_dim: int, attention_dim: int, gated: bool) -> nn.Module:
    """Ilse et al.'s attention scorer, ungated (tanh) or gated (tanh ⊙ sigmoid): (N, D) -> (N,)."""
    return GatedAttentionScore(in_dim, attention_dim) if gated else AttentionScore(in_dim, attention_dim)


class AttentionScore(nn.Module):
    def __init__(self, in_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.V = nn.Linear(in_dim, attention_dim)
        self.w = nn.Linear(attention_dim, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.w(torch.tanh(self.V(h))).squeeze(-1)


class GatedAttentionScore(nn.Module):
    def __init__(self, in_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.V = nn.Linear(in_dim, attention_dim)
        self.U = nn.Linear(in_dim, attention_dim)
        self.w = nn.Linear(attention_dim, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.w(torch.tanh(self.V(h)) * torch.sigmoid(self.U(h))).squeeze(-1)


class AttentionPool(nn.Module):
    """Softmax attention over instances and the attention-weighted mean: (N, D) -> ((D,), (N,))."""

    def __init__(self, in_dim: int, attention_dim: int, gated: bool) -> None:
        super().__init__()
        self.score = attention_mlp(in_dim, attention_dim, gated)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attention = torch.softmax(self.score(h), dim=0)
        return attention @ h, attention


def projection(in_dim: int, hidden: int, dropout: float) -> nn.Sequential:
    """The small D -> hidden projection every head starts with."""
    layers: list[nn.Module] = [nn.Linear(in_dim, hidden), nn.ReLU()]
    if dropout > 0:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)
