"""`bigslide demo`: synthetic slides -> short training run -> metrics, checkpoint and heatmap PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bigslide.cli.progress import run_with_progress
from bigslide.cli.report import write_heatmaps
from bigslide.data.table import SlideTable
from bigslide.engine import TrainConfig, predict_slides, train
from bigslide.engine.metrics import classification_metrics
from bigslide.engine.setup import demo_dir
from bigslide.methods import get_method


def demo_config(out: Path, method: str, epochs: int) -> TrainConfig:
    config = TrainConfig()
    config.data.source = "demo"
    config.data.tile_size = 64
    config.data.bag_size = 48
    config.data.image_size = 256
    if get_method(method).kind == "image":
        config.data.mpp = 4.0  # 256 px at 4 µm/px: the whole 2048 px (0.5 µm/px) demo slide
    config.method.name = method
    config.optim.epochs = epochs
    config.optim.lr = 3e-4
    config.run.out_dir = str(out)
    config.run.device = "auto"
    return config


def run_demo(out: Path, *, method: str = "abmil_acc", epochs: int = 3, quiet: bool = False) -> int:
    get_method(method)  # fail fast on a wrong name
    config = demo_config(out, method, epochs)
    result = run_with_progress(train(config), quiet=quiet)
    assert result.checkpoint is not None
    table = SlideTable.from_csv(_demo_csv())
    test = table.subset("test")
    preds, raw = predict_slides(result.checkpoint, test, repeats=0)
    metrics = classification_metrics(np.array([table.encode(e.label) for e in test.entries]), raw.probs)
    (out / "test_metrics.json").write_text(json.dumps(metrics, indent=2))
    positive = [p for p, e in zip(preds, test.entries) if e.label == "tumor"] or preds
    heatmaps = write_heatmaps(positive[0], out / "heatmaps")
    print(f"test slides: {len(test)}  " + "  ".join(f"{k}={v:.3f}" for k, v in metrics.items()))
    print(f"checkpoint: {result.checkpoint}")
    print(f"config (replay with `bigslide train`): {out / 'config.yaml'}")
    print("heatmaps: " + ", ".join(str(p) for p in heatmaps if p.suffix == ".png"))
    return 0


def _demo_csv() -> Path:
    return demo_dir() / "slides.csv"
