"""Tile reading throughput on a JPEG SVS, and a training step fed by the loader vs from memory.

Writes (and caches) a JPEG SVS of at least 20,480 x 16,384 px, 256 px file tiles at quality 80, then
times on the same bags, side by side in one run: sequential `read_region` per tile; the loader at 1,
2 (and all) workers; and the decode floor: each JPEG file tile the bags touch decoded once by
imagecodecs straight from the file's bytes, in one forked process (as the loader's workers decode), with
no copy (and, for context, the same on w threads and on w processes: how far this machine's cores scale
the bare decode). Then a training step
(ABMIL-ACC on a small encoder) on bags held in memory, against the same steps taking their bags from
the loader, in steady state (each run's first step, whose bag nothing can overlap, is untimed on both
sides). Every timing is repeated; min and median are reported. Each loader (also each loader feeding
steps) is started once and reads the same bags in every repeat, as in a training run; its start-up is
printed apart.

Targets (exit status 1 when one is missed; `--no-targets` only reports): loader at w workers >= 0.8 x
w x the decode floor, as the median over repeats of each loader timing against the 1-process floor
timed around it (half its bags just before, half just after: this machine's speed drifts within a minute); the
loader-fed step <= 1.1 x the in-memory step whenever the loader alone delivers a bag faster than the
in-memory step takes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bigslide.bench.io_slide import MPP, QUALITY, TILE, DecodeFloor, ensure_slide, touched_file_tiles


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, default=20_480, help="level-0 width (default 20480)")
    parser.add_argument("--height", type=int, default=16_384, help="level-0 height (default 16384)")
    parser.add_argument("--tile-size", type=int, default=224, help="bag tile side at 0.5 µm/px")
    parser.add_argument("--bag-size", type=int, default=512, help="tiles per bag (default 512)")
    parser.add_argument(
        "--bags",
        type=int,
        default=8,
        help="bags per timing (default 8: the loader fills and drains once per timing)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (default 3)")
    parser.add_argument("--workers", default="", help="loader worker counts, e.g. 1,2 (default 1, 2, all)")
    parser.add_argument("--backbone", default="test_resnet", help="encoder of the step (timm)")
    parser.add_argument(
        "--step-bag-size", type=int, default=64, help="tiles per bag of the step comparison (default 64)"
    )
    parser.add_argument(
        "--steps", type=int, default=5, help="training steps per step timing, the first untimed (default 5)"
    )
    parser.add_argument("--no-step", action="store_true", help="skip the training-step comparison")
    parser.add_argument("--no-targets", action="store_true", help="report only; never fail on a target")
    parser.add_argument(
        "--cache", default=str(Path(tempfile.gettempdir()) / "bigslide-bench"), help="folder for the slide"
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from bigslide.bench.targets import machine_line, timed
    from bigslide.data.bags import BagDataset
    from bigslide.data.loader import BatchLoader, default_workers
    from bigslide.data.table import SlideEntry, SlideTable
    from bigslide.wsi.slide import open_slide

    path = ensure_slide(Path(args.cache), args.width, args.height)
    print(machine_line(), flush=True)
    cores = default_workers()
    counts = [int(w) for w in args.workers.split(",")] if args.workers else sorted({1, 2, cores})
    print(
        f"io: {path.name} ({path.stat().st_size / 1e6:.0f} MB, {args.width} x {args.height}, JPEG Q{QUALITY} "
        f"{TILE} px tiles); bags of {args.bag_size} x {args.tile_size} px at {MPP} µm/px; {args.bags} bags "
        f"per timing, {args.repeats} repeats; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
        f"torch {torch.__version__}",
        flush=True,
    )
    # the same slide listed once per bag, each row a case of its own: bag i samples with (seed, epoch, i),
    # so the bags differ
    rows = [SlideEntry(path, "a", "train", case=f"bag {i}") for i in range(args.bags)]
    table = SlideTable(rows, ["a", "b"])
    bags = BagDataset(table, tile_size=args.tile_size, target_mpp=MPP, bag_size=args.bag_size, seed=1)
    coords = [bags.grids[i].coords[bags.tile_indices(i)] for i in range(args.bags)]
    n_tiles = sum(len(c) for c in coords)
    slide = open_slide(path)  # the bench's own copy, closed with the process
    plan = bags.grids[0].plan
    file_tiles = [touched_file_tiles(c, plan.read_size, TILE) for c in coords]
    print(
        f"file tiles decoded per bag: {statistics.mean(len(f) for f in file_tiles):.0f} "
        f"(grid {len(bags.grids[0])} tiles)",
        flush=True,
    )

    def sequential() -> None:
        s = plan.read_size
        for c in coords:
            for x, y in c:
                slide.read_region((int(x), int(y)), plan.level, (s, s))

    floor = DecodeFloor(path)
    timings: dict[str, list[float]] = {"sequential read_region": [], FLOOR_ROW: []}
    # The floor on w threads and on w processes: what this machine's cores give the decode (threads share
    # one interpreter; processes share nothing).
    parallel = [w for w in counts if w > 1]
    for w in parallel:
        timings[f"decode floor ({w} threads)"] = []
        timings[f"decode floor ({w} processes)"] = []
    for w in counts:
        timings[loader_row(w)] = []
    # Each loader lives through every repeat, as it does through a training run: its processes start
    # and its buffers warm once (timed apart, below), and each repeat reads the same bags again.
    loaders = {w: BatchLoader(bags, workers=w, prefetch=2) for w in counts}
    startup = {w: timed(lambda w=w: load_bags(loaders[w], [0])) for w in counts}  # type: ignore[misc]
    # Each loader timing follows a floor timing of its own, and the target compares each pair: this
    # machine's speed drifts between timings a minute apart more than the loader differs from the floor.
    # The floor decodes in a process forked for it, the kind of process a worker decodes in (not in this
    # one, which holds the loaders' threads and has forked their workers).
    paired: dict[int, list[float]] = {w: [] for w in counts}
    for _ in range(args.repeats):  # interleaved, so machine load hits every reader alike
        timings["sequential read_region"].append(timed(sequential))
        for w in parallel:
            timings[f"decode floor ({w} threads)"].append(
                timed(lambda w=w: floor.decode_bags(file_tiles, threads=w))  # type: ignore[misc]
            )
            timings[f"decode floor ({w} processes)"].append(
                timed(lambda w=w: floor.decode_bags(file_tiles, processes=w))  # type: ignore[misc]
            )
        for w in counts:
            # the floor brackets the loader: half its bags just before, half just after
            floor_time = timed(lambda: floor.decode_bags(file_tiles[0::2], processes=1))
            loader_time = timed(lambda w=w: load_bags(loaders[w], range(args.bags)))  # type: ignore[misc]
            floor_time += timed(lambda: floor.decode_bags(file_tiles[1::2], processes=1))
            timings[FLOOR_ROW].append(floor_time)
            timings[loader_row(w)].append(loader_time)
            paired[w].append(floor_time / (w * loader_time))
    for loader in loaders.values():
        loader.close()
    floor.close()

    rates = {name: [n_tiles / t for t in ts] for name, ts in timings.items()}
    floor_rate = statistics.median(rates[FLOOR_ROW])
    print("\n| reader | tiles/s, min | tiles/s, median | bag (s), median | vs decode floor |")
    print("|---|---|---|---|---|")
    for name, r in rates.items():
        print(
            f"| {name} | {min(r):.0f} | {statistics.median(r):.0f} "
            f"| {args.bag_size / statistics.median(r):.3f} | {statistics.median(r) / floor_rate:.2f}x |"
        )
    print(
        "loader start-up (processes started, first bag read, once per run; not in the rates above): "
        + ", ".join(f"{w} worker{'s' if w > 1 else ''} {startup[w]:.2f} s" for w in counts)
    )
    missed = []
    for w in counts:
        name = loader_row(w)
        ratio = statistics.median(paired[w])
        ok = ratio >= 0.8
        print(
            f"target {name} >= 0.8 x {w} x decode floor (each timing against the floor timed around "
            f"it; min {min(paired[w]):.2f}, median): {ratio:.2f} -> {'met' if ok else 'MISSED'}"
        )
        if w > 1:
            spread = statistics.median(rates[f"decode floor ({w} processes)"]) / floor_rate
            print(f"  decode floor on {w} processes: {spread:.2f}x the 1-process floor (for context)")
            own = statistics.median(rates[name]) / statistics.median(rates[f"decode floor ({w} processes)"])
            print(f"  {name} vs the decode floor on {w} processes: {own:.2f} (for context)")
        if not ok:
            missed.append(name)

    if not args.no_step:
        step_bags = BagDataset(
            table, tile_size=args.tile_size, target_mpp=MPP, bag_size=args.step_bag_size, seed=2
        )
        missed += step_comparison(args, step_bags, counts, rates)
        step_bags.slides.close()
    bags.slides.close()
    if missed and not args.no_targets:
        print(f"targets missed: {', '.join(missed)}")
        return 1
    return 0


def step_comparison(
    args: argparse.Namespace, bags: Any, counts: list[int], rates: dict[str, list[float]]
) -> list[str]:
    """ABMIL-ACC steps on bags in memory vs the same steps taking their bags from the loader."""
    import torch

    from bigslide.data.loader import BatchLoader
    from bigslide.data.sample import collate
    from bigslide.engine import setup
    from bigslide.engine.config import TrainConfig
    from bigslide.memory.stepper import OptimStepper

    config = TrainConfig()
    config.method.name = "abmil_acc"
    config.model.backbone = args.backbone
    device = torch.device("cpu")
    method = setup.build_method(config, ["a", "b"], device)
    optimizer = setup.build_optimizer(config, method)
    stepper = OptimStepper(optimizer, device=device)
    order = [[i % len(bags)] for i in range(args.steps)]
    in_memory = [collate([bags[i] for i in b], device) for b in order]
    method.model.train()
    method.train_step(in_memory[0], stepper)  # warm-up
    if args.steps < 2:
        raise SystemExit(
            "bigslide: error: --steps must be at least 2 (the first step of each run is untimed)"
        )

    # Steady state: each run's first step is untimed on both sides (the loader cannot overlap the
    # first bag of an epoch with anything; over an epoch that one bag is amortised).
    def memory_steps() -> float:
        method.train_step(in_memory[0], stepper)
        start = time.perf_counter()
        for batch in in_memory[1:]:
            method.train_step(batch, stepper)
        return time.perf_counter() - start

    # Loaders live through every repeat, as through a training run (which forks its workers once): steps
    # just after a fork pay a copy of each page they write that the new children still share.
    loaders = {w: BatchLoader(bags, workers=w, prefetch=2) for w in counts}

    def fed_steps(workers: int) -> float:
        loader = loaders[workers]
        loader.plan(order)
        method.train_step(collate(loader.take(order[0]), device), stepper)
        start = time.perf_counter()
        for b in order[1:]:
            method.train_step(collate(loader.take(b), device), stepper)
        return time.perf_counter() - start

    timings: dict[str, list[float]] = {"in memory": []}
    for w in counts:
        timings[loader_row(w)] = []
    try:
        for _ in range(args.repeats):
            timings["in memory"].append(memory_steps() / (args.steps - 1))
            for w in counts:
                timings[loader_row(w)].append(fed_steps(w) / (args.steps - 1))
    finally:
        for loader in loaders.values():
            loader.close()
    step = statistics.median(timings["in memory"])
    print(
        f"\ntraining step: abmil_acc, {args.backbone}, bag {args.step_bag_size} x {args.tile_size} px, CPU, "
        f"{torch.get_num_threads()} torch threads"
    )
    print("| bags from | step (s), min | step (s), median | vs in memory | loader alone, bag (s) |")
    print("|---|---|---|---|---|")
    verdicts, missed = [], []
    for name, ts in timings.items():
        alone = args.step_bag_size / statistics.median(rates[name]) if name in rates else float("nan")
        print(
            f"| {name} | {min(ts):.3f} | {statistics.median(ts):.3f} | {statistics.median(ts) / step:.2f}x "
            f"| {'' if name == 'in memory' else f'{alone:.3f}'} |"
        )
        if name == "in memory":
            continue
        ratio = statistics.median(ts) / step
        if alone <= step:
            ok = ratio <= 1.1
            verdicts.append(
                f"target {name}: step <= 1.1 x in memory: {ratio:.2f} -> {'met' if ok else 'MISSED'}"
            )
            if not ok:
                missed.append(f"step fed by {name}")
        else:
            verdicts.append(
                f"target {name}: not applicable (the loader alone needs {alone:.3f} s > step {step:.3f} s)"
            )
    print("\n".join(verdicts))
    return missed


FLOOR_ROW = "decode floor (1 process)"


def loader_row(workers: int) -> str:
    return f"loader, {workers} worker{'s' if workers > 1 else ''}"


def load_bags(loader: Any, items: Iterable[int]) -> None:
    """Plan and take one bag per item, as an epoch does."""
    order = [[i] for i in items]
    loader.plan(order)
    for b in order:
        loader.take(b)
