"""Cohort prediction throughput: `bigslide predict` at 1 and 2 workers against the decode floor.

Writes (and caches) a cohort of synthetic JPEG SVS slides (Q80, 256 px file tiles, tissue texture
everywhere, a different seed per slide) and a checkpoint of an untrained model, then times the predict
command's own path (`predict_to`: decode processes started, every tissue tile of every slide read and
predicted, per-slide rows and heatmaps written, `predictions.csv` assembled; `--overwrite`, so nothing is
skipped) at each worker count, against the decode floor: each JPEG file tile the slides' grids touch
decoded once by imagecodecs from the file's bytes in one forked process (`bench io`'s floor). Every timing
is repeated; min and median are reported. Each predict timing is paired with a floor timing around it (half
the slides just before, half just after: this machine's speed drifts within a minute).

The model is deliberately the smallest there is (default encoder `bench_16_pixels`: 16 pixels of each
tile, no convolution), so what is measured is decode-bound prediction: reading, the uint8-to-float
conversion and normalisation that every encoder pays on every pixel, the attention head, the outputs. A
real encoder on a CPU costs many times the decode (`--backbone test_resnet` to see it); on a GPU it leaves
the host's cores to the decode workers. For context, the slides are also read through predict's loader
with no model ("reading" rows), and the model step alone is timed on tiles in memory.

What a decode worker does beyond the floor is timed apart, after the runs above, each in a process
forked for it (one core), the floor timed around them: making the slides' tile grids (tissue, ink and
focus; `TileGrid.from_slide` on freshly opened slides) and decoding with placing (`read_squares` of the
grids' squares into one buffer used for every slide: each square written to memory once, as a worker
writes it into its shared buffer; the floor only decodes). From these the report gives the most one
worker could read on this machine: the floor against the sum of the two, median over repeats.

Targets (exit status 1 when one is missed; `--no-targets` only reports): reading at w workers >= 0.8 x w
x the 1-process decode floor, as the median over repeats of each timing against the floor timed around
it; predict at w workers >= 0.8 x the slower of reading at w workers (same repeat) and the model alone
on the torch threads predict gives it beside w workers (`engine.cpu_threads`: on a CPU, the cores the
workers leave): prediction can go no faster than either, and on a CPU the model is the slower.

`--ranks 1,2` also times the whole `bigslide predict` command under torchrun (`bench.predict_ranks`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bigslide.bench.io_slide import MPP, QUALITY, TILE, DecodeFloor, ensure_slide, touched_file_tiles
from bigslide.bench.predict_ranks import time_ranks
from bigslide.bench.targets import Targets, add_target_argument, machine_line, timed
from bigslide.data.decode import read_squares
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide

if TYPE_CHECKING:
    from bigslide.data.bags import BagDataset
    from bigslide.data.table import SlideTable

PIXELS16 = "bench_16_pixels"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slides", type=int, default=8, help="slides in the cohort (default 8)")
    parser.add_argument("--width", type=int, default=8192, help="level-0 width of each slide (default 8192)")
    parser.add_argument("--height", type=int, default=8192, help="level-0 height (default 8192)")
    parser.add_argument("--tile-size", type=int, default=224, help="tile side at 0.5 µm/px (default 224)")
    parser.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (default 3)")
    parser.add_argument("--method", default="abmil_acc", help="a bag method (default abmil_acc)")
    parser.add_argument(
        "--backbone",
        default=PIXELS16,
        help=f"encoder (timm name; default {PIXELS16}, the smallest: decode-bound prediction)",
    )
    parser.add_argument("--no-heatmaps", action="store_true", help="as `predict --no-heatmaps`")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument(
        "--ranks",
        default="",
        help="also time the predict command under torchrun at these rank counts (e.g. 1,2)",
    )
    parser.add_argument(
        "--rank-slides",
        type=int,
        default=24,
        help="slides the --ranks rows predict (default 24: each rank's start, about 5 s on one core "
        "whatever the cohort, is then a small part of the run)",
    )
    add_target_argument(parser)
    parser.add_argument(
        "--cache", default=str(Path(tempfile.gettempdir()) / "bigslide-bench"), help="folder for the slides"
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from bigslide.cli.predict import predict_to
    from bigslide.engine.cohort import read_cohort
    from bigslide.engine.inference import load_trained

    print(machine_line(), flush=True)
    print(f"command: bigslide bench predict {' '.join(_argv(args))}", flush=True)
    cache = Path(args.cache)
    paths, table, grids = _cohort(args, cache, args.slides)
    ckpt = _checkpoint(cache, args)
    trained = load_trained(ckpt, device=args.device)
    n_tiles = sum(len(g) for g in grids.grids)
    file_tiles = [touched_file_tiles(g.coords, g.plan.read_size, TILE) for g in grids.grids]
    n_file_tiles = sum(len(f) for f in file_tiles)
    counts = [int(w) for w in args.workers.split(",")]
    # at the torch threads predict gives the model beside each number of workers
    model_alone = {w: _model_step(trained, grids, w) for w in counts}
    grids.slides.close()
    print(
        f"cohort: {args.slides} slides of {args.width} x {args.height} px (JPEG Q{QUALITY}, {TILE} px file "
        f"tiles, {sum(p.stat().st_size for p in paths) / 1e6:.0f} MB); {n_tiles} tissue tiles of "
        f"{args.tile_size} px at {MPP} µm/px, {n_file_tiles} file tiles decoded; {args.method} on "
        f"{args.backbone}, {args.device}, heatmaps {'off' if args.no_heatmaps else 'on'}; "
        f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    floors = [DecodeFloor(p) for p in paths]

    def floor(slides: range) -> float:
        start = time.perf_counter()
        for i in slides:
            floors[i].decode_bags([file_tiles[i]], processes=1)
        return time.perf_counter() - start

    out = Path(tempfile.mkdtemp(prefix="bench-predict-", dir=cache))

    def predict(w: int) -> int:
        done = predict_to(
            out,
            trained,
            table,
            checkpoint=ckpt,
            workers=w,
            heatmaps=not args.no_heatmaps,
            overwrite=True,
            quiet=True,
        )
        return done.failed

    def make_grids() -> None:
        for p in paths:
            with open_slide(p) as slide:
                TileGrid.from_slide(slide, args.tile_size, min_tissue=grids.min_tissue, target_mpp=MPP)

    def place() -> None:
        for p, grid in zip(paths, grids.grids):
            with open_slide(p) as slide:
                read_squares(slide, grid.plan, grid.coords, into=buffer[: len(grid)])

    def placed() -> float:  # into a buffer written once before: no page is new to the process
        buffer.fill(0)
        return timed(place)

    buffer = np.empty((max(len(g) for g in grids.grids), args.tile_size, args.tile_size, 3), np.uint8)
    apart: dict[str, Callable[[], float]] = {GRIDS_ROW: lambda: timed(make_grids), PLACE_ROW: placed}
    apart_rows = (FLOOR_ROW, PLACE_ROW, GRIDS_ROW)  # the floors timed around them are the last

    def read(w: int) -> int:
        failed = 0
        for _rows, slide in read_cohort(trained, table, workers=w):
            failed += slide.dataset is None
            if slide.dataset is not None:
                slide.dataset.slides.close()
        return failed

    runs: dict[str, tuple[int, Callable[[int], int]]] = {}
    for w in counts:
        runs[read_row(w)] = (w, read)
        runs[predict_row(w)] = (w, predict)
    timings: dict[str, list[float]] = {FLOOR_ROW: [], **{name: [] for name in [*apart, *runs]}}
    paired: dict[str, list[float]] = {read_row(w): [] for w in counts}  # against the floor
    failed = 0
    for _ in range(args.repeats):  # interleaved, so the machine's load hits every run alike
        for name, (w, fn) in runs.items():
            floor_time = floor(range(0, args.slides, 2))
            start = time.perf_counter()
            failed += fn(w)
            run_time = time.perf_counter() - start
            floor_time += floor(range(1, args.slides, 2))
            timings[FLOOR_ROW].append(floor_time)
            timings[name].append(run_time)
            if name in paired:
                paired[name].append(floor_time / (w * run_time))
    most: list[float] = []  # per repeat: the floor against a worker's work, each timed around the other
    for _ in range(args.repeats):  # after the runs above, which nothing here may disturb
        # each in a forked process: this one's memory, which predict forks its workers from, stays as it was
        floor_time = floor(range(0, args.slides, 2))
        for name, measure in apart.items():
            timings[name].append(_in_child(measure))
        floor_time += floor(range(1, args.slides, 2))
        timings[FLOOR_ROW].append(floor_time)
        most.append(floor_time / (timings[PLACE_ROW][-1] + timings[GRIDS_ROW][-1]))
    for f in floors:
        f.close()
    shutil.rmtree(out, ignore_errors=True)

    print("\n| run | tiles/s, min | tiles/s, median | slides/s, median | vs 1-process floor |")
    print("|---|---|---|---|---|")
    floor_rate = n_tiles / statistics.median(timings[FLOOR_ROW])
    for name, ts in timings.items():
        rates = [n_tiles / t for t in ts]
        print(
            f"| {name} | {min(rates):.0f} | {statistics.median(rates):.0f} | "
            f"{args.slides / statistics.median(ts):.2f} | {statistics.median(rates) / floor_rate:.2f}x |"
        )
    print(
        f"(tiles/s counts the {n_tiles} tissue tiles; the floor decodes {n_file_tiles} file tiles: "
        f"{n_file_tiles / statistics.median(timings[FLOOR_ROW]):.0f} file tiles/s; reading = the slides "
        "through predict's loader, no model)"
    )
    floor_s, place_s, grids_s = (statistics.median(timings[r][-args.repeats :]) for r in apart_rows)
    print(
        f"one worker's work for the cohort (medians, one core): decoding {floor_s:.3f} s (the floor), "
        f"placing the squares in memory +{place_s - floor_s:.3f} s, the tile grids {grids_s:.3f} s: "
        f"reading can reach at most {statistics.median(most):.2f} x the floor per worker here (median over "
        f"repeats; min {min(most):.2f})"
    )
    for w in counts:
        plural = "s" if w > 1 else ""
        share = model_alone[w] / statistics.median(timings[predict_row(w)])
        print(
            f"model step alone (tiles in memory, this process, the torch threads predict gives it beside "
            f"{w} worker{plural}): {model_alone[w]:.2f} s for the cohort, {share:.0%} of predict at {w} "
            f"worker{plural}"
        )
    targets = Targets.from_args(args)
    if args.ranks:
        _paths, rank_table, rank_grids = _cohort(args, cache, args.rank_slides)
        rank_tiles = sum(len(g) for g in rank_grids.grids)
        rank_grids.slides.close()
        time_ranks(args, cache, ckpt, targets, rank_table, rank_tiles)
    if failed:
        targets.fail(f"predict: {failed} slide reads or predictions failed")
    for w in counts:
        name = read_row(w)
        what = f"{name} >= 0.8 x {w} x decode floor (median; min {min(paired[name]):.2f})"
        targets.check(what, statistics.median(paired[name]), 0.8, at_most=False)
    for w in counts:
        # throughputs as times of the cohort: predict against the slower of its reading and the model
        bound = [max(t, model_alone[w]) / p for t, p in zip(timings[read_row(w)], timings[predict_row(w)])]
        what = (
            f"{predict_row(w)} >= 0.8 x min(reading, {w} worker{'s' if w > 1 else ''}; model alone) "
            f"(median; min {min(bound):.2f})"
        )
        targets.check(what, statistics.median(bound), 0.8, at_most=False)
    return targets.exit_code()


def _cohort(args: argparse.Namespace, cache: Path, count: int) -> tuple[list[Path], SlideTable, BagDataset]:
    """The bench's first `count` slides (written once), their table and their tile grids (a
    `BagDataset` of whole-slide bags; close its `slides` when done)."""
    from bigslide.data.bags import BagDataset
    from bigslide.data.table import SlideEntry, SlideTable

    paths = [ensure_slide(cache, args.width, args.height, seed=1000 + i) for i in range(count)]
    # predicted without labels, as a new cohort is (a labelled one is also scored, once, at the end); the
    # grids' dataset, which the model-alone timing reads samples from, needs a label to hand them out
    table = SlideTable([SlideEntry(p, "") for p in paths], ["a", "b"])
    labelled = SlideTable([SlideEntry(p, "a") for p in paths], ["a", "b"])
    return paths, table, BagDataset(labelled, tile_size=args.tile_size, target_mpp=MPP, bag_size=0)


def _in_child(measure: Callable[[], float]) -> float:
    """What `measure` returns, run in a forked process."""
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe(duplex=False)
    child = context.Process(target=lambda: theirs.send(measure()))
    child.start()
    theirs.close()
    try:
        return float(ours.recv())
    except EOFError:
        raise RuntimeError(f"bench predict: a timing process ended with status {child.exitcode}") from None
    finally:
        child.join()


FLOOR_ROW = "decode floor (1 process)"
GRIDS_ROW = "tile grids alone (1 process, cold)"
PLACE_ROW = "decode and place the squares (1 process, grids given)"


def predict_row(workers: int) -> str:
    return f"predict, {workers} worker{'s' if workers > 1 else ''}"


def read_row(workers: int) -> str:
    return f"reading, {workers} worker{'s' if workers > 1 else ''}"


def _argv(args: argparse.Namespace) -> list[str]:
    return [
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
        for k, v in vars(args).items()
        if v not in (False, None) and k not in ("cache",)
    ]


def _checkpoint(cache: Path, args: argparse.Namespace) -> Path:
    """An untrained model's checkpoint: prediction costs the same whatever the weights."""
    import torch

    from bigslide.engine import setup
    from bigslide.engine.checkpoint import save_checkpoint
    from bigslide.engine.config import TrainConfig

    register_16_pixels()
    config = TrainConfig()
    config.method.name = args.method
    config.model.backbone = args.backbone
    config.data.tile_size = args.tile_size
    config.data.target_mpp = MPP
    torch.manual_seed(0)
    method = setup.build_method(config, ["a", "b"], torch.device("cpu"))
    state = {
        "config": config.to_dict(),
        "classes": ["a", "b"],
        "method": args.method,
        "model": method.model.state_dict(),
    }
    return save_checkpoint(state, cache / f"predict-{args.method}-{args.backbone}-{args.tile_size}.pt")


def _model_step(trained: Any, grids: Any, workers: int) -> float:
    """Seconds the model takes on every slide's tiles already in memory (slide after slide), on the torch
    threads predict leaves it beside `workers` decode workers (`threads_beside_workers`)."""
    from bigslide.engine.cpu_threads import threads_beside_workers
    from bigslide.engine.inference import predict_samples, read_samples

    total = 0.0
    with threads_beside_workers(trained.method.device, workers):
        for i in range(len(grids)):
            samples = read_samples(grids, i, 0, None)
            start = time.perf_counter()
            predict_samples(trained.method, grids, samples, with_grids=True)
            total += time.perf_counter() - start
    return total


def register_16_pixels() -> None:
    """`bench_16_pixels` as a timm model name (this process only)."""
    import timm
    from timm.models import register_model
    from torch import nn

    class SixteenPixels(nn.Module):
        """(B, 3, H, W) -> (B, 48): 16 pixels of each tile on a 4 x 4 grid, the least a model can look at."""

        num_features = 48

        def __init__(self, num_classes: int = 0) -> None:
            super().__init__()
            self.fc = nn.Linear(48, num_classes) if num_classes else nn.Identity()

        def forward(self, x: Any) -> Any:
            h, w = x.shape[-2] // 4, x.shape[-1] // 4
            return self.fc(x[:, :, h // 2 :: h, w // 2 :: w][:, :, :4, :4].flatten(1))

    def bench_16_pixels(pretrained: bool = False, num_classes: int = 0, **_: Any) -> nn.Module:
        return SixteenPixels(num_classes)

    if PIXELS16 not in timm.list_models(PIXELS16):
        register_model(bench_16_pixels)
