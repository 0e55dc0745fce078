"""One frozen_abmil epoch from the feature store against one recomputing the features, side by side.

Both sides are real training runs through the engine on the same synthetic slides, seed and sampled tiles
(`data.augment` off, as stored features are of tiles as read); an epoch is timed from the run's start
message, after its data, model and store are set up, to its validation metrics. The recomputing side reads
and decodes every bag's tiles and runs the encoder on them (a fresh run's feature cache is empty); the
store side reads rows of the h5 files. The store is written once, before the repeats, and that
extraction pass is reported on its own. Repeats alternate the sides, so load on a shared machine hits both.
Targets: the store's epoch at least 20x faster (medians), and the same training losses and validation
metrics within float tolerance. Exits 1 when a target is missed (`--no-targets`: report only).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.bench.targets import Targets, add_target_argument, machine_line, min_median
from bigslide.engine import Loss, Message, Metrics, TrainConfig, train
from bigslide.synthetic.slide_set import make_slide_set

TARGET_SPEEDUP = 20.0
LOSS_RTOL = 1e-4  # float32 rounding of the encoder's batch composition, relative
METRIC_ATOL = 1e-6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slides", type=int, default=12, help="synthetic slides (half train, a quarter val)")
    parser.add_argument("--size", type=int, default=3072, help="slide side, level-0 pixels")
    parser.add_argument("--backbone", default="resnet18", help="frozen encoder (timm, random weights)")
    parser.add_argument("--tile-size", type=int, default=224, help="tile side at data.target_mpp (px)")
    parser.add_argument("--bag-size", type=int, default=64, help="tiles sampled per slide (data.bag_size)")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs of each side")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--workers", type=int, default=None, help="data.workers (default: min(cores, 8))")
    parser.add_argument(
        "--cache", default=str(Path(tempfile.gettempdir()) / "bigslide-bench"), help="folder for the slides"
    )
    add_target_argument(parser)


@dataclass
class Epoch:
    seconds: float
    losses: list[float]
    val: dict[str, float]
    messages: list[str] = field(default_factory=list)
    extract_seconds: float = 0.0  # from the first file being encoded to the start message


def run_epoch(config: TrainConfig) -> Epoch:
    """One training epoch through the engine, timed from its start message to its validation metrics."""
    gen = train(config)
    started: float | None = None
    extracting: float | None = None
    losses: list[float] = []
    messages: list[str] = []
    val: dict[str, float] = {}
    seconds = float("nan")
    for event in gen:
        if isinstance(event, Message):
            messages.append(event.text)
            if event.text.startswith("features: encoding") and extracting is None:
                extracting = time.perf_counter()
            if event.text.startswith(f"{config.method.name} on "):
                started = time.perf_counter()
        elif isinstance(event, Loss):
            losses.append(event.value)
        elif isinstance(event, Metrics) and event.split == "val" and started is not None:
            seconds = time.perf_counter() - started
            val = dict(event.values)
    extract = (started or 0.0) - extracting if extracting is not None else 0.0
    return Epoch(seconds, losses, val, messages, extract)


def bench_config(args: argparse.Namespace, csv: Path, out: Path, features: Path | None) -> TrainConfig:
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size = args.tile_size
    config.data.bag_size = args.bag_size
    config.data.augment = False
    config.data.workers = args.workers
    config.data.features = None if features is None else str(features)
    config.model.backbone = args.backbone
    config.method.name = "frozen_abmil"
    config.optim.epochs = 1
    config.run.out_dir = str(out)
    config.run.device = args.device
    config.run.tensorboard = False
    config.run.seed = 0
    return config


def run(args: argparse.Namespace) -> int:
    print(machine_line())
    print("command: bigslide " + shlex.join(sys.argv[1:]))
    targets = Targets.from_args(args)
    csv = make_slide_set(
        Path(args.cache) / f"features-{args.slides}x{args.size}", n_slides=args.slides, size=(args.size,) * 2
    )
    with tempfile.TemporaryDirectory(prefix="bigslide-bench-features-") as tmp:
        work = Path(tmp)
        store = work / "features"
        first = run_epoch(bench_config(args, csv, work / "extract", store))
        written = [m for m in first.messages if m.startswith("features: encoding")]
        tiles = sum(int(m.split()[2]) for m in written)
        print(
            f"slides {csv.parent} ({args.slides} x {args.size}² px), {args.backbone}, "
            f"tiles {args.tile_size} px, bags of {args.bag_size}, device {args.device}"
        )
        print(
            f"store: {len(written)} files, {tiles} tiles encoded once in {first.extract_seconds:.1f} s, "
            f"{_size(store) / 1e6:.1f} MB"
        )
        recompute: list[Epoch] = []
        stored: list[Epoch] = []
        for r in range(args.repeats):
            sides = [("recompute", None, recompute), ("store", store, stored)]
            for name, features, into in sides if r % 2 == 0 else sides[::-1]:
                epoch = run_epoch(bench_config(args, csv, work / f"{name}{r}", features))
                into.append(epoch)
                print(
                    f"repeat {r + 1} {name:9s} epoch {epoch.seconds:8.3f} s  val {_show(epoch.val)}",
                    flush=True,
                )
    rmin, rmed = min_median([e.seconds for e in recompute])
    smin, smed = min_median([e.seconds for e in stored])
    print(f"\n| epoch ({len(recompute[0].losses)} train bags + validation) | min s | median s |")
    print("|---|---|---|")
    print(f"| recomputing features | {rmin:.3f} | {rmed:.3f} |")
    print(f"| from the feature store | {smin:.3f} | {smed:.3f} |")
    speedup = rmed / smed
    print(f"speed-up (median / median): {speedup:.1f}x")
    targets.check("store epoch speed-up (x)", speedup, TARGET_SPEEDUP, at_most=False)
    loss_gap = max(_relative_gap(a.losses, b.losses) for a, b in zip(recompute, stored))
    metric_gap = max(_metric_gap(a.val, b.val) for a, b in zip(recompute, stored))
    print(
        f"largest relative difference of a training loss: {loss_gap:.2e}; "
        f"largest difference of a validation metric: {metric_gap:.2e}"
    )
    targets.check("training losses, largest relative difference", loss_gap, LOSS_RTOL)
    targets.check("validation metrics, largest difference", metric_gap, METRIC_ATOL)
    return targets.exit_code()


def _relative_gap(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return float("nan")
    x, y = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(x - y) / np.maximum(np.abs(x), 1e-12)))


def _metric_gap(a: dict[str, float], b: dict[str, float]) -> float:
    if set(a) != set(b) or not a:
        return float("nan")
    gaps = [abs(a[k] - b[k]) for k in a if not (np.isnan(a[k]) and np.isnan(b[k]))]
    return max(gaps, default=0.0)


def _show(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in values.items())


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.h5"))
