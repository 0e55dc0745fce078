"""Predict a cohort: slides read ahead by the loader's decode processes, predicted in table order, and a
slide that cannot be read or predicted reported with its error while the others go on.

Each slide, or each case of several slides (one bag over them all), is read as a dataset of its own (its
tile grids and its tiles made and decoded in the loader's worker processes, a loader thread waiting), so
several are in flight while the model predicts one, and a prediction depends on that slide (case) and the
checkpoint only, never on the other rows: a resumed or reordered cohort predicts every slide the same.
Bags of every tile (repeats 0) and image methods predict exactly what `predict_slides` does; sampled bags
(repeats > 0) are drawn with the run's seed for each slide (case) as the only one of its table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from bigslide.data.bags import BagDataset
from bigslide.data.endpoint import Endpoint
from bigslide.data.images import SlideImageDataset
from bigslide.data.loader import BatchLoader, worker_count
from bigslide.data.processes import DecodeProcesses, Pool
from bigslide.data.sample import Sample
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.data.tile_cache import TileCache
from bigslide.engine import setup
from bigslide.engine.config import TrainConfig
from bigslide.engine.cpu_threads import threads_beside_workers
from bigslide.engine.decision import Decision
from bigslide.engine.features import attach_feature_store
from bigslide.engine.inference import Trained, predict_samples, prediction_table, read_samples
from bigslide.engine.slide_prediction import SlideFailure, SlidePrediction
from bigslide.engine.tissue_report import draw_checks, slide_grids
from bigslide.errors import BigslideError
from bigslide.methods.base import Method
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.names import output_names


@dataclass
class SlideOutcome:
    """One slide of the cohort: its prediction, or why it has none."""

    index: int  # row of the table
    result: SlidePrediction | SlideFailure
    tiles: int = 0  # tiles read from this slide (bag methods)
    grid: TileGrid | None = None  # the slide's tile grid: its tissue check


class SlideRead(NamedTuple):
    dataset: BagDataset | SlideImageDataset | None
    samples: list[Sample]
    error: str  # empty when read
    grids: dict[str, TileGrid] = {}  # noqa: RUF012 (never changed) slide -> its tile grid


def describe(err: BaseException) -> str:
    """One line for a slide's error: bigslide's own messages name the file; others get their type."""
    text = str(err) if isinstance(err, BigslideError) else f"{type(err).__name__}: {err}"
    return " ".join(text.split())


class CohortSlides:
    """Item i = case i of `table` (a slide, without a case column), read whole for prediction on the
    loader's decode processes; a case that cannot be read is an item carrying its error, so the loader
    reads on."""

    def __init__(
        self,
        config: TrainConfig,
        method: Method,
        table: SlideTable,
        endpoint: Endpoint,
        *,
        repeats: int,
        slide_mpp: float | None,
        tiles: TileCache | None = None,
        checks: Path | None = None,
    ) -> None:
        self.config, self.method, self.table, self.endpoint = config, method, table, endpoint
        self.repeats, self.slide_mpp, self.tiles, self.checks = repeats, slide_mpp, tiles, checks
        self.items = list(table.cases().values())  # table rows of each case
        self.names = output_names([e.path for e in table.entries])  # of the thumbnails, unique in the cohort

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> SlideRead:
        return self.load(i, None)

    def load(self, i: int, pool: Pool) -> SlideRead:
        # closed once the slide is predicted; tiled in the decode workers too, when reading there
        workers = pool if isinstance(pool, DecodeProcesses) else None
        slides = SlideCache(slide_mpp=self.slide_mpp, tiles=self.tiles, workers=workers)
        try:
            dataset = setup.build_dataset(
                self.config,
                self.method.kind,
                self.table.like([self.table.entries[r] for r in self.items[i]]),
                train=False,
                slides=slides,
                endpoint=self.endpoint,
            )
            if self.config.data.features:  # the store's rows; a slide new to it is encoded into it first
                for _event in attach_feature_store(self.config, self.method, [dataset]):
                    pass
            checked = list(slide_grids(dataset, self.config.data, slides))
            samples = read_samples(dataset, 0, self.repeats, pool)
            if self.checks is not None:
                for png in draw_checks(slides, checked, self.checks, self.names):
                    if isinstance(png, Exception):
                        raise png
            return SlideRead(dataset, samples, "", {str(path): grid for path, grid in checked})
        except Exception as err:  # this slide is reported; the cohort goes on
            slides.close()
            return SlideRead(None, [], describe(err))


def predict_cohort(
    trained: Trained,
    table: SlideTable,
    *,
    todo: Sequence[int] | None = None,
    workers: int | None = None,
    repeats: int = 0,
    slide_mpp: float | None = None,
    with_grids: bool = True,
    tiles: TileCache | None = None,
    checks: Path | None = None,
    processes: DecodeProcesses | None = None,
) -> Generator[SlideOutcome, None, None]:
    """Predict the rows `todo` of `table` (all by default), in order, one outcome per slide.

    The slides of a case are predicted together (rows of a case not in `todo` too) and each gets an
    outcome. Slides are read ahead on `workers` decode processes (None: as in training,
    `default_workers()`; 0: in this process), at most max(data.prefetch, workers + 1) slides (cases) at
    once: their tiles are held in memory until predicted. `slide_mpp` is the level-0 µm/px of slides whose
    files state none (None: the checkpoint's data.slide_mpp). `tiles`: where tile grids are kept between
    runs (None: made anew). `checks`: the folder each slide's tissue-check thumbnail is drawn into, as it
    is read. `processes`: decode workers to read in (left running; else started here with `workers`).
    Closing the generator stops the reading and joins every thread and process it started.
    """
    method, classes, epochs = trained.method, trained.classes, trained.epochs
    endpoint = method.spec.endpoint or Endpoint(classes=classes)
    decision = trained.decision if endpoint.task == "classification" else None
    reads = read_cohort(
        trained,
        table,
        todo=todo,
        workers=workers,
        repeats=repeats,
        slide_mpp=slide_mpp,
        tiles=tiles,
        checks=checks,
        processes=processes,
    )
    with closing(reads), threads_beside_workers(method.device, worker_count(workers, processes)):
        for rows, read in reads:
            entries = [table.entries[r] for r in rows]
            if read.dataset is None:
                yield from (SlideOutcome(r, SlideFailure(e.path, read.error)) for r, e in zip(rows, entries))
                continue
            counts = tiles_by_slide(read.samples)
            results = _predict(method, read, entries, with_grids, classes, epochs, endpoint, decision)
            grids = read.grids
            del read  # the tiles' shared buffer is free for the slides read next
            for r, result in zip(rows, results, strict=True):
                path = str(table.entries[r].path)
                yield SlideOutcome(r, result, counts[path], grids.get(path))


def tiles_by_slide(samples: list[Sample]) -> Counter[str]:
    """Tiles read from each slide (by path) for `samples`, a case's bag counted slide by slide."""
    counts: Counter[str] = Counter()
    for sample in samples:
        if sample.coords is not None:
            for part in sample.by_slide():
                counts[part.slide] += len(part.tiles)
    return counts


def read_cohort(
    trained: Trained,
    table: SlideTable,
    *,
    todo: Sequence[int] | None = None,
    workers: int | None = None,
    repeats: int = 0,
    slide_mpp: float | None = None,
    tiles: TileCache | None = None,
    checks: Path | None = None,
    processes: DecodeProcesses | None = None,
) -> Generator[tuple[list[int], SlideRead], None, None]:
    """(the case's rows, what was read) for the cases of the rows `todo` of `table`, in order, read ahead
    as `predict_cohort` describes. A read holds a dataset of the case's own (close its `slides` when done)."""
    method, config, classes = trained.method, trained.config, trained.classes
    endpoint = method.spec.endpoint or Endpoint(classes=classes)
    table = prediction_table(table, classes, endpoint)
    fallback_mpp = slide_mpp if slide_mpp is not None else config.data.slide_mpp
    reader = CohortSlides(
        config,
        method,
        table,
        endpoint,
        repeats=repeats,
        slide_mpp=fallback_mpp,
        tiles=tiles,
        checks=checks,
    )
    wanted = set(range(len(table)) if todo is None else todo)
    order = [[k] for k, rows in enumerate(reader.items) if wanted & set(rows)]
    with BatchLoader(reader, workers=workers, prefetch=config.data.prefetch, processes=processes) as loader:
        loader.plan(order)
        for batch in order:
            # handed over, not kept: the slide's tiles (a shared buffer) are freed once the caller drops them
            yield reader.items[batch[0]], loader.take(batch).pop()


def _predict(
    method: Method,
    read: SlideRead,
    entries: list[SlideEntry],
    with_grids: bool,
    classes: list[str],
    epochs: int,
    endpoint: Endpoint,
    decision: Decision | None = None,
) -> list[SlidePrediction | SlideFailure]:
    """Per slide of the case read: the case's prediction with the slide's own heatmaps, or the error."""
    assert read.dataset is not None
    try:
        probs, grids = predict_samples(method, read.dataset, read.samples, with_grids=with_grids)
    except Exception as err:  # e.g. out of memory on one huge slide
        return [SlideFailure(e.path, describe(err)) for e in entries]
    finally:
        read.dataset.slides.close()
    titles = dict(method.map_titles)
    return [
        SlidePrediction(
            e.path,
            probs,
            classes,
            (grids or {}).get(str(e.path), {}),
            titles,
            epochs,
            endpoint,
            e.case,
            decision=decision,
        )
        for e in entries
    ]
