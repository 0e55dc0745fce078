"""The learning bench's stain part: ABMIL-ACC trained as `bigslide demo` trains it but for longer
(`--stain-epochs`), on the demo's slides (lab A), tested on the demo's test slides as lab A stains them,
as the bundled labs B and C do (`bigslide.synthetic.labs`: B, stronger, bluer hematoxylin, paler eosin, a
yellow cast; C, a larger shift still, hematoxylin x1.45, eosin x0.6 and a warm cast) and as labs drawn at
random from seeds do (`bigslide.synthetic.labs.draw_lab`: hematoxylin and eosin amounts each 0.5-1.6x,
stain hues turned by up to 30°, a cast, JPEG tiles of quality 60-95).

The drawn labs come in disjoint sets: *tuning* labs (`--stain-tuning-labs`), on which the stain
settings are compared and the defaults chosen, and *held-out* labs (`--stain-held-out-labs`), drawn once
after that choice and scored only with the defaults (`flips_only`), the augmentation chosen before
(`stain_augment_x1`) and the one chosen now (`stain_augment_x0.67`), whatever they show. The held-out labs
of the choice before are *retired*: scored the same way, reported, never tuned on again.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bigslide.bench.learning.runs import slide_config, train_run
from bigslide.data.sources import demo_dir
from bigslide.data.table import SlideTable
from bigslide.engine import predict_slides
from bigslide.engine.metrics import classification_metrics
from bigslide.synthetic.labs import drawn_lab_name, lab_named
from bigslide.synthetic.slide_set import make_slide_set

# Strengths of the stain augmentation compared (1: the full ranges of `bigslide.data.stain`). The rule
# written before the first tuning runs: the narrowest range whose worst tuning lab keeps a balanced
# accuracy of 0.9 (mean over the seeds) with lab A's unchanged. On labs 1-8 it would have taken 2/3 (worst
# lab 0.900) and 1 was kept, the best on every measure there (mean 0.996, worst lab 0.967). Scored on eight
# more tuning labs (9-16, drawn after one held-out lab had failed strength 1), 2/3 is the rule's choice
# and the best on every measure: over labs 1-16 mean 0.994, worst lab 0.900, against strength 1's 0.979
# and 0.867 (worst on lab 15: 0.867). So `data.stain_augment_strength` defaults to 0.67 (these runs: 2/3,
# ranges 0.5 % wider). 4/3 learns too slowly: pale labs called one class.
STRENGTHS = {"0.33": 1 / 3, "0.67": 2 / 3, "1": 1.0, "1.33": 4 / 3}
# run name -> data settings on top of the tumour MIL part's (flips and rotations stay on in all). Every run
# but `defaults` names its stain settings, so it means the same whatever the defaults are.
STAIN_RUNS: dict[str, dict[str, object]] = {
    "flips_only": {"stain_augment": False, "stain_normalise": "none"},  # the defaults, before and after
    **{
        f"stain_augment_x{name}": {
            "stain_augment": True,
            "stain_augment_strength": strength,
            "stain_normalise": "none",
        }
        for name, strength in STRENGTHS.items()
    },
    "macenko": {"stain_normalise": "macenko", "stain_augment": False},
    "macenko+stain_augment": {"stain_normalise": "macenko", "stain_augment": True},
    "reinhard": {"stain_normalise": "reinhard", "stain_augment": False},
    "reinhard+stain_augment": {"stain_normalise": "reinhard", "stain_augment": True},
    "defaults": {},  # whatever the product does without being told
}
# Held-out labs score the defaults (flips only: stain augmentation stays off by default, as the image
# methods and the demo did worse with it on), the augmentation chosen before and the one chosen now.
BEFORE, FORMER, CHOSEN = "flips_only", "stain_augment_x1", "stain_augment_x0.67"
TUNING_LABS = tuple(range(1, 17))
# Drawn once (Python's secrets.SystemRandom, 8 of 100-99999 not used before) after 2/3 was chosen on
# tuning labs 1-16; reported whatever they show.
HELD_OUT_LABS = (7319, 14914, 24292, 34491, 78132, 85029, 96221, 98563)
# The held-out labs of strength 1's choice (drawn after it the same way): drawn-90565 failed it (balanced
# accuracy 0.600 over three seeds), which led to scoring labs 9-16; retired, still scored and reported.
RETIRED_LABS = (5164, 21511, 66733, 75593, 89212, 90565, 91751, 99782)
HELD_OUT_RUNS = (BEFORE, FORMER, CHOSEN)
BUNDLED_LABS = ("A", "B", "C")


def lab_seeds(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def stain_labs(args: argparse.Namespace) -> dict[str, list[str]]:
    """The part's labs by role: bundled (A trains), tuning and held-out (drawn), checked disjoint."""
    tuning, held_out = lab_seeds(args.stain_tuning_labs), lab_seeds(args.stain_held_out_labs)
    shared = sorted(set(tuning) & set(held_out))
    if shared:
        raise SystemExit(
            f"--stain-held-out-labs: {shared} are tuning labs too; the two sets must be disjoint"
        )
    retired = [s for s in RETIRED_LABS if s not in set(tuning) | set(held_out)]
    return {
        "bundled": list(BUNDLED_LABS),
        "tuning": [drawn_lab_name(s) for s in tuning],
        "held_out": [drawn_lab_name(s) for s in held_out],
        "retired": [drawn_lab_name(s) for s in retired],
    }


def stain_sets(labs: dict[str, list[str]]) -> dict[str, Path]:
    """The demo's slides as lab A stains them (the bundled set), and their test slides as every other
    lab does (same tissue, labels and splits)."""
    sets = {"A": make_slide_set(demo_dir())}
    for lab in BUNDLED_LABS[1:]:
        sets[lab] = make_slide_set(demo_dir().with_name(f"demo-slides-lab{lab}"), lab=lab)
    for lab in [*labs["tuning"], *labs["held_out"], *labs.get("retired", [])]:
        sets[lab] = make_slide_set(demo_dir().with_name(f"demo-slides-{lab}"), lab=lab, splits=("test",))
    return sets


def described(labs: dict[str, list[str]]) -> dict[str, dict[str, object]]:
    """How each lab stains, against lab A (`Lab.describe`), for the tables."""
    return {lab: lab_named(lab).describe() for role in labs.values() for lab in role}


def scored_labs(name: str, labs: dict[str, list[str]]) -> list[str]:
    """The labs a run is tested on: held-out and retired labs only for the defaults and the choices."""
    held_out = [*labs["held_out"], *labs.get("retired", [])] if name in HELD_OUT_RUNS else []
    return [*labs["bundled"], *labs["tuning"], *held_out]


def wanted_keys(name: str, labs: dict[str, list[str]]) -> set[str]:
    return {f"{m}_{lab}" for lab in scored_labs(name, labs) for m in ("auc", "balanced_accuracy")}


def stain_run(
    args: argparse.Namespace, sets: dict[str, Path], labs: dict[str, list[str]], name: str, seed: int
) -> dict[str, float]:
    """Train ABMIL-ACC on lab A with the run's stain settings (or take its finished checkpoint); AUC and
    balanced accuracy at the threshold chosen on (lab A's) validation slides, on each lab's test slides."""
    # `bigslide demo`'s settings (tiles of 32 px at 1 µm/px, bags of 24, learning rate 2e-3), more epochs
    config = slide_config(args, sets["A"], "tumour", "abmil_acc", seed, f"stain-{name}")
    config.optim.epochs = args.stain_epochs
    for key, value in STAIN_RUNS[name].items():
        setattr(config.data, key, value)
    result = train_run(config)
    assert result.checkpoint is not None
    metrics: dict[str, float] = {}
    for lab in scored_labs(name, labs):
        table = SlideTable.from_csv(sets[lab])
        test = table.subset("test")
        _, raw = predict_slides(result.checkpoint, test, repeats=0)
        labels = np.array([table.encode(e.label) for e in test.entries])
        found = classification_metrics(labels, raw.probs, raw.decision)
        metrics[f"auc_{lab}"] = found["auc"]
        metrics[f"balanced_accuracy_{lab}"] = found["balanced_accuracy"]
    return metrics
