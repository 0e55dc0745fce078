"""K-fold cross-validation by case: one training run per fold, then a summary over the folds.

Layout of a cross-validation folder `<out>`:

- `fold_<i>/split.csv` (slide,case,split): the fold's assignment, checked again on every rerun;
- `fold_<i>/table.csv`: the fold's slide table, which the fold's run reads (`data.csv`);
- `fold_<i>/...`: the fold's run (config.yaml, checkpoints/last.pt, metrics.json, ...);
- `fold_<i>/done.json`: written once the fold's run has finished; a rerun skips such folds;
- `summary.csv`: one row per fold (final val metrics, test metrics), then their mean and sd.

A slide table with rows in the `test` split keeps them as a fixed test set scored by every fold; the
folds are then made from the other rows and each fold's held-out cases are its validation set. Without
a fixed test set each fold's held-out cases are its test set, and a validation set is carved from the
remaining cases.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

from bigslide.data.processes import DecodeProcesses
from bigslide.data.sources import load_table
from bigslide.data.table import SlideTable
from bigslide.data.tile_cache import FOLDER_NAME
from bigslide.engine.config import TrainConfig
from bigslide.engine.events import Event, Message
from bigslide.engine.loop import RunResult, train
from bigslide.engine.run import checkpoint_path
from bigslide.engine.setup import decode_processes
from bigslide.errors import ConfigError, DataError
from bigslide.files import atomic_write_text

SPLIT_COLUMNS = ("slide", "case", "split")
# Settings that may change between reruns without changing what a finished fold learned.
RERUN_FREE = frozenset(
    {
        "data.csv",
        "data.source",
        "data.workers",
        "data.prefetch",
        "data.tile_cache",
        "run.out_dir",
        "run.device",
        "run.tensorboard",
        "run.dist_timeout",
        "run.checkpoint_every",
    }
)


@dataclass
class CvFold:
    """One fold of a cross-validation: its slide table and the run that trains on it."""

    index: int  # 1-based, as in the folder name
    count: int  # folds in all
    table: SlideTable
    config: TrainConfig  # the fold's run: data.csv is its table, run.out_dir its folder

    @property
    def out_dir(self) -> Path:
        return Path(self.config.run.out_dir)

    @property
    def done_path(self) -> Path:
        return self.out_dir / "done.json"

    def done(self) -> dict[str, Any] | None:
        """The finished run's record, or None while the fold has not finished."""
        try:
            record = json.loads(self.done_path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None


def make_folds(table: SlideTable, k: int, seed: int) -> list[SlideTable]:
    """`k` copies of `table` whose splits hold out each case in exactly one fold.

    Folds are made by case (a case's slides are always on one side), stratified by the table's strata
    (class, or event for survival) when every stratum has at least `k` cases. Rows already in the
    `test` split stay there in every fold, and a fold's held-out cases are its `val` split; without such
    rows the held-out cases are the fold's `test` split and `val` is carved from the rest by case. Any
    other split the table gives (train, val) is replaced by the fold's.
    """
    if k < 2:
        raise ConfigError(f"folds: need at least 2 folds, got {k}")
    fixed_test = _fixed_test_cases(table)
    pool = [rows for case, rows in table.cases().items() if case not in fixed_test]
    if len(pool) < k:
        where = " outside the fixed test split" if fixed_test else ""
        raise DataError(
            f"folds: {k} folds need at least {k} cases{where}, the slide table has {len(pool)} "
            "(a case's slides are held out together)"
        )
    held_out = _held_out_cases(table, pool, k, seed)
    folds = []
    for fold_cases in held_out:
        entries = [dataclasses.replace(e) for e in table.entries]
        for c, rows in enumerate(pool):
            split: str | None
            if fixed_test:
                split = "val" if c in fold_cases else "train"
            else:
                split = "test" if c in fold_cases else None  # None: filled by `with_splits` below
            for i in rows:
                entries[i].split = split
        fold = table.like(entries)
        folds.append(fold if fixed_test else fold.with_splits(seed=seed))
    return folds


def _fixed_test_cases(table: SlideTable) -> set[str]:
    """Cases in the `test` split; one with slides on both sides would leak into training."""
    cases = set()
    for case, rows in table.cases().items():
        splits = {table.entries[i].split == "test" for i in rows}
        if splits == {True, False}:
            raise DataError(
                f"case {case!r} has slides in the test split and outside it; put all of them in one"
            )
        if splits == {True}:
            cases.add(case)
    return cases


def _held_out_cases(table: SlideTable, pool: list[list[int]], k: int, seed: int) -> list[set[int]]:
    """For each fold, the indices (into `pool`) of its held-out cases."""
    strata = table.strata(pool)
    counts = np.unique(strata, return_counts=True)[1]
    # groups relabelled in a seeded order: GroupKFold breaks its size ties by label, so this shuffles
    order = np.random.default_rng(seed).permutation(len(pool))
    group_of_case = np.empty(len(pool), dtype=np.int64)
    group_of_case[order] = np.arange(len(pool))
    rows_case = np.array([c for c, rows in enumerate(pool) for _ in rows])
    groups = group_of_case[rows_case]
    x = np.zeros(len(rows_case))
    splitter: StratifiedGroupKFold | GroupKFold
    if len(counts) > 1 and counts.min() >= k:
        splitter = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    else:  # a stratum too small to appear in every fold (or none to stratify by)
        splitter = GroupKFold(n_splits=k)
    y = strata[rows_case]
    return [set(rows_case[test].tolist()) for _, test in splitter.split(x, y, groups)]


def prepare_folds(config: TrainConfig, k: int, *, resume: bool = True) -> list[CvFold]:
    """Derive the folds of `config`'s slide table, write each fold's `split.csv` and `table.csv` under
    `run.out_dir`, and check them against a previous run of the same folder (a mismatch is an error).
    With `resume`, a fold already started must also have been started with the same settings."""
    if config.data.source not in ("csv", "demo"):
        raise ConfigError(
            f"data.source: cross-validation splits a slide table by case; {config.data.source} has none "
            "(use csv or demo)"
        )
    table = load_table(config.data)
    tables = make_folds(table, k, config.run.seed)
    out = Path(config.run.out_dir)
    folds = []
    for i, fold_table in enumerate(tables, start=1):
        folder = out / f"fold_{i}"
        values = config.to_dict()
        # absolute, as `TrainConfig.from_yaml` would read a relative one from the config's folder
        values["data"].update(source="csv", csv=str((folder / "table.csv").resolve()))
        values["run"]["out_dir"] = str(folder)
        if values["data"]["tile_cache"] == "auto":  # beside the cross-validation's folder, for every fold
            values["data"]["tile_cache"] = str(out.resolve().parent / FOLDER_NAME)
        folds.append(CvFold(i, k, fold_table, TrainConfig.from_dict(values, source=str(folder))))
    # every fold is checked before any file is written: a mismatch leaves the folder as it was
    for fold in folds:
        _check_split(fold)
        if resume:
            _check_settings(fold)
    for fold in folds:
        _write_split(fold)
    return folds


def _split_rows(table: SlideTable) -> list[list[str]]:
    return [[str(e.path), e.case_id, e.split or ""] for e in table.entries]


def _check_split(fold: CvFold) -> None:
    path = fold.out_dir / "split.csv"
    if not path.is_file():
        return
    with path.open(newline="") as f:
        saved = list(csv.reader(f))
    rows = _split_rows(fold.table)
    if saved[:1] != [list(SPLIT_COLUMNS)] or saved[1:] != rows:
        raise DataError(f"{path}: {_split_difference(saved[1:], rows)}")


def _write_split(fold: CvFold) -> None:
    path = fold.out_dir / "split.csv"
    if not path.is_file():
        text = io.StringIO()
        csv.writer(text).writerows([list(SPLIT_COLUMNS), *_split_rows(fold.table)])
        atomic_write_text(path, text.getvalue())
    table_csv = fold.out_dir / "table.csv"
    if not table_csv.is_file():
        tmp = fold.out_dir / ".table.csv.tmp"  # beside it: to_csv writes paths relative to its folder
        fold.table.to_csv(tmp)
        os.replace(tmp, table_csv)


def _split_difference(saved: list[list[str]], now: list[list[str]]) -> str:
    """Why a saved split no longer matches the folds derived now, in one line."""
    why = "the slide table, the number of folds or run.seed changed since this folder was made"
    old = {row[0]: row for row in saved if row}
    new = {row[0]: row for row in now}
    if set(old) != set(new):
        added, gone = sorted(set(new) - set(old)), sorted(set(old) - set(new))
        first = f"{Path(added[0]).name} is new" if added else f"{Path(gone[0]).name} is gone"
        return f"this fold was made from other slides ({first}); {why}; use another output folder"
    slide = next((s for s in new if old[s] != new[s]), None)
    if slide is None:  # the same rows in another order: folds and training order depend on it
        return f"the slide table lists its slides in another order; {why}; use another output folder"
    return (
        f"the folds differ from those this folder was made with ({Path(slide).name}: "
        f"{old[slide][2] or '-'} then, {new[slide][2] or '-'} now); {why}; use another output folder"
    )


def _check_settings(fold: CvFold) -> None:
    """A fold that has started must go on with the settings it started with."""
    saved_path = fold.out_dir / "config.yaml"
    started = fold.done_path.is_file() or checkpoint_path(fold.config).is_file()
    if not (started and saved_path.is_file()):
        return
    saved = _flatten(yaml.safe_load(saved_path.read_text()) or {})
    now = _flatten(yaml.safe_load(yaml.safe_dump(fold.config.to_dict())))
    changed = sorted(k for k in set(saved) | set(now) if k not in RERUN_FREE and saved.get(k) != now.get(k))
    if changed:
        shown = ", ".join(f"{k}: {saved.get(k)!r} then, {now.get(k)!r} now" for k in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise ConfigError(
            f"{saved_path}: fold {fold.index} was trained with other settings ({shown}{more}); "
            "use another output folder for other settings"
        )


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and key != "params":
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def train_fold(
    fold: CvFold, *, resume: bool = True, processes: DecodeProcesses | None = None
) -> Generator[Event, None, RunResult]:
    """Train one fold (events as `train` yields them; its slides read in `processes` when given). With
    `resume`, a finished fold is not trained again (its recorded result is returned) and an interrupted
    one continues from its checkpoint."""
    sizes = " / ".join(f"{len(fold.table.subset(s))} {s}" for s in ("train", "val", "test"))
    record = fold.done() if resume else None
    if record is not None:
        yield Message(
            f"fold {fold.index}/{fold.count}: finished before ({fold.done_path}), not trained again"
        )
        ckpt = checkpoint_path(fold.config)
        return RunResult(
            fold.out_dir,
            ckpt if ckpt.is_file() else None,
            list(record.get("history", [])),
            int(record.get("steps", 0)),
            None,
            record.get("test"),
        )
    fold.done_path.unlink(missing_ok=True)
    yield Message(f"fold {fold.index}/{fold.count}: {sizes} slides -> {fold.out_dir}")
    for said in one_class_splits(fold.table):
        yield Message(f"fold {fold.index}/{fold.count}: {said}")
    result = yield from train(fold.config, resume=resume, processes=processes)
    # written only now, atomically: a fold with this file is never trained again
    done = {"fold": fold.index, "steps": result.steps, "history": result.history, "test": result.test}
    atomic_write_text(fold.done_path, json.dumps(done, indent=2))
    return result


def one_class_splits(table: SlideTable) -> list[str]:
    """Words for a fold's validation or test slides all of one class: their AUC and balanced accuracy
    cannot be computed (NaN in the fold's figures), a sign of too few cases per class for the folds."""
    if table.task != "classification":
        return []
    out = []
    for split in ("val", "test"):
        labels = {e.label for e in table.subset(split).entries}
        if len(labels) == 1:
            out.append(
                f"its {split} slides are all {labels.pop()!r}: AUC and balanced accuracy cannot be "
                "computed on them (too few cases of a class for this many folds); the summary leaves them out"
            )
    return out


def summary_rows(results: list[RunResult]) -> list[dict[str, Any]]:
    """One row per fold (`fold`, the final epoch's `val_*` metrics, the `test_*` metrics), then `mean`
    and `sd` rows (sample sd), ignoring NaN and missing values."""
    rows: list[dict[str, Any]] = []
    for i, result in enumerate(results, start=1):
        val: dict[str, float] = next((r["val"] for r in reversed(result.history) if r.get("val")), {})
        row: dict[str, Any] = {"fold": i}
        row.update({f"val_{k}": float(v) for k, v in val.items()})
        row.update({f"test_{k}": float(v) for k, v in (result.test or {}).items()})
        rows.append(row)
    names = [c for c in dict.fromkeys(k for row in rows for k in row) if c != "fold"]
    mean: dict[str, Any] = {"fold": "mean"}
    sd: dict[str, Any] = {"fold": "sd"}
    for name in names:
        values = np.array([row.get(name, math.nan) for row in rows], dtype=np.float64)
        finite = values[~np.isnan(values)]
        mean[name] = float(finite.mean()) if len(finite) else math.nan
        sd[name] = float(finite.std(ddof=1)) if len(finite) > 1 else math.nan
    return [*rows, mean, sd]


def write_summary(path: str | Path, results: list[RunResult]) -> Path:
    """`summary_rows` of the folds' results as a CSV, written atomically."""
    rows = summary_rows(results)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return atomic_write_text(path, text.getvalue())


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def cross_validate(config: TrainConfig, k: int, *, resume: bool = True) -> Generator[Event, None, Path]:
    """Train one run per fold of `config`'s slide table under `run.out_dir`, then write `summary.csv`;
    returns its path. With `resume` (the default) a rerun of an interrupted cross-validation skips the
    finished folds and continues the one it stopped in from its checkpoint; without it every fold is
    trained afresh. The folds are derived again on every run and must match those already on disk."""
    folds = prepare_folds(config, k, resume=resume)
    results = []
    processes = decode_processes(config.data)  # every fold's slides read by the same workers
    try:
        for fold in folds:
            results.append((yield from train_fold(fold, resume=resume, processes=processes)))
    finally:
        if processes is not None:
            processes.close()
    summary = write_summary(Path(config.run.out_dir) / "summary.csv", results)
    yield Message(f"cross-validation summary: {summary}")
    return summary
