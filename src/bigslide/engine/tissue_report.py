"""A run's tissue check: every slide it reads gets a thumbnail and a line of `tissue_check.csv` in the
run folder (`bigslide.explain.tissue_check`), and a warning when no tile or nearly every tile is kept."""

from __future__ import annotations

from collections.abc import Generator, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from bigslide.data.bags import BagDataset
from bigslide.data.config import DataConfig
from bigslide.data.feature_bags import FeatureBagDataset
from bigslide.data.images import SlideImageDataset
from bigslide.data.slides import SlideCache
from bigslide.engine.events import Event, Message
from bigslide.explain.tissue_check import (
    CSV_NAME,
    FOLDER,
    check_row,
    warning,
    write_check_csv,
    write_check_png,
)
from bigslide.grid import TileGrid


def slide_grids(dataset: Any, data: DataConfig, slides: SlideCache) -> Iterable[tuple[Path, TileGrid]]:
    """(slide, its tile grid) for each slide a dataset reads; none for data that are not slides, or foreign
    feature files (whose tiles bigslide did not choose)."""
    if isinstance(dataset, FeatureBagDataset):
        if dataset.foreign_dim:
            return
        for i, entry in enumerate(dataset.table.entries):
            yield entry.path, dataset.grid(i)
    elif isinstance(dataset, BagDataset):
        yield from zip((e.path for e in dataset.table.entries), dataset.grids, strict=True)
    elif isinstance(dataset, SlideImageDataset):
        for entry in dataset.table.entries:
            yield entry.path, slides.grid(entry, data.tile_size, data.read_mpp, data.min_tissue, data.tissue)


def write_tissue_check(
    datasets: Iterable[Any], data: DataConfig, slides: SlideCache, out: Path
) -> Generator[Event, None, Path | None]:
    """Thumbnails and `tissue_check.csv` for every slide of `datasets`, in `out`; warnings as messages.
    A report that cannot be written (a full disk) is a warning: training goes on."""
    rows = []
    try:
        for dataset in datasets:
            if dataset is None:
                continue
            for path, grid in slide_grids(dataset, data, slides):
                write_check_png(partial(slides.opened, path), path, grid, out / FOLDER, slides.tiles)
                rows.append(check_row(path, grid))
                text = warning(path, grid)
                if text is not None:
                    yield Message(f"warning: {text}")
        if not rows:
            return None
        csv = write_check_csv(rows, out / CSV_NAME)
    except OSError as err:
        yield Message(f"warning: could not write the tissue check in {out}: {err.strerror or err}")
        return None
    yield Message(f"tissue check: {csv} and a thumbnail per slide in {out / FOLDER}")
    return csv
