"""Attention-based MIL pooling (Ilse, Tomczak & Welling, ICML 2018), ungated and gated."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from bigslide.nn.mil.base import Aggregator, AttentionPool, projection


class ABMIL(Aggregator):
    """Project D -> hidden, softmax attention over instances, attention-weighted mean, linear classifier."""

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        *,
        hidden: int = 256,
        attention_dim: int = 128,
        gated: bool = False,
        dropout: float = 0.0,
        attention: str = "softmax",
    ) -> None:
        super().__init__()
        self.in_dim, self.num_classes = in_dim, num_classes
        self.project = projection(in_dim, hidden, dropout)
        self.pool = AttentionPool(hidden, attention_dim, gated, attention)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled, attention = self.pool(self.project(z))
        return self.classifier(pooled).unsqueeze(0), attention

    def instance_logits(self, z: torch.Tensor) -> torch.Tensor:
        """(N,) each instance's attention score before the softmax (or sigmoid): what teaching
        annotations supervise, one instance at a time."""
        return self.pool.score(self.project(z))

    def contributions(self, z: torch.Tensor, score: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Each instance's share of `score(logits)` (N,): the score minus the score of the bag without
        that instance. Leaving instance i out renormalises the pool (softmax: (M - a_i h_i) / (1 - a_i)),
        so every instance's leave-one-out score is one batched head call."""
        h = self.project(z)
        pooled, attention = self.pool(h)
        without = self.pool.without_each(pooled, attention, h)
        whole = score(self.classifier(pooled).unsqueeze(0))
        return whole - score(self.classifier(without))
