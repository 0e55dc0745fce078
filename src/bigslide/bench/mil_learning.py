"""End-to-end ABMIL-ACC vs the frozen-encoder baseline on synthetic slides with planted lesions.

Several seeds; held-out test slides scored for slide classification (balanced accuracy, AUC) and for
localisation: the AUC of each positive slide's attention against its lesion-tile mask.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from bigslide.data.table import SlideTable
from bigslide.engine import TrainConfig, predict_slides, run_to_end, train
from bigslide.engine.metrics import classification_metrics
from bigslide.synthetic.slides import lesion_tiles, load_lesions, make_slide_set


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", default="abmil_acc,frozen_abmil")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--slides", type=int, default=24, help="synthetic slides (half train, 1/4 val, 1/4 test)"
    )
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--bag", type=int, default=64, help="tiles per training bag")
    parser.add_argument("--tile", type=int, default=64)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument(
        "--lesion-diameter",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="lesion diameters in level-0 pixels (default: scaled with the 2048² slide)",
    )
    parser.add_argument("--out", default="runs/bench-mil-learning")
    parser.add_argument("--json", help="also write the per-run results to this JSON file")


def attention_auc(pred_grid, lesions: list[np.ndarray]) -> float:  # type: ignore[no-untyped-def]
    """AUC of the attention scores against the lesion-tile mask (tiles > 10 % lesion) of one slide."""
    ok = np.isfinite(pred_grid.scores)
    rows, cols = np.nonzero(ok)
    p = pred_grid.cell_size_level0
    coords = np.stack([pred_grid.origin[0] + cols * p, pred_grid.origin[1] + rows * p], axis=1)
    truth = lesion_tiles(lesions, coords, p)
    if truth.all() or not truth.any():
        return float("nan")
    return float(roc_auc_score(truth, pred_grid.scores[ok]))


def run_one(method: str, seed: int, csv: Path, args: argparse.Namespace) -> dict[str, float]:
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size = args.tile
    config.data.bag_size = args.bag
    config.data.augment = method != "frozen_abmil"  # precomputed features are of un-augmented tiles
    config.model.backbone = args.backbone
    config.method.name = method
    config.optim.epochs = args.epochs
    config.optim.lr = 1e-3 if method == "frozen_abmil" else 3e-4
    config.run.seed = seed
    config.run.device = "auto"
    config.run.out_dir = str(Path(args.out) / f"{method}-seed{seed}")
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    table = SlideTable.from_csv(csv)
    test = table.subset("test")
    preds, raw = predict_slides(result.checkpoint, test, repeats=0)
    labels = np.array([table.encode(e.label) for e in test.entries])
    metrics = classification_metrics(labels, raw.probs)
    lesions = load_lesions(csv.parent / "lesions.json")
    aucs = [
        attention_auc(p.grids["attention"], lesions[Path(p.slide).name])
        for p, e in zip(preds, test.entries)
        if e.label == "tumor"
    ]
    metrics["attention_auc"] = float(np.nanmean(aucs)) if aucs else float("nan")
    return metrics


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def run(args: argparse.Namespace) -> int:
    cache = Path(os.environ.get("BIGSLIDE_CACHE", Path.home() / ".cache" / "bigslide"))
    diameter = tuple(args.lesion_diameter) if args.lesion_diameter else None
    suffix = f"-d{diameter[0]:g}-{diameter[1]:g}" if diameter else ""
    csv = make_slide_set(
        cache / f"learning-slides-{args.slides}{suffix}",
        n_slides=args.slides,
        seed=11,
        lesion_diameter=diameter,
    )
    methods = args.methods.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for seed in seeds:
        for method in methods:
            results[method].append(run_one(method, seed, csv, args))
            print(
                f"seed {seed} {method}: " + "  ".join(f"{k}={v:.3f}" for k, v in results[method][-1].items())
            )
    keys = ["balanced_accuracy", "auc", "attention_auc"]
    print(
        f"\n{len(seeds)} seeds, {args.slides} slides, {args.epochs} epochs, bag {args.bag} x {args.tile}px, "
        f"lesion diameter {diameter or 'default'}"
    )
    print(f"{'method':14s}" + "".join(f"{k:>26s}" for k in keys))
    for method in methods:
        cells = [mean_sd([r[k] for r in results[method]]) for k in keys]
        print(f"{method:14s}" + "".join(f"{c:>26s}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0
