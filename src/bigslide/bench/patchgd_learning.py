"""PatchGD vs full-image gradient descent on the UltraMNIST-like set (PatchGD paper, Tables 1–2 trend).

Three runs per seed: PatchGD at full resolution; full-image GD at the resolution whose training memory
matches PatchGD's (the memory-matched baseline: GD must shrink the image to fit); and full-image GD at
full resolution (the unconstrained reference, using several times the memory). Accuracy on held-out
canvases and each run's measured peak memory are reported.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.bench.memory import peak_rss_delta
from bigslide.bench.mil_learning import mean_sd
from bigslide.engine import TrainConfig, run_to_end, train


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--size", type=int, default=512, help="canvas side (full resolution)")
    parser.add_argument("--matched-size", type=int, default=128, help="GD's side at PatchGD's memory")
    parser.add_argument("--patch", type=int, default=128)
    parser.add_argument("--k", type=int, default=2, help="patches re-encoded per inner iteration")
    parser.add_argument("--count", type=int, default=160, help="training canvases (validation: a quarter)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--backbone", default="resnet10t")
    parser.add_argument("--out", default="runs/bench-patchgd-learning")
    parser.add_argument("--json")


def config_for(args: argparse.Namespace, name: str, method: str, size: int, seed: int) -> TrainConfig:
    config = TrainConfig()
    config.data.source = "ultramnist"
    config.data.ultramnist_count = args.count
    config.data.image_size = size
    config.data.batch_size = 2
    config.data.augment = False
    config.model.backbone = args.backbone
    config.method.name = method
    if method == "patchgd":
        config.method.params = {"patch_size": args.patch, "k": args.k, "epsilon": 4, "latent_dim": 128}
    config.optim.epochs = args.epochs
    config.optim.lr = 1e-3
    config.run.seed = seed
    config.run.device = "auto"
    config.run.out_dir = str(Path(args.out) / f"{name}-seed{seed}")
    return config


def _train_history(config: TrainConfig) -> list[dict[str, Any]]:
    return run_to_end(train(config)).history


def run(args: argparse.Namespace) -> int:
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {
        f"patchgd@{args.size}": ("patchgd", args.size),
        f"gd@{args.matched_size}": ("full_image", args.matched_size),
        f"gd@{args.size}": ("full_image", args.size),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for seed in seeds:
        for name, (method, size) in runs.items():
            config = config_for(args, name, method, size, seed)
            history, peak = peak_rss_delta(partial(_train_history, config))
            val = history[-1]["val"]
            results[name].append({"accuracy": val["accuracy"], "qwk": val["qwk"], "peak_mb": peak / 2**20})
            curve = [round(h["val"]["accuracy"], 3) for h in history]
            print(f"seed {seed} {name:12s} val accuracy per epoch {curve}  peak {peak / 2**20:.0f} MB")
    print(f"\n{len(seeds)} seeds, {args.count} canvases, {args.epochs} epochs, backbone {args.backbone}")
    print(f"{'run':14s}{'val accuracy':>20s}{'val QWK':>20s}{'peak MB':>12s}")
    for name, rows in results.items():
        acc = [r["accuracy"] for r in rows]
        qwk = [r["qwk"] for r in rows]
        median_peak = float(np.median([r["peak_mb"] for r in rows]))
        print(f"{name:14s}{mean_sd(acc):>20s}{mean_sd(qwk):>20s}{median_peak:>12.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0
