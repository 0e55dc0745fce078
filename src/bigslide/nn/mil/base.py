"""The aggregator interface shared by every MIL pooling head."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

# A loss on (logits (B, C), targets (B, ...)) returning a scalar.
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

    def aux_loss(self, target: torch.Tensor, loss_fn: LossFn = F.cross_entropy) -> torch.Tensor | None:
        """Extra loss from the last forward pass (`loss_fn` on auxiliary logits), or None."""
        return None


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


def bag_loss(
    aggregator: nn.Module,
    logits: torch.Tensor,
    target: torch.Tensor,
    loss_fn: LossFn | None = None,
) -> torch.Tensor:
    """`loss_fn(logits, target)` (cross-entropy by default) plus the aggregator's auxiliary loss (DTFD's
    tier 1), when it has an `aux_loss`: a plain head module from a script has none."""
    loss_fn = loss_fn or F.cross_entropy
    loss = loss_fn(logits, target)
    aux = _aux_loss(aggregator, target, loss_fn)
    return loss if aux is None else loss + aux


def _aux_loss(aggregator: nn.Module, target: torch.Tensor, loss_fn: LossFn) -> torch.Tensor | None:
    aux_loss = getattr(aggregator, "aux_loss", None)
    return aux_loss(target, loss_fn) if aux_loss is not None else None


def batch_loss(
    aggregator: nn.Module,
    features: torch.Tensor,
    sizes: Sequence[int],
    target: torch.Tensor,
    loss_fn: LossFn | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The head on each bag of a batch: `features` holds the bags' instances one bag after another
    (`sizes` instances each). Returns the batch loss (`loss_fn` over the stacked bag logits, plus the
    mean of the heads' auxiliary losses), the (B, C) logits and the instances' attention (None when
    the head gives none). One bag gives exactly `bag_loss`.
    """
    loss_fn = loss_fn or F.cross_entropy
    logits, attention, aux = [], [], []
    for b, z in enumerate(features.split(list(sizes))):
        bag_logits, bag_attention = split_head_output(aggregator(z))
        logits.append(bag_logits)
        attention.append(bag_attention)
        extra = _aux_loss(aggregator, target[b : b + 1], loss_fn)  # from this bag's forward
        if extra is not None:
            aux.append(extra)
    stacked = torch.cat(logits)
    loss = loss_fn(stacked, target)
    if aux:
        loss = loss + torch.stack(aux).mean()
    scores = None if any(a is None for a in attention) else torch.cat(attention)  # type: ignore[arg-type]
    return loss, stacked, scores


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
    """Attention over instances and the attention-weighted pool: (N, D) -> ((D,), (N,)).

    softmax: weights summing to 1 (Ilse et al.): the pooled feature says what the attended tiles hold,
    whatever their number. sigmoid: each weight in (0, 1), pooled as the mean over the bag: the pooled
    feature grows with how much of the slide holds what is attended (a burden: survival, regression).
    """

    def __init__(self, in_dim: int, attention_dim: int, gated: bool, norm: str = "softmax") -> None:
        super().__init__()
        self.score = attention_mlp(in_dim, attention_dim, gated)
        self.norm = norm

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.norm == "sigmoid":
            attention = torch.sigmoid(self.score(h))
            return attention @ h / h.shape[0], attention
        attention = torch.softmax(self.score(h), dim=0)
        return attention @ h, attention

    def without_each(self, pooled: torch.Tensor, attention: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """(N, D): the pooled feature of the bag without instance i, for every i (the others' weights are
        renormalised as pooling them alone would)."""
        if self.norm == "sigmoid":
            n = h.shape[0]
            return (n * pooled.unsqueeze(0) - attention.unsqueeze(1) * h) / max(n - 1, 1)
        rest = (1 - attention).clamp_min(1e-12).unsqueeze(1)
        return (pooled.unsqueeze(0) - attention.unsqueeze(1) * h) / rest


def projection(in_dim: int, hidden: int, dropout: float) -> nn.Sequential:
    """The small D -> hidden projection every head starts with."""
    layers: list[nn.Module] = [nn.Linear(in_dim, hidden), nn.ReLU()]
    if dropout > 0:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)
