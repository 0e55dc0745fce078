"""UltraMNIST canvases (`bigslide.synthetic.ultramnist`) as a dataset of image-kind samples."""

from __future__ import annotations

import numpy as np
import torch
from skimage import transform
from torch.utils.data import Dataset

from bigslide.data.sample import Sample
from bigslide.errors import DataError
from bigslide.synthetic.ultramnist import (
    NUM_CLASSES,
    PAPER_SCALE,
    Split,
    Task,
    UltraMNISTCanvas,
    check_ultramnist,
    render_canvas,
    ultramnist_label,
)


class UltraMNIST(Dataset[Sample]):
    """`n` UltraMNIST canvases of `size`², rendered on access; items are image-kind `Sample`s."""

    def __init__(
        self,
        n: int,
        size: int = 512,
        seed: int = 0,
        split: Split = "train",
        *,
        task: Task = "sum",
        scale: tuple[float, float] = PAPER_SCALE,
        canvas: int = 0,
    ) -> None:
        self.canvas_size = canvas or size
        check_ultramnist(split, self.canvas_size, task, scale)
        if n < 1:
            raise DataError(f"n={n}: must be >= 1")
        if not 8 <= size <= self.canvas_size:
            raise DataError(f"size={size}: must be between 8 and the canvas side {self.canvas_size}")
        self.n, self.size, self.seed, self.split, self.task, self.scale = n, size, seed, split, task, scale
        self.labels = np.array(
            [ultramnist_label(i, seed=seed, split=split, task=task) for i in range(n)], np.int64
        )
        self.classes = [str(c) for c in range(NUM_CLASSES)]

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        """Canvases are fixed per index; present so the engine treats every dataset alike."""

    def canvas(self, index: int) -> UltraMNISTCanvas:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} canvases")
        return render_canvas(
            index, size=self.canvas_size, seed=self.seed, split=self.split, task=self.task, scale=self.scale
        )

    def __getitem__(self, index: int) -> Sample:
        canvas = self.canvas(index)
        image = canvas.image
        if self.size != self.canvas_size:  # shrunk with anti-aliasing, as a low-resolution scan would be
            image = transform.resize(image, (self.size, self.size), anti_aliasing=True).astype(np.float32)
        x = torch.from_numpy(image)[None].expand(3, -1, -1).contiguous()
        return Sample(x=x, y=canvas.label, slide=f"ultramnist:{index}")
