"""Classifier heads that read a whole PatchGD Z-block (B, s, rows, cols) and give class logits (B, C).

Both work on any grid, from 1 x 1 up, and with batch size 1 (see `CNNHead` for the one exception).
"""

from __future__ import annotations

import itertools
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from bigslide.errors import ConfigError

HeadName = Literal["cnn", "transformer", "pool"]
NormName = Literal["batch", "group"]


class ConvBlock(nn.Module):
    """Conv 3x3 - ReLU - Norm - Dropout. The conv halves the grid while its shorter side is >= 4, so the
    receptive field spans large grids, and keeps it (padding 1) below that, so small grids never vanish."""

    def __init__(self, in_channels: int, out_channels: int, dropout: float, norm: NormName) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.norm: nn.Module = (
            nn.BatchNorm2d(out_channels)
            if norm == "batch"
            else nn.GroupNorm(_groups(out_channels), out_channels)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stride = 2 if min(x.shape[-2:]) >= 4 else 1
        x = F.relu(F.conv2d(x, self.conv.weight, self.conv.bias, stride=stride, padding=1))
        if (
            self.training
            and isinstance(self.norm, nn.BatchNorm2d)
            and x.shape[0] * x.shape[2] * x.shape[3] == 1
        ):
            raise ConfigError(
                "method.params.head_norm: BatchNorm cannot train on one value per channel "
                "(batch size 1 and a 1 x 1 Z grid); use head_norm='group', a larger batch or a smaller patch"
            )
        return self.dropout(self.norm(x))


class CNNHead(nn.Module):
    """The paper's head: `depth` x (Conv-ReLU-BN-Dropout), global mean and max pooling, Linear.

    BatchNorm normalises over batch x rows x cols values, so batch 1 on a 2 x 2 grid trains; only a 1 x 1
    grid with batch 1 cannot (a `ConfigError` says to use `norm="group"`). Max pooling sits beside the mean
    because with batch 1 a train-mode BatchNorm makes every channel's spatial mean exactly its bias: a
    mean-only head would then ignore its input.
    """

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        *,
        width: int = 256,
        depth: int = 4,
        dropout: float = 0.2,
        norm: NormName = "batch",
    ) -> None:
        super().__init__()
        dims = [in_dim] + [width] * depth
        self.blocks = nn.Sequential(*(ConvBlock(a, b, dropout, norm) for a, b in itertools.pairwise(dims)))
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, Z: torch.Tensor) -> torch.Tensor:
        x = self.blocks(Z)
        return self.fc(torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1))


class TransformerHead(nn.Module):
    """One pre-norm multi-head self-attention layer (with its MLP) over a CLS token and the rows x cols Z
    vectors, then LayerNorm and Linear on the CLS token (paper §4.2: 2 heads of 192 channels).

    Positions: a learned `base_grid` x `base_grid` 2-D embedding, bilinearly resized to the Z grid, so one
    head serves images of any size.
    """

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        *,
        width: int = 384,
        heads: int = 2,
        dropout: float = 0.1,
        base_grid: int = 16,
    ) -> None:
        super().__init__()
        if width % heads:
            raise ConfigError(
                f"method.params.head_width: {width} is not divisible by the {heads} attention heads"
            )
        self.proj = nn.Linear(in_dim, width)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.position = nn.Parameter(torch.zeros(1, width, base_grid, base_grid))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.position, std=0.02)
        self.block = nn.TransformerEncoderLayer(
            width,
            heads,
            dim_feedforward=2 * width,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, Z: torch.Tensor) -> torch.Tensor:
        batch, _, rows, cols = Z.shape
        tokens = self.proj(Z.flatten(2).transpose(1, 2))
        position: torch.Tensor = self.position
        if position.shape[-2:] != (rows, cols):
            position = F.interpolate(position, size=(rows, cols), mode="bilinear", align_corners=False)
        tokens = tokens + position.flatten(2).transpose(1, 2)
        x = self.block(torch.cat([self.cls_token.expand(batch, -1, -1), tokens], dim=1))
        return self.fc(self.norm(x[:, 0]))


class PoolHead(nn.Module):
    """The mean and the maximum of every latent channel over the Z-block's cells, then Linear.

    No layer between the cells and the classifier: with an encoder trained from random weights, whose
    cells barely differ at first, the CNN head's normalisation blows those differences up into noise
    that its many weights fit (the training loss rose above chance on the UltraMNIST bench); here the
    head's gradient reaches the encoder unmixed. Max pooling lets one cell (one lesion, one digit) decide.
    """

    def __init__(self, in_dim: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(2 * in_dim, num_classes)

    def forward(self, Z: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([Z.mean(dim=(2, 3)), Z.amax(dim=(2, 3))], dim=1))


def make_head(
    name: HeadName,
    in_dim: int,
    num_classes: int,
    *,
    width: int = 0,
    dropout: float = 0.2,
    norm: NormName = "batch",
    heads: int = 2,
) -> nn.Module:
    """A Z-block head by name.

    `width` 0 = the paper's: 256 channels for "cnn", 384 (2 heads x 192) for "transformer"; "pool" has
    no width, dropout or norm (mean and max over the cells, then Linear).
    """
    if name == "cnn":
        return CNNHead(in_dim, num_classes, width=width or 256, dropout=dropout, norm=norm)
    if name == "transformer":
        return TransformerHead(in_dim, num_classes, width=width or 384, heads=heads, dropout=dropout)
    if name == "pool":
        return PoolHead(in_dim, num_classes)
    raise ConfigError(f"method.params.head: unknown head {name!r}; choose 'cnn', 'transformer' or 'pool'")


def _groups(channels: int) -> int:
    for groups in (32, 16, 8, 4, 2):
        if channels % groups == 0:
            return groups
    return 1
