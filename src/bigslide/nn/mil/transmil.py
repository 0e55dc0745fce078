"""TransMIL (Shao et al., NeurIPS 2021) with exact softmax attention.

The original uses Nyström attention to avoid the N x N attention matrix. Here both layers use
torch's `nn.MultiheadAttention`, whose fused (flash) kernel computes exact softmax attention in
O(N) memory, so the head is exact (no landmark approximation) and still never holds an N x N tensor.
Only the class token feeds the classifier, so the second layer computes attention for the class-token
query alone: the result equals full self-attention for that token, and its attention row (1 x S,
averaged over heads) is the per-instance score.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bigslide.nn.mil.base import Aggregator


class PPEG(nn.Module):
    """Pyramid position encoding: depthwise 7x7 + 5x5 + 3x3 convolutions plus identity on the square grid."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv7 = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.conv5 = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        self.conv3 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, tokens: torch.Tensor, side: int) -> torch.Tensor:
        cls_token, feats = tokens[:, :1], tokens[:, 1:]
        grid = feats.transpose(1, 2).reshape(1, -1, side, side)
        grid = grid + self.conv7(grid) + self.conv5(grid) + self.conv3(grid)
        return torch.cat([cls_token, grid.flatten(2).transpose(1, 2)], dim=1)


class TransLayer(nn.Module):
    """Pre-norm residual self-attention, as in TransMIL."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        normed = self.norm(tokens)
        return tokens + self.attn(normed, normed, normed, need_weights=False)[0]

    def class_token(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output for token 0 only, and token 0's attention to every token (S,)."""
        normed = self.norm(tokens)
        out, weights = self.attn(normed[:, :1], normed, normed, need_weights=True, average_attn_weights=True)
        return tokens[:, :1] + out, weights[0, 0]


class TransMIL(Aggregator):
    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        *,
        hidden: int = 256,
        heads: int = 8,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.in_dim, self.num_classes = in_dim, num_classes
        self.project = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU())
        self.cls_token = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.layer1 = TransLayer(hidden, heads, dropout)
        self.ppeg = PPEG(hidden)
        self.layer2 = TransLayer(hidden, heads, dropout)
        self.norm = nn.LayerNorm(hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = z.shape[0]
        h = self.project(z)
        side = math.ceil(math.sqrt(n))
        # Fill the square grid by repeating the first instances, as TransMIL does.
        pad_index = torch.arange(side * side - n, device=z.device) % n
        h = torch.cat([h, h[pad_index]]).unsqueeze(0)
        tokens = torch.cat([self.cls_token.to(h.dtype), h], dim=1)
        tokens = self.ppeg(self.layer1(tokens), side)
        cls_out, weights = self.layer2.class_token(tokens)
        logits = self.classifier(self.norm(cls_out[:, 0]))
        # Padding tokens are copies of instances: their attention goes back to the instance.
        attention = weights[1 : n + 1].clone()
        attention.index_add_(0, pad_index, weights[n + 1 :])
        return logits, attention
