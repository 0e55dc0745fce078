"""A run's tissue check: every slide it reads gets a thumbnail and a line of `tissue_check.csv` in the
run folder (`bigslide.explain.tissue_check`), and a warning when no tile or nearly every tile is kept."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
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
    warnings_for,
    write_check_csv,
    write_check_png,
)
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.names import output_names


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
        entries = dataset.table.entries
        grids = slides.grids(entries, data.tile_size, data.read_mpp, data.min_tissue, data.tissue)
        for entry, grid in zip(entries, grids, strict=True):
            if isinstance(grid, Exception):
                raise grid
            yield entry.path, grid


def write_tissue_check(
    datasets: Iterable[Any], data: DataConfig, slides: SlideCache, out: Path
) -> Generator[Event, None, Path | None]:
    """Thumbnails and `tissue_check.csv` for every slide of `datasets`, in `out`; warnings as messages.
    A report that cannot be written (a full disk) is a warning: training goes on."""
    rows = []
    try:
        checked = [
            item for dataset in datasets if dataset is not None for item in slide_grids(dataset, data, slides)
        ]
        drawn = draw_checks(slides, checked, out / FOLDER)
        for (path, grid), png in zip(checked, drawn, strict=True):
            if isinstance(png, Exception):
                raise png
            rows.append(check_row(path, grid))
            for text in warnings_for(path, grid):
                yield Message(f"warning: {text}")
        if not rows:
            return None
        csv = write_check_csv(rows, out / CSV_NAME)
    except OSError as err:
        yield Message(f"warning: could not write the tissue check in {out}: {err.strerror or err}")
        return None
    yield Message(f"tissue check: {csv} and a thumbnail per slide in {out / FOLDER}")
    return csv


def draw_checks(
    slides: SlideCache,
    checked: list[tuple[Path, TileGrid]],
    folder: Path,
    names: Mapping[Path, str] | None = None,
) -> list[Path | Exception]:
    """Each slide's tissue-check thumbnail in `folder`, named by `names` (by default `output_names` of the
    slides checked; kept in the slides' tile cache when there is one), or the error that stopped it: drawn
    in the decode workers, several slides at once."""
    names = names or output_names([path for path, _ in checked])
    items = [(path, grid, folder, names[Path(path)]) for path, grid in checked]
    return slides.map(_draw_check, items, _drawing)


def _draw_check(slides: SlideCache, path: Path, grid: TileGrid, folder: Path, name: str) -> Path:
    return write_check_png(partial(slides.opened, path), path, grid, folder, slides.tiles, name)


def _drawing(item: tuple[Any, ...]) -> str:
    return f"{item[0]}: a decode worker process died while drawing its tissue check"
