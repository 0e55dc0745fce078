"""TensorBoard event files in the run folder, beside `losses.csv` and `metrics.json`.

`tensorboard --logdir runs/` shows every run below `runs/`: the loss and learning rate per step, the
metrics per epoch, and each epoch one validation slide's heatmap over its thumbnail (how attention
moves as the model learns): validation's own maps of that slide when it reads every tile
(data.inference_repeats 0), else a lattice of a quarter of a bag's tiles over the whole slide (`Run.
board_maps`). A resumed run drops the events past its checkpoint's step.
"""

from __future__ import annotations

import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

SlideMaps = dict[str, dict[str, Any]]  # slide -> map name -> ScoreGrid, as predictions give them

HEATMAP_SIZE = 512  # thumbnail side of the per-epoch heatmap image (px)


class RunBoard:
    def __init__(self, folder: str | Path, *, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder), purge_step=resume_step)
        # the heatmap is drawn while the next epoch trains: its thumbnail's read and the PNG are no gap
        self.drawer = ThreadPoolExecutor(1, thread_name_prefix="bigslide-board")
        self.drawing: Future[None] | None = None

    def step(self, step: int, loss: float, lr: float) -> None:
        self.writer.add_scalar("train/loss", loss, step)
        self.writer.add_scalar("train/learning_rate", lr, step)

    def epoch(self, record: dict[str, Any], first: SlideMaps | None, val: Any) -> None:
        """An epoch's metrics (by split) and the heatmap of the first validation slide from its maps
        `first` (slide -> map name -> grid), drawn while the next epoch trains."""
        self.wait()  # the last epoch's heatmap: a worker that died drawing it stops the run here
        epoch = int(record["epoch"])
        for split in ("train", "val"):
            for name, value in record.get(split, {}).items():
                if np.isfinite(value):
                    self.writer.add_scalar(f"{split}/{name}", value, epoch)
        self.writer.flush()
        if first:
            self.drawing = self.drawer.submit(self._heatmap, epoch, first, val)

    def _heatmap(self, epoch: int, first: SlideMaps, val: Any) -> None:
        shown = first_heatmap(first, val)
        if shown is not None:
            self.writer.add_image(f"heatmap/{shown[0]}", shown[1], epoch, dataformats="HWC")
            self.writer.flush()

    def wait(self) -> None:
        """Until the heatmap being drawn is written (its error raised here)."""
        drawing, self.drawing = self.drawing, None
        if drawing is not None:
            drawing.result()

    def close(self) -> None:
        try:
            self.wait()
        except Exception as err:  # the run has ended; its checkpoint and metrics stand without the image
            warnings.warn(f"the last epoch's heatmap was not written to TensorBoard: {err}", stacklevel=2)
        finally:
            self.drawer.shutdown()
            self.writer.close()


def shows_heatmaps(dataset: Any) -> bool:
    """Whether `dataset`'s items are slides, whose predictions give maps to draw over them."""
    from bigslide.data.bags import BagDataset
    from bigslide.data.images import SlideImageDataset

    return isinstance(dataset, BagDataset | SlideImageDataset)


def first_heatmap(first: SlideMaps, dataset: Any) -> tuple[str, np.ndarray] | None:
    """The first map of `first` (attention, or a Z-block map) over its slide's thumbnail, or None when
    the method gives no map."""
    slide, grids = next(iter(first.items()), ("", {}))
    if not grids:
        return None
    key, grid = next(iter(grids.items()))
    path = Path(slide)
    what = f"{path}: a decode worker process died while drawing its heatmap"
    image = dataset.slides.run(_overlay, path, grid, what=what)  # the thumbnail decodes: in a worker
    return f"{path.stem} {key}", image


def _overlay(slides: Any, path: Path, grid: Any) -> np.ndarray:
    from bigslide.explain.export import overlay_image

    with slides.opened(path) as open_slide:
        return overlay_image(grid, open_slide, max_size=HEATMAP_SIZE)
