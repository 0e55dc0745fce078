"""The gap between epochs, from one epoch's last training step to the next one's first, against validation.

A real training run (`train`, as `bigslide train` runs it): ABMIL-ACC on synthetic slides with a validation
split, bags read by the run's decode workers; by default on the smallest encoder there is (16 pixels of
each tile), so that, as on a GPU, the step leaves the host's cores to reading and the boundary's waits show.
Each event's time is taken as the run yields it. Per epoch
boundary: the gap (end of the last step to end of the next epoch's first step, less one median step: the
time no step ran) and the validation (the train metrics to the validation metrics). When the next epoch's
first bags wait to be read after validation, or workers are started again, or the run's TensorBoard (on, as
by default) reads a slide again for its heatmap, the gap exceeds the validation.

Target (exit status 1 when missed; `--no-targets` only reports): gap <= validation + 0.2 s, as the median
over the run's epoch boundaries (min and median of both are printed).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from bigslide.bench.predict import PIXELS16, register_16_pixels
from bigslide.bench.targets import Targets, add_target_argument, machine_line, min_median

MARGIN_S = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slides", type=int, default=10, help="slides (default 10: 6 train, 2 val, 2 test)")
    parser.add_argument("--size", type=int, default=4096, help="side of each slide in px (default 4096)")
    parser.add_argument("--tile-size", type=int, default=224, help="tile side (default 224)")
    parser.add_argument("--bag-size", type=int, default=256, help="tiles per bag (default 256)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs (default 4: 3 boundaries)")
    parser.add_argument("--workers", type=int, default=2, help="decode workers (default 2)")
    parser.add_argument(
        "--backbone",
        default=PIXELS16,
        help=f"encoder (timm name; default {PIXELS16}: a step costing little beside its bag's read)",
    )
    parser.add_argument(
        "--cache", default=str(Path(tempfile.gettempdir()) / "bigslide-bench"), help="folder for the slides"
    )
    add_target_argument(parser)


def run(args: argparse.Namespace) -> int:
    from bigslide.engine import Loss, Metrics, TrainConfig, train
    from bigslide.synthetic.slide_set import make_slide_set

    print(machine_line(), flush=True)
    register_16_pixels()
    csv = make_slide_set(
        Path(args.cache) / f"epochs-{args.slides}-{args.size}",
        n_slides=args.slides,
        size=(args.size,) * 2,
        seed=5,
    )
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size, config.data.bag_size, config.data.workers = (
        args.tile_size,
        args.bag_size,
        args.workers,
    )
    config.model.backbone = args.backbone
    config.method.name = "abmil_acc"
    config.optim.epochs = args.epochs
    config.run.device = "cpu"  # TensorBoard on, as by default: its per-epoch heatmap is in the gap
    config.run.out_dir = tempfile.mkdtemp(prefix="bench-epochs-", dir=args.cache)
    steps: list[tuple[int, float]] = []  # (epoch, time the step's loss came)
    train_metrics: dict[int, float] = {}
    val_metrics: dict[int, float] = {}
    epoch = 0
    start = time.perf_counter()
    for event in train(config):
        now = time.perf_counter()
        if isinstance(event, Loss):
            steps.append((epoch, now))
        elif isinstance(event, Metrics) and event.split == "train":
            train_metrics[event.epoch] = now
        elif isinstance(event, Metrics) and event.split == "val":
            val_metrics[event.epoch] = now
            epoch = event.epoch + 1
    total = time.perf_counter() - start
    within = [b - a for (ea, a), (eb, b) in itertools.pairwise(steps) if ea == eb]
    step = statistics.median(within)
    gaps, validations = [], []
    for e in range(args.epochs - 1):
        last = max(t for k, t in steps if k == e)
        first = min(t for k, t in steps if k == e + 1)
        gaps.append(first - last - step)
        validations.append(val_metrics[e] - train_metrics[e])
    per_epoch = len(within) // args.epochs + 1
    print(
        f"run: abmil_acc on {args.backbone}, {args.slides} synthetic slides of {args.size}² px, bags of "
        f"{args.bag_size} x {args.tile_size} px, {per_epoch} steps an epoch, {args.epochs} epochs, "
        f"{args.workers} decode workers, CPU; {total:.1f} s in all"
    )
    print("\n| epoch boundary | gap (s) | validation (s) | gap - validation (s) |")
    print("|---|---|---|---|")
    for e, (gap, val) in enumerate(zip(gaps, validations, strict=True)):
        print(f"| {e} -> {e + 1} | {gap:.3f} | {val:.3f} | {gap - val:+.3f} |")
    (gmin, gmed), (vmin, vmed) = min_median(gaps), min_median(validations)
    print(f"gap: min {gmin:.3f} s, median {gmed:.3f} s; validation: min {vmin:.3f} s, median {vmed:.3f} s")
    print(f"step (median within epochs): {step:.3f} s, subtracted from each gap")
    targets = Targets.from_args(args)
    excess = statistics.median(g - v for g, v in zip(gaps, validations, strict=True))
    targets.check(f"gap - validation <= {MARGIN_S} s (median over boundaries)", excess, MARGIN_S)
    return targets.exit_code()
