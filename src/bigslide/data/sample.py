"""What datasets give and methods take: one `Sample` per slide, bag or image, and the `Batch` they form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bigslide.data.colour import RowColour, SampleStain, SampleView
from bigslide.data.endpoint import Target


@dataclass
class Sample:
    """One item from a dataset.

    kind "bag": `x` is (N, 3, t, t), `coords` the (N, 2) level-0 top-left (x, y) of each tile (or, with
    `features`, (N, D) stored encoder features of those tiles). A case's bag spans its slides: `parts` says
    which tiles are from which slide (empty: all from `slide`).
    kind "image": `x` is (3, H, W); image pixel (r, c) covers level-0 pixels starting at
    `origin + (c, r) * downsample`.
    Pixels are uint8 (as read: a quarter of float32's host memory and transfer) or float in [0, 1];
    methods pass them through `to_device` / `as_float`, so models always see float in [0, 1].
    """

    x: torch.Tensor
    y: Target  # the class index, the number, or (time, event, interval): see `Endpoint.target`
    slide: str
    coords: np.ndarray | None = None
    tile_size_level0: int = 0
    origin: tuple[int, int] = (0, 0)
    downsample: float = 1.0
    stain: SampleStain | None = None  # the slide's stain fit and perturbation (`bigslide.data.colour`)
    view: SampleView | None = None  # its augmentation: turns, mirror, tone (`bigslide.data.colour`)
    features: bool = False  # bags of stored features: `x` is (N, D) float32, one encoder row per tile
    parts: tuple[SlidePart, ...] = ()
    # bags: each tile's label from teaching annotations (`bigslide.tiling.annotations`), -1 where none; None
    # when the bag's slides are not annotated or annotations are not asked for
    instance_labels: np.ndarray | None = None

    def by_slide(self) -> tuple[SlidePart, ...]:
        """A bag's tiles slide by slide."""
        return self.parts or (SlidePart(self.slide, np.arange(len(self.x)), self.tile_size_level0),)

    def tile_keys(self) -> list[tuple[str, int, int, int]]:
        """What names each tile of a bag on disk: (slide, level-0 side, x, y)."""
        assert self.coords is not None
        keys: list[tuple[str, int, int, int]] = [("", 0, 0, 0)] * len(self.coords)
        for part in self.by_slide():
            for i in part.tiles:
                x, y = self.coords[i]
                keys[i] = (part.slide, part.tile_size_level0, int(x), int(y))
        return keys


@dataclass(frozen=True)
class SlidePart:
    """The tiles of a case's bag (indices into it) that are from one slide, and their level-0 side there
    (slides of one case may be scanned at different µm/px)."""

    slide: str
    tiles: np.ndarray
    tile_size_level0: int


@dataclass
class Batch:
    """Collated samples: images are stacked (B, 3, H, W); bags (N varies) are concatenated tile-wise,
    (sum N, 3, t, t) with `sizes` the tiles of each bag in order.

    `x` stays in host memory (pinned on CUDA); each method moves what it needs to its device.
    """

    x: torch.Tensor
    y: torch.Tensor
    samples: list[Sample]
    sizes: list[int] | None = None  # bags: tiles per bag
    instance_labels: torch.Tensor | None = None  # bags: (sum N,) tile labels, -1 = none; None: none at all


def as_float(
    x: torch.Tensor,
    colour: RowColour | None = None,
    *,
    memory_format: torch.memory_format = torch.preserve_format,
) -> torch.Tensor:
    """Pixels as float in [0, 1]: uint8 is scaled by 1/255 (into `memory_format`), float passes through
    unchanged; with the rows' maps (`colour`: augmentation view, stain normalisation and perturbation)
    applied where the pixels are, the turns and mirrors while they are still bytes."""
    if colour is not None:
        x = colour.oriented(x)
    if x.dtype == torch.uint8:
        x = x.to(torch.float32, memory_format=memory_format).div_(255)
    return x if colour is None else colour(x)


def to_device(x: torch.Tensor, device: torch.device | str, colour: RowColour | None = None) -> torch.Tensor:
    """Pixels onto `device` (asynchronously from pinned memory), then as float in [0, 1] there, through
    `colour` (the rows' colour maps) when given."""
    return as_float(x.to(device, non_blocking=True), colour)


def batch_instance_labels(samples: list[Sample]) -> torch.Tensor | None:
    """(sum N,) the bags' tile labels one bag after another (-1 where a bag has none); None when no bag
    has any."""
    if all(s.instance_labels is None for s in samples):
        return None
    parts = [
        s.instance_labels if s.instance_labels is not None else np.full(len(s.x), -1, dtype=np.int64)
        for s in samples
    ]
    return torch.from_numpy(np.concatenate(parts).astype(np.int64))


def collate(samples: list[Sample], device: torch.device, *, uint8: bool = True) -> Batch:
    """Images are stacked, bags concatenated tile-wise (`Batch.sizes`). `uint8=False`: pixels as floats
    in [0, 1] (for methods that do not scale them themselves)."""
    bags = samples[0].coords is not None
    sizes = [s.x.shape[0] for s in samples] if bags else None
    if len(samples) == 1:
        x = samples[0].x
    else:
        x = torch.cat([s.x for s in samples]) if bags else torch.stack([s.x for s in samples])
    if not uint8:
        x = as_float(x)
    if not bags and x.ndim == 3:  # one image: add the batch axis
        x = x.unsqueeze(0)
    y = torch.tensor([s.y for s in samples])  # class indices (int64), numbers or (time, event, interval)
    # Inputs stay in host memory: methods move what they need (Big-Layer never moves a whole bag).
    if device.type == "cuda":
        x = x.pin_memory()
    labels = batch_instance_labels(samples) if bags else None
    return Batch(x=x, y=y.to(device), samples=samples, sizes=sizes, instance_labels=labels)
