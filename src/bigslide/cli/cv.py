"""`bigslide cv`: k-fold cross-validation by case, one training run per fold, and a summary table."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from bigslide.engine.config import TrainConfig
from bigslide.engine.loop import RunResult


def run_cv(args: argparse.Namespace, config: TrainConfig) -> int:
    """Train `--folds` runs under `--out` (`fold_<i>/`) and write `<out>/summary.csv`.

    A cross-validation always resumes, with or without `--resume`: rerunning the same command skips
    the folds that finished, continues the one that was stopped from its checkpoint, and trains the
    rest. The folds are derived again from the table, `--folds` and `run.seed`; if they differ from
    those already in `--out` (or a started fold's settings changed) it stops with an error instead of
    mixing two cross-validations in one folder.
    """
    from bigslide.cli.progress import run_with_progress
    from bigslide.engine.cv import prepare_folds, train_fold, write_summary

    quiet = bool(args.quiet)
    folds = prepare_folds(config, args.folds)
    results: list[RunResult] = []
    for fold in folds:
        results.append(run_with_progress(train_fold(fold, resume=True), quiet=quiet))
    summary = write_summary(Path(config.run.out_dir) / "summary.csv", results)
    if not quiet:
        for line in _mean_sd_lines(summary):
            print(line)
    print(f"summary: {summary}")
    return 0


def _mean_sd_lines(summary: Path) -> list[str]:
    """`name: mean ± sd` for each test metric (val when there is none) of a written summary."""
    with summary.open(newline="") as f:
        rows = {row["fold"]: row for row in csv.DictReader(f)}
    mean, sd = rows.get("mean", {}), rows.get("sd", {})
    names = [c for c in mean if c.startswith("test_")] or [c for c in mean if c.startswith("val_")]
    return [f"{name}: {mean[name]} ± {sd.get(name, '')}" for name in names]
