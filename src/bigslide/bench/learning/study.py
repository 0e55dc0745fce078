"""The learning bench's study part: survival, regression and case-level classification on the synthetic
study slides (`bigslide.synthetic.study`), end-to-end ABMIL-ACC against the frozen encoder, each scored
on the test split next to the oracle (the quantity the outcome was made from) on the same slides."""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr
from sksurv.metrics import concordance_index_censored

from bigslide.bench.learning.runs import base_config, train_run
from bigslide.engine import TrainConfig
from bigslide.synthetic.study import StudyKind, make_study_set

STUDY_METHODS = ("abmil_acc", "frozen_abmil")
STUDY_KINDS: tuple[StudyKind, ...] = ("survival", "regression", "cases")
STUDY_SEED = 11  # the slides; the runs' seeds vary


def study_set(args: argparse.Namespace, kind: StudyKind) -> Path:
    cache = Path(os.environ.get("BIGSLIDE_CACHE", Path.home() / ".cache" / "bigslide"))
    n = args.study_slides
    return make_study_set(cache / f"learning-study-{kind}-{n}", kind, n=n, seed=STUDY_SEED)


def study_config(
    args: argparse.Namespace, csv_path: Path, kind: StudyKind, method: str, seed: int
) -> TrainConfig:
    config = base_config(args, f"study-{kind}-{method}", method, seed)
    config.data.csv = str(csv_path)
    config.data.task = "classification" if kind == "cases" else kind
    config.data.target_mpp, config.data.tile_size = 1.0, 32
    config.data.bag_size = args.study_bag
    config.data.augment = method != "frozen_abmil"  # precomputed features are of un-augmented tiles
    config.optim.epochs = args.study_epochs
    if kind != "cases":  # a burden: the pooled feature must grow with the share of lesion tissue
        config.method.params = {"attention": "sigmoid"}
    return config


def study_run(
    args: argparse.Namespace, csv_path: Path, kind: StudyKind, method: str, seed: int
) -> dict[str, float]:
    """Train, and the run's test metrics with the oracle's on the same test slides (or cases)."""
    result = train_run(study_config(args, csv_path, kind, method, seed))
    assert result.test is not None, f"{csv_path}: no test split"
    metrics = dict(result.test)
    with csv_path.open() as f:
        test = [row for row in csv.DictReader(f) if row["split"] == "test"]
    oracle = np.array([float(r["oracle"]) for r in test])
    if kind == "survival":
        event = np.array([r["event"] == "1" for r in test])
        time = np.array([float(r["time"]) for r in test])
        metrics["oracle_c_index"] = float(concordance_index_censored(event, time, oracle)[0])
    elif kind == "regression":
        metrics["oracle_pearson_r"] = float(pearsonr(oracle, [float(r["target"]) for r in test])[0])
    return metrics
