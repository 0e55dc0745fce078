"""The upstream PatchGD training loop (nyunAI/PatchGD), written plainly, to measure beside ours in one run.

It keeps the reference's structure: an encoder whose classifier maps to the latent size (the reference uses
torchvision's resnet18 with a new `fc`; here `timm.create_model(backbone, num_classes=latent)`, the same
network for resnet18, so `--backbone` changes both sides alike), a per-position `DataLoader` over patch
positions shuffled once per pass (batch = ⌈positions · sampling⌉ positions × all images), Z filled in those
small calls under `no_grad`, then ζ inner iterations that re-encode one loader batch with grad, write it
into the detached Z, run the CNN head (1 same + 3 reducing Conv-ReLU-BN-Dropout blocks, width 256) and
back-propagate loss/ε, with an Adam step every ε iterations. Mixed precision, when asked for, wraps the
forward passes in the same autocast as ours (the reference itself has none).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _Positions(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, images: torch.Tensor, per_side: int, patch: int) -> None:
        self.images, self.per_side, self.patch = images, per_side, patch

    def __len__(self) -> int:
        return self.per_side**2

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        row, col = divmod(index, self.per_side)
        p = self.patch
        return self.images[:, :, row * p : (row + 1) * p, col * p : (col + 1) * p], index


def _cnn_head(latent: int, width: int, per_side: int, classes: int) -> nn.Module:
    def block(channels: int, stride: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(channels, width, 3, stride, 1), nn.ReLU(), nn.BatchNorm2d(width), nn.Dropout2d(0.2)
        )

    body = nn.Sequential(block(latent, 1), *(block(width, 2) for _ in range(3)))
    with torch.no_grad():
        flat = body(torch.zeros(2, latent, per_side, per_side)).flatten(1).shape[1]
    return nn.Sequential(body, nn.Flatten(), nn.Linear(flat, classes))


def reference_step(
    *,
    backbone: str = "resnet18",
    patch: int = 128,
    per_side: int = 4,
    batch: int = 2,
    sampling: float = 0.125,
    zeta: int = 8,
    epsilon: int = 8,
    latent: int = 256,
    classes: int = 10,
    device: str = "cpu",
    amp: str = "none",
) -> Callable[[torch.Tensor, torch.Tensor], int]:
    """A function running one outer step of the reference loop on (images, labels); returns the number of
    optimizer steps it took. Images (batch, 3, per_side·patch, per_side·patch) may live on the host: they
    are moved to `device` inside the step, as ours moves its batch."""
    import timm

    where = torch.device(device)
    encoder = timm.create_model(backbone, num_classes=latent).to(where)
    head = _cnn_head(latent, 256, per_side, classes).to(where)
    optimizer = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    dtype = AMP_DTYPES.get(amp) if where.type == "cuda" else None

    def autocast() -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(where.type, dtype=dtype) if dtype else contextlib.nullcontext()

    def encode(patches: torch.Tensor, images: int) -> torch.Tensor:
        out: torch.Tensor = encoder(patches.reshape(-1, 3, patch, patch))
        return out.reshape(-1, images, latent).permute(1, 2, 0)

    def step(images: torch.Tensor, labels: torch.Tensor) -> int:
        images, labels = images.to(where), labels.to(where)
        n = images.shape[0]
        encoder.train()
        head.train()
        positions = _Positions(images, per_side, patch)
        z = torch.zeros(n, latent, per_side, per_side, device=where)
        loader = DataLoader(positions, batch_size=math.ceil(len(positions) * sampling), shuffle=True)
        with torch.no_grad(), autocast():
            for patches, index in loader:
                index = index.to(where)
                z[:, :, index // per_side, index % per_side] = encode(patches, n).float()
        optimizer.zero_grad()
        steps = 0
        for iteration, (patches, index) in enumerate(loader):
            z = z.detach()
            index = index.to(where)
            with autocast():
                z[:, :, index // per_side, index % per_side] = encode(patches, n).float()
                loss = criterion(head(z), labels) / epsilon
            loss.backward()
            if (iteration + 1) % epsilon == 0:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
            if iteration + 1 >= zeta:
                break
        return steps

    return step
