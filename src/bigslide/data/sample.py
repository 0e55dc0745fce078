"""What datasets give and methods take: one `Sample` per slide, bag or image, and the `Batch` they form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Sample:
    """One item from a dataset.

    kind "bag": `x` is (N, 3, t, t) float in [0, 1], `coords` the (N, 2) level-0 top-left (x, y) of each tile.
    kind "image": `x` is (3, H, W) float in [0, 1]; image pixel (r, c) covers level-0 pixels starting at
    `origin + (c, r) * downsample`.
    """

    x: torch.Tensor
    y: int
    slide: str
    coords: np.ndarray | None = None
    tile_size_level0: int = 0
    origin: tuple[int, int] = (0, 0)
    downsample: float = 1.0


@dataclass
class Batch:
    """Collated samples: bags come one per batch (N varies), images are stacked (B, 3, H, W).

    `x` stays in host memory (pinned on CUDA); each method moves what it needs to its device.
    """

    x: torch.Tensor
    y: torch.Tensor
    samples: list[Sample]
