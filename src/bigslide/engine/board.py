"""TensorBoard event files in the run folder, beside `losses.csv` and `metrics.json`.

`tensorboard --logdir runs/` shows every run below `runs/`: the loss and learning rate per step, the
metrics per epoch, and each epoch one validation slide's heatmap over its thumbnail (how attention
moves as the model learns). A resumed run drops the events past its checkpoint's step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

HEATMAP_SIZE = 512  # thumbnail side of the per-epoch heatmap image (px)


class RunBoard:
    def __init__(self, folder: str | Path, *, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder), purge_step=resume_step)

    def step(self, step: int, loss: float, lr: float) -> None:
        self.writer.add_scalar("train/loss", loss, step)
        self.writer.add_scalar("train/learning_rate", lr, step)

    def epoch(self, record: dict[str, Any], method: Any, val: Any) -> None:
        """An epoch's metrics (by split) and the first validation slide's heatmap."""
        epoch = int(record["epoch"])
        for split in ("train", "val"):
            for name, value in record.get(split, {}).items():
                if np.isfinite(value):
                    self.writer.add_scalar(f"{split}/{name}", value, epoch)
        if val is not None:
            shown = first_heatmap(method, val)
            if shown is not None:
                self.writer.add_image(f"heatmap/{shown[0]}", shown[1], epoch, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def first_heatmap(method: Any, dataset: Any) -> tuple[str, np.ndarray] | None:
    """The first validation slide's first heatmap (attention, or a Z-block map) over its thumbnail, or
    None when the data are not slides (UltraMNIST, in-memory arrays) or the method gives no map."""
    from bigslide.data.bags import BagDataset
    from bigslide.data.images import SlideImageDataset
    from bigslide.engine.inference import predict_dataset

    if not isinstance(dataset, BagDataset | SlideImageDataset) or len(dataset) == 0:
        return None
    by_slide = predict_dataset(method, dataset, repeats=0, with_grids=True, items=[0]).grids[0]
    slide, grids = next(iter(by_slide.items()), ("", {}))
    if not grids:
        return None
    key, grid = next(iter(grids.items()))
    path = Path(slide)
    what = f"{path}: a decode worker process died while drawing its heatmap"
    image = dataset.slides.run(_overlay, path, grid, what=what)  # the thumbnail decodes: in a worker
    return f"{Path(path).stem} {key}", image


def _overlay(slides: Any, path: Path, grid: Any) -> np.ndarray:
    from bigslide.explain.export import overlay_image

    with slides.opened(path) as open_slide:
        return overlay_image(grid, open_slide, max_size=HEATMAP_SIZE)
