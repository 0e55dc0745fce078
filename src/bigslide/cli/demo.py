"""`bigslide demo`: synthetic H&E slides -> short training run -> test metrics, localisation, heatmap PNGs.

Sized to learn on two CPU cores in a few minutes: 40 slides of 1024² at 0.5 µm/px (the default
`make_slide_set`), tiles of 32 px read at 1 µm/px (10x, where a tumour is plain to see),
and a small timm backbone. The product default stays resnet18; pass `--backbone` to change it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from bigslide.cli.progress import run_with_progress
from bigslide.cli.report import write_heatmaps
from bigslide.data.sources import demo_dir
from bigslide.data.table import SlideTable
from bigslide.engine import TrainConfig, predict_slides, train
from bigslide.engine.metrics import classification_metrics
from bigslide.explain.localisation import lesion_cell_auc
from bigslide.methods import get_method
from bigslide.synthetic.slide_set import load_lesions, make_slide_set

DEMO_BACKBONE = "test_resnet"


def demo_config(out: Path, method: str, epochs: int, backbone: str = DEMO_BACKBONE) -> TrainConfig:
    config = TrainConfig()
    config.data.source = "demo"
    # Tiles at 1 µm/px (10x), where a tumour is plain to see; images at 2 µm/px, so that 256 px cover a
    # whole 1024 px (0.5 µm/px) demo slide.
    config.data.tile_size = 32
    config.data.bag_size = 24
    config.data.image_size = 256
    config.data.target_mpp = 2.0 if get_method(method).kind == "image" else 1.0
    config.model.backbone = backbone
    config.method.name = method
    config.optim.epochs = epochs
    config.optim.lr = 2e-3
    config.run.out_dir = str(out)
    config.run.device = "auto"
    return config


def run_demo(
    out: Path,
    *,
    method: str = "abmil_acc",
    epochs: int = 4,
    backbone: str = DEMO_BACKBONE,
    quiet: bool = False,
) -> int:
    get_method(method)  # fail fast on a wrong name
    start, wall = time.perf_counter(), time.time()
    csv = make_slide_set(demo_dir())
    made = time.perf_counter()
    manifest = csv.parent / "synthetic_set.json"
    if manifest.stat().st_mtime >= wall:  # written now, not reused from the cache
        params = json.loads(manifest.read_text())["params"]
        mpx = params["n_slides"] * params["size"][0] * params["size"][1] / 1e6
        seconds = made - start
        print(f"demo slides: {csv.parent}: {mpx:.0f} Mpx in {seconds:.1f} s ({mpx / seconds:.1f} Mpx/s)")
    else:
        print(f"demo slides: {csv.parent} (reused)")
    config = demo_config(out, method, epochs, backbone)
    result = run_with_progress(train(config), quiet=quiet)
    assert result.checkpoint is not None
    trained = time.perf_counter()
    table = SlideTable.from_csv(csv)
    test = table.subset("test")
    preds, raw = predict_slides(result.checkpoint, test, repeats=0)
    labels = np.array([table.encode(e.label) for e in test.entries])
    metrics = classification_metrics(labels, raw.probs, raw.decision)
    lesions = load_lesions(csv.parent / "lesions.json")
    positive = [(p, e) for p, e in zip(preds, test.entries) if e.label == "tumor"]
    aucs = [
        lesion_cell_auc(p.grids["attention"], lesions[Path(e.path).name])
        for p, e in positive
        if "attention" in p.grids
    ]
    if aucs:
        metrics["attention_cell_auc"] = float(np.nanmean(aucs))
    (out / "test_metrics.json").write_text(json.dumps(metrics, indent=2))
    heatmaps = write_heatmaps((positive[0][0] if positive else preds[0]), out / "heatmaps")
    n_pos = len(positive)
    print(
        f"test slides: {len(test)} ({n_pos} tumour)  " + "  ".join(f"{k}={v:.3f}" for k, v in metrics.items())
    )
    if aucs:
        print(
            "attention localisation (cell AUC, lesion vs other tissue cells) per tumour test slide: "
            + ", ".join(f"{a:.3f}" for a in aucs)
        )
    print(
        f"wall time: slides {made - start:.1f} s, training {trained - made:.1f} s, "
        f"test {time.perf_counter() - trained:.1f} s"
    )
    if raw.decision is not None:
        print(raw.decision.describe(list(table.classes)))
    print(f"checkpoint: {result.checkpoint}")
    print(f"config (replay with `bigslide train`): {out / 'config.yaml'}")
    print("heatmaps: " + ", ".join(str(p) for p in heatmaps if p.suffix == ".png"))
    return 0
