"""`bigslide predict`: a cohort of slides through a trained checkpoint, resumable, with a progress bar.

Slides are read ahead by the loader's decode processes (`--workers`, default data.workers as in
training) while the model predicts one slide at a time. Each slide's outputs are written as soon as it is
predicted (`slide_rows`); a rerun keeps the slides already done (`--overwrite` predicts them again), and
`predictions.csv` is rebuilt from every slide's row at the end. A slide that fails (a file that does not
open, a tile that does not decode) gets its error in the CSV and on stderr while the others go on; the exit
status is then 1 (0: every slide predicted; 2: bad input before any slide, e.g. the table or checkpoint).

Under `torchrun` (`torchrun --nproc_per_node N -m bigslide predict ...`, or several nodes through its
rendezvous) the slides still to predict are shared across the ranks, a case's slides on one rank, each
rank reading with its own decode workers on its own device; once every rank has written its slides, rank 0
builds `predictions.csv` from all of them, as one process would have. A rerun with any number of ranks
predicts only what is missing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bigslide.cli import slide_rows
from bigslide.cli.progress import LogLines, progress_bar, stop_requests
from bigslide.data.endpoint import Endpoint
from bigslide.data.loader import default_workers
from bigslide.data.processes import DecodeProcesses
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideTable
from bigslide.data.tile_cache import tile_cache_for
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.cohort import SlideOutcome, predict_cohort
from bigslide.engine.cohort_score import FILE_NAME as SCORE_FILE
from bigslide.engine.cohort_score import CohortScore
from bigslide.engine.config import TrainConfig
from bigslide.engine.distributed import DistContext, from_environment
from bigslide.engine.inference import Trained, load_trained
from bigslide.engine.slide_prediction import SlideFailure
from bigslide.errors import ConfigError, DataError
from bigslide.explain.tissue_check import FOLDER, warnings_for
from bigslide.words import counted
from bigslide.wsi.names import output_names


@dataclass
class CohortRun:
    """What one `predict` invocation did."""

    predicted: int
    skipped: int
    failed: int
    tiles: int
    seconds: float
    csv: Path | None  # None when stopped before the end, or on a rank other than 0
    stopped: bool = False
    score: CohortScore | None = None  # the table's labelled cases scored (rank 0, not stopped)

    def line(self) -> str:
        rate = (self.predicted + self.failed) / self.seconds if self.seconds else 0.0
        tiles = f", {self.tiles / self.seconds:.0f} tiles/s" if self.tiles and self.seconds else ""
        return (
            f"{counted(self.predicted, 'slide')} predicted, {self.skipped} skipped (outputs present), "
            f"{self.failed} failed; wall time {self.seconds:.1f} s ({rate:.2f} slides/s{tiles})"
        )


@dataclass(frozen=True)
class PredictOptions:
    """What `bigslide predict` was asked, checked before anything is read."""

    slides: Path
    checkpoint: Path
    out: Path
    device: str = "auto"
    workers: int | None = None  # None: the checkpoint's data.workers
    repeats: int = 0
    slide_mpp: float | None = None
    heatmaps: bool = True
    overwrite: bool = False
    quiet: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PredictOptions:
        if args.workers is not None and args.workers < 0:
            raise ConfigError(f"--workers {args.workers}: must be >= 0")
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise ConfigError(f"--out {args.out}: a file, not a folder; name a folder for the outputs")
        return cls(
            Path(args.slides),
            Path(args.checkpoint),
            Path(args.out),
            args.device or "auto",
            args.workers,
            args.repeats,
            args.slide_mpp,
            not args.no_heatmaps,
            args.overwrite,
            args.quiet,
        )


def run_predict(args: argparse.Namespace) -> int:
    """The `predict` command: its options, the checkpoint (read once), the rank, the model, the table,
    the cohort predicted and written; its exit status."""
    options = PredictOptions.from_args(args)
    state = load_checkpoint(options.checkpoint)
    config = TrainConfig.from_dict(state["config"], source=f"{options.checkpoint}: config")
    # one rank unless under torchrun
    ranks = from_environment(options.device, timeout_s=config.run.dist_timeout)
    try:
        device = str(ranks.device) if ranks.device is not None else options.device
        trained = load_trained(options.checkpoint, device=device, state=state, config=config)
        endpoint = trained.method.spec.endpoint or Endpoint(classes=trained.classes)
        # the task's columns are optional here, but a label the model does not know is a typo
        table = SlideTable.to_predict(
            options.slides,
            classes=trained.classes if endpoint.task == "classification" else None,
            task=endpoint.task,
        )
        run = predict_to(
            options.out,
            trained,
            table,
            checkpoint=options.checkpoint,
            workers=options.workers,
            repeats=options.repeats,
            slide_mpp=options.slide_mpp,
            heatmaps=options.heatmaps,
            overwrite=options.overwrite,
            quiet=options.quiet or not ranks.is_main,
            ranks=ranks,
        )
    finally:
        ranks.close()
    print(f"rank {ranks.rank}: {run.line()}" if ranks.active else run.line())
    if run.stopped:
        print("bigslide: stopped; the slides predicted so far are kept: run again to go on", file=sys.stderr)
        return 130
    if run.csv is None:  # another rank builds the table
        return 1 if run.failed else 0
    if endpoint.task == "classification":
        print(trained.decision.describe(trained.classes))
    for line in run.score.lines() if run.score is not None else []:
        print(line)
    print(f"predictions: {run.csv}")
    if run.score is not None:
        print(f"figures of the labelled cases: {run.csv.parent / SCORE_FILE}")
    if (run.csv.parent / "tissue_check.csv").is_file():
        print(
            f"tissue check: {run.csv.parent / 'tissue_check.csv'} and a thumbnail per slide in tissue_check/"
        )
    if (run.csv.parent / "km.png").is_file():
        print(f"Kaplan-Meier plot: {run.csv.parent / 'km.png'}")
    return 1 if run.failed else 0


def predict_to(
    out: Path,
    trained: Trained,
    table: SlideTable,
    *,
    checkpoint: str | Path,
    workers: int | None = None,
    repeats: int = 0,
    slide_mpp: float | None = None,
    heatmaps: bool = True,
    overwrite: bool = False,
    quiet: bool = False,
    ranks: DistContext | None = None,
) -> CohortRun:
    """Predict `table`'s slides into `out` (per-slide outputs, then `predictions.csv`), keeping the slides
    an earlier run predicted with the same settings unless `overwrite`. Ctrl-C stops after the slide
    being predicted (its outputs and those waiting are written whole); the run then returns with no CSV.
    `ranks` (torchrun): this rank predicts its share of the slides to do (`rank_share`); rank 0 writes the
    CSV once every rank is done."""
    ranks = ranks or DistContext()
    start = time.perf_counter()
    fallback_mpp = slide_mpp if slide_mpp is not None else trained.config.data.slide_mpp
    settings = {
        "checkpoint": slide_rows.checkpoint_digest(checkpoint),
        "repeats": repeats,
        "slide_mpp": fallback_mpp,
    }
    row_settings = slide_rows.settings_by_row(table, settings)
    todo = [
        i
        for i, e in enumerate(table.entries)
        if overwrite or not slide_rows.kept(out, e.path, row_settings[i], heatmaps=heatmaps)
    ]
    skipped = len(table) - len(todo)
    todo = rank_share(table, todo, ranks.rank, ranks.world)
    tally = _Tally(start, progress_bar(len(todo), "slide", disable=quiet or not todo))
    tile_cache = tile_cache_for(trained.config.data.tile_cache, out)
    # one set of decode workers tiles, reads and draws every slide's maps
    n_workers = default_workers() if workers is None else workers
    processes = DecodeProcesses(n_workers, buffers=n_workers + 1) if n_workers and todo else None
    slides = SlideCache(slide_mpp=fallback_mpp, workers=processes) if processes is not None else None
    if slides is not None:
        slides.state(table.entries)
    outcomes = predict_cohort(
        trained,
        table,
        todo=todo,
        workers=workers,
        processes=processes,
        repeats=repeats,
        slide_mpp=fallback_mpp,
        with_grids=heatmaps,
        tiles=tile_cache,
        checks=out / FOLDER,
    )
    # A slide's outputs (the heatmap PNG's encoding above all) are written on a thread of their own while
    # the model predicts the next slide; at most WRITES_AHEAD slides wait to be written.
    writes: deque[tuple[SlideOutcome, Future[None]]] = deque()
    names = output_names([e.path for e in table.entries])

    def settle(keep: int) -> None:
        while len(writes) > keep:
            outcome, written = writes.popleft()
            written.result()
            tally.add(outcome)

    stopped = False
    with stop_requests() as stop:
        writer = ThreadPoolExecutor(1, thread_name_prefix="bigslide-write")
        try:
            for outcome in outcomes:
                name, as_set = names[Path(outcome.result.slide)], row_settings[outcome.index]
                writes.append((outcome, writer.submit(_write, out, outcome, as_set, heatmaps, slides, name)))
                settle(WRITES_AHEAD)
                if stop.is_set():
                    stopped = True
                    break
            settle(0)
        except KeyboardInterrupt:
            stopped = True
        finally:
            outcomes.close()  # stop reading ahead
            writer.shutdown(wait=True)  # the slides already predicted are written, whole
            if processes is not None:
                processes.close()
            for outcome, written in writes:
                if written.exception() is None:
                    tally.add(outcome)
            tally.bar.close()
    predicted, failed, tiles = tally.predicted, tally.failed, tally.tiles
    csv, score = None, None
    if not stopped:
        ranks.barrier()  # every rank's slides are written
    if not stopped and ranks.is_main:
        method = trained.method
        csv, score = slide_rows.assemble_predictions(
            out,
            table,
            classes=trained.classes,
            endpoint=method.spec.endpoint or Endpoint(classes=trained.classes),
            titles=dict(method.map_titles),
            epochs=trained.epochs,
            decision=trained.decision,
        )
    return CohortRun(predicted, skipped, failed, tiles, time.perf_counter() - start, csv, stopped, score)


def rank_share(table: SlideTable, todo: list[int], rank: int, world: int) -> list[int]:
    """The rows of `todo` rank `rank` of `world` predicts: the cases with a slide to do, dealt in turn (a
    case's slides stay together: they are one bag)."""
    if world <= 1:
        return todo
    wanted = set(todo)
    cases = [rows for rows in table.cases().values() if wanted.intersection(rows)]
    return sorted(row for rows in cases[rank::world] for row in rows if row in wanted)


WRITES_AHEAD = 1


@dataclass
class _Tally:
    """Slides written so far, on the progress bar."""

    start: float
    bar: tqdm | LogLines
    predicted: int = 0
    failed: int = 0
    tiles: int = 0

    def add(self, outcome: SlideOutcome) -> None:
        if isinstance(outcome.result, SlideFailure):
            self.failed += 1
            tqdm.write(f"{outcome.result.slide}: failed: {outcome.result.error}", file=sys.stderr)
        else:
            self.predicted += 1
        for text in warnings_for(outcome.result.slide, outcome.grid) if outcome.grid is not None else []:
            tqdm.write(f"warning: {text}", file=sys.stderr)
        self.tiles += outcome.tiles
        self.bar.update()
        if self.tiles:
            self.bar.set_postfix_str(f"{self.tiles / (time.perf_counter() - self.start):.0f} tiles/s")


def _write(
    out: Path,
    outcome: SlideOutcome,
    settings: dict[str, Any],
    heatmaps: bool,
    slides: SlideCache | None,
    name: str,
) -> None:
    try:
        slide_rows.write_slide_outputs(
            out,
            outcome.result,
            settings=settings,
            heatmaps=heatmaps,
            tiles=outcome.tiles,
            grid=outcome.grid,
            slides=slides,
            name=name,
        )
    except OSError as err:  # a full disk, a folder not ours: the run cannot go on
        raise DataError(
            f"{err.filename or out}: cannot write the outputs of {outcome.result.slide}: "
            f"{err.strerror or err}"
        ) from None
