"""The reference implementation's PatchGD outer step, written plainly, to time beside ours in one run.

It keeps the reference's structure: a torchvision ResNet whose `fc` maps to the latent size, a per-position
`DataLoader` over patch positions shuffled once per pass (batch = ⌈positions · sampling⌉ positions × all
images), Z filled in those small calls under `no_grad`, then ζ inner iterations that re-encode one loader
batch with grad, write it into the detached Z, run the CNN head (1 same + 3 reducing Conv-ReLU-BN-Dropout
blocks, width 256) and back-propagate loss/ε, with an Adam step every ε iterations. Only the timing is used.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


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


def reference_step_times(
    *,
    repeats: int,
    size: int = 512,
    batch: int = 2,
    patch: int = 128,
    sampling: float = 0.125,
    zeta: int = 8,
    epsilon: int = 8,
    latent: int = 256,
    classes: int = 10,
    device: str = "cpu",
) -> list[float]:
    """Seconds per outer step (after one warm-up step) of the reference-structured PatchGD loop."""
    from torchvision.models import resnet18

    torch.manual_seed(0)
    where = torch.device(device)
    per_side = size // patch
    encoder = resnet18()
    encoder.fc = nn.Linear(encoder.fc.in_features, latent)
    head = _cnn_head(latent, 256, per_side, classes)
    encoder, head = encoder.to(where), head.to(where)
    optimizer = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    images = torch.rand(batch, 3, size, size, device=where)
    labels = torch.randint(0, classes, (batch,), device=where)
    positions = _Positions(images, per_side, patch)

    def encode(patches: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = encoder(patches.reshape(-1, 3, patch, patch))
        return out.reshape(-1, batch, latent).permute(1, 2, 0)

    def step() -> None:
        encoder.train()
        head.train()
        z = torch.zeros(batch, latent, per_side, per_side, device=where)
        loader = DataLoader(positions, batch_size=math.ceil(len(positions) * sampling), shuffle=True)
        with torch.no_grad():
            for patches, index in loader:
                index = index.to(where)
                z[:, :, index // per_side, index % per_side] = encode(patches)
        optimizer.zero_grad()
        for iteration, (patches, index) in enumerate(loader):
            z = z.detach()
            index = index.to(where)
            z[:, :, index // per_side, index % per_side] = encode(patches)
            (criterion(head(z), labels) / epsilon).backward()
            if (iteration + 1) % epsilon == 0:
                optimizer.step()
                optimizer.zero_grad()
            if iteration + 1 >= zeta:
                break

    def sync() -> None:
        if where.type == "cuda":
            torch.cuda.synchronize(where)

    step()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return times
