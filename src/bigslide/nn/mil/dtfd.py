"""DTFD-MIL (Zhang et al., CVPR 2022): double-tier feature distillation over pseudo-bags.

Tier 1 splits the bag into random pseudo-bags, pools each with gated attention and classifies it
with its own classifier (every pseudo-bag inherits the bag label: `aux_loss`). Tier 2 pools one
distilled feature per pseudo-bag with a second gated-attention head into the bag prediction.
Distillation: "afs" takes the pseudo-bag's attention-pooled feature, "maxs" the feature of the
instance the tier-1 classifier's class-activation map finds most positive.

The split draws from torch's global RNG in training (so an RNG replay reproduces it) and from a
fixed seed in eval (so predictions and heatmaps are reproducible).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from bigslide.nn.mil.base import Aggregator, AttentionPool, LossFn, projection

Distill = Literal["afs", "maxs"]


class DTFD(Aggregator):
    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        *,
        hidden: int = 256,
        attention_dim: int = 128,
        pseudo_bags: int = 4,
        distill: Distill = "afs",
        dropout: float = 0.0,
        eval_seed: int = 0,
    ) -> None:
        super().__init__()
        if distill not in ("afs", "maxs"):
            raise ValueError(f"distill must be 'afs' or 'maxs', not {distill!r}")
        self.in_dim, self.num_classes = in_dim, num_classes
        self.pseudo_bags, self.distill, self.eval_seed = pseudo_bags, distill, eval_seed
        self.project = projection(in_dim, hidden, dropout)
        self.tier1_pool = AttentionPool(hidden, attention_dim, gated=True)
        self.tier1_classifier = nn.Linear(hidden, num_classes)
        self.tier2_pool = AttentionPool(hidden, attention_dim, gated=True)
        self.tier2_classifier = nn.Linear(hidden, num_classes)
        self._tier1_logits: torch.Tensor | None = None

    def split(self, n: int, device: torch.device) -> list[torch.Tensor]:
        """Instance indices of each pseudo-bag."""
        if self.training:
            order = torch.randperm(n, device=device)
        else:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.eval_seed)).to(device)
        return list(torch.tensor_split(order, min(self.pseudo_bags, n)))

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.project(z)
        groups = self.split(h.shape[0], h.device)
        distilled, tier1_logits, tier1_attention = [], [], []
        for index in groups:
            members = h[index]
            attention = torch.softmax(self.tier1_pool.score(members), dim=0)
            weighted = attention.unsqueeze(1) * members
            pooled = weighted.sum(0)
            tier1_logits.append(self.tier1_classifier(pooled))
            tier1_attention.append(attention)
            if self.distill == "afs":
                distilled.append(pooled)
            else:
                # Class-activation map of each instance (classifier weights, no bias), as in DTFD.
                cam = weighted @ self.tier1_classifier.weight.t()
                positive = 1.0 - torch.softmax(cam, dim=1)[:, 0]
                distilled.append(members[positive.argmax()])
        self._tier1_logits = torch.stack(tier1_logits)
        pooled2, group_attention = self.tier2_pool(torch.stack(distilled))
        logits = self.tier2_classifier(pooled2).unsqueeze(0)
        order = torch.cat(groups)
        scores = torch.cat([a * group_attention[g] for g, a in enumerate(tier1_attention)])
        attention = torch.empty_like(scores).index_copy(0, order, scores)
        return logits, attention

    def instance_logits(self, z: torch.Tensor) -> torch.Tensor:
        """(N,) each instance's tier-1 attention score before the softmax (the pseudo-bag it falls in
        does not change it): what teaching annotations supervise."""
        return self.tier1_pool.score(self.project(z))

    def aux_loss(self, target: torch.Tensor, loss_fn: LossFn = F.cross_entropy) -> torch.Tensor | None:
        """Tier-1 loss: every pseudo-bag gets the bag's target (`loss_fn`, cross-entropy for classes)."""
        if self._tier1_logits is None:
            return None
        logits = self._tier1_logits
        return loss_fn(logits, target.expand(logits.shape[0], *target.shape[1:]))
