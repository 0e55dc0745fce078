"""In-memory images as a dataset, for scripts and notebooks: `train(config, data=RunData(...))`."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from bigslide.data.sample import Sample
from bigslide.errors import DataError


class ArrayImageDataset(Dataset[Sample]):
    """Images (N, H, W, 3) as uint8, or floats in [0, 1], with one integer label each."""

    def __init__(self, images: np.ndarray, labels: np.ndarray | list[int], *, name: str = "array") -> None:
        images = np.asarray(images)
        labels = np.asarray(labels, dtype=np.int64)
        if images.ndim != 4 or images.shape[-1] != 3:
            raise DataError(f"{name}: images must be (N, H, W, 3), got shape {images.shape}")
        if len(labels) != len(images):
            raise DataError(f"{name}: {len(images)} images but {len(labels)} labels")
        if images.dtype != np.uint8 and (images.min() < 0 or images.max() > 1):
            raise DataError(f"{name}: float images must lie in [0, 1]")
        self.images, self.labels, self.name = images, labels, name

    def __len__(self) -> int:
        return len(self.images)

    def set_epoch(self, epoch: int) -> None:
        """Arrays are fixed; present so the engine treats every dataset alike."""

    def __getitem__(self, i: int) -> Sample:
        x = torch.from_numpy(np.ascontiguousarray(self.images[i])).permute(2, 0, 1)
        x = x.float().div_(255.0) if self.images.dtype == np.uint8 else x.float()
        return Sample(x=x, y=int(self.labels[i]), slide=f"{self.name}:{i}")
