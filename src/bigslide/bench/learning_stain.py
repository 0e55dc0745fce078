"""The learning bench's stain part: ABMIL-ACC trained as `bigslide demo` trains it, on the demo's
slides (lab A), tested on the demo's test slides as lab A and as two other labs stain them
(`bigslide.synthetic.he.LABS`: B, stronger, bluer hematoxylin, paler eosin, a yellow cast; C, a larger
shift still, hematoxylin x1.45, eosin x0.6 and a warm cast), without and with stain augmentation and
normalisation."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bigslide.bench.learning_runs import slide_config, train_run
from bigslide.data.sources import demo_dir
from bigslide.data.table import SlideTable
from bigslide.engine import predict_slides
from bigslide.engine.metrics import classification_metrics
from bigslide.synthetic.slide_set import make_slide_set

# run name -> data settings on top of the tumour MIL part's (flips and rotations stay on in all).
# Lab B's hematoxylin is 1.4x lab A's (times each slide's own 0.8-1.2): strength 1 scales dye amounts by
# up to 1.42x, strength 1.5 by up to 1.69x.
STAIN_RUNS: dict[str, dict[str, object]] = {
    "flips_only": {},
    "stain_augment": {"stain_augment": True},
    "stain_augment_x1.5": {"stain_augment": True, "stain_augment_strength": 1.5},
    "macenko": {"stain_normalise": "macenko"},
    "macenko+stain_augment": {"stain_normalise": "macenko", "stain_augment": True},
    "reinhard": {"stain_normalise": "reinhard"},
    "reinhard+stain_augment": {"stain_normalise": "reinhard", "stain_augment": True},
}
LAB_NAMES = ("A", "B", "C")


def stain_sets() -> dict[str, Path]:
    """The demo's slides as lab A stains them (the bundled set) and as labs B and C do (same splits)."""
    sets = {"A": make_slide_set(demo_dir())}
    for lab in LAB_NAMES[1:]:
        sets[lab] = make_slide_set(demo_dir().with_name(f"demo-slides-lab{lab}"), lab=lab)
    return sets


def stain_run(args: argparse.Namespace, sets: dict[str, Path], name: str, seed: int) -> dict[str, float]:
    """Train ABMIL-ACC on lab A with the run's stain settings; AUC and balanced accuracy on the test
    slides of each lab."""
    # `bigslide demo`'s settings: tiles of 32 px at 1 µm/px, bags of 24, learning rate 2e-3, 4 epochs
    config = slide_config(args, sets["A"], "tumour", "abmil_acc", seed, f"stain-{name}")
    config.optim.epochs = args.stain_epochs
    for key, value in STAIN_RUNS[name].items():
        setattr(config.data, key, value)
    result = train_run(config)
    assert result.checkpoint is not None
    metrics: dict[str, float] = {}
    for lab, csv in sets.items():
        table = SlideTable.from_csv(csv)
        test = table.subset("test")
        _, raw = predict_slides(result.checkpoint, test, repeats=0)
        labels = np.array([table.encode(e.label) for e in test.entries])
        found = classification_metrics(labels, raw.probs, raw.decision)
        metrics[f"auc_{lab}"] = found["auc"]
        metrics[f"balanced_accuracy_{lab}"] = found["balanced_accuracy"]
    return metrics
