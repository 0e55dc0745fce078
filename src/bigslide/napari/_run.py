"""Turn the panels' choices into a run folder the CLI can replay, and drive the engine in a worker.

Each Start makes a new run folder (`<runs>/<method>-<date>-<time>`), so no run overwrites another. A run
folder holds `slides.csv`, the drawn regions as GeoJSON (`regions/`), `config.yaml` and, once
training has started, `checkpoints/last.pt`. `bigslide train <out>/config.yaml` repeats the run.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bigslide.engine.config import DataConfig, MethodConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig
from bigslide.errors import DataError, TrainingError

if TYPE_CHECKING:
    import napari

    from bigslide.data.table import SlideTable
    from bigslide.engine.events import Event
    from bigslide.napari._session import Session


def new_run_folder(runs: str | Path, method: str, now: datetime | None = None) -> Path:
    """A fresh folder `<runs>/<method>-<date>-<time>` (suffixed if taken): no run overwrites another."""
    root = Path(runs).expanduser().resolve()
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    folder = root / f"{method}-{stamp}"
    suffix = 2
    while folder.exists():
        folder = root / f"{method}-{stamp}-{suffix}"
        suffix += 1
    return folder


def check_before_start(session: Session, stated_mpp: dict[Path, bool], *, seed: int = 0) -> list[str]:
    """What stops a run from being worth starting, in words a pathologist reads, naming the panel field.

    `stated_mpp` says for the slides open in the viewer whether their files state a µm/px (no file is
    opened here: this runs in the GUI thread; the run itself names any other slide that states none)."""
    try:
        table = session.table()
    except DataError as err:
        return [str(err)]
    problems = []
    labels = sorted({e.label for e in table.entries}) if table.task == "classification" else ["", "-"]
    if len(labels) < 2:
        problems.append(
            f"every slide is labelled '{labels[0]}': a model needs at least two classes to learn; type "
            "another label in the Slides panel's Label column"
        )
    split = table.with_splits(seed=seed)
    train_labels = {e.label for e in split.entries if e.split == "train"}
    if table.task == "classification" and len(labels) >= 2 and len(train_labels) < 2:
        problems.append(
            f"the training slides are all '{next(iter(train_labels), '-')}': set the Split column so that "
            "each class has a training slide"
        )
    if not any(e.split == "val" for e in split.entries):
        problems.append(
            "no slide is left for validation, so nothing would say whether the model learns: set one "
            "slide's Split to 'val' in the Slides panel, or leave at least three on 'auto'"
        )
    problems += case_problems(table)
    if session.slide_mpp is None:
        unstated = [
            e.path.name for e in table.entries if e.mpp is None and stated_mpp.get(e.path.resolve()) is False
        ]
        if unstated:
            problems.append(f"{', '.join(unstated)}: the file states no pixel size; enter {FALLBACK_FIELD}")
    return problems


def case_problems(table: SlideTable) -> list[str]:
    """Slides of one case (the table's case column) that disagree on what the task learns or on their
    split, named as the Slides table shows them: the run reads its copy of the table back and would stop
    a few seconds in, naming a row of that copy, a file the user never wrote."""
    from bigslide.data.table import TASK_COLUMNS, case_conflicts, outcome_words

    columns = TASK_COLUMNS[table.task]
    problems = []
    for at_odds in case_conflicts(table.entries, table.task):
        first, other = table.entries[at_odds.first], table.entries[at_odds.other]
        if at_odds.what == "outcome":
            said = [outcome_words(e.outcome(table.task), table.task) for e in (first, other)]
            problems.append(
                f"case '{at_odds.case}': {first.path.name} has {said[0]} but {other.path.name} {said[1]}; a "
                f"case's slides must agree: give them one {' and '.join(columns)} in the Slides panel"
            )
        else:
            problems.append(
                f"case '{at_odds.case}': {first.path.name} is in split {first.split or 'auto'} but "
                f"{other.path.name} in {other.split or 'auto'}; a case's slides must be on one side: give "
                "them one Split in the Slides panel"
            )
    return problems


FALLBACK_FIELD = "its scanner's µm/px in the Slides panel's 'slide µm/px if unstated' field"


SKIP_BAD_FIELD = "tick 'skip bad slides' in the Train panel's data settings"


def in_panel_words(message: str) -> str:
    """An engine message with the config keys a panel user never sees replaced by the panel fields."""
    message = message.replace(
        "give its level-0 µm per pixel with data.slide_mpp (--slide-mpp)", f"enter {FALLBACK_FIELD}"
    )
    return re.sub(r"[Ss]et data\.skip_bad_slides: true", SKIP_BAD_FIELD, message)


def stopped_status(run_dir: Path) -> tuple[str, Path | None]:
    """What a panel's status line says once a run it stopped has ended, and the checkpoint it left."""
    from bigslide.engine.run_folder import LAST

    checkpoint = run_dir / LAST
    if checkpoint.is_file():
        return f"Stopped. Checkpoint: {checkpoint}", checkpoint
    return "Stopped before the first step: no checkpoint was written.", None


def write_run_folder(
    viewer: napari.Viewer,
    session: Session,
    out: Path,
    *,
    method: str,
    method_params: dict[str, Any],
    data_values: dict[str, Any],
    model: ModelConfig,
    optim: OptimConfig,
    device: str,
) -> TrainConfig:
    """Write slides.csv (+ regions) and config.yaml into the new folder `out`; returns the config.

    Everything is checked before the first file is written, so a refused start leaves nothing behind."""
    from bigslide.methods.base import make_params

    make_params(method, method_params)  # a wrong parameter fails here, naming it
    table = session.table()
    data = DataConfig(
        csv="slides.csv",
        tile_size=session.tile_size,
        target_mpp=session.target_mpp,
        slide_mpp=session.slide_mpp,
        min_tissue=session.min_tissue,
        ink_flatness=session.tissue.ink_flatness,
        task=table.task,  # type: ignore[arg-type]  # a TASKS value: the table checked it
        **data_values,
    )
    config = TrainConfig(
        data=data,
        model=model,
        method=MethodConfig(method, dict(method_params)),
        optim=optim,
        run=RunConfig(out_dir=str(out), device=device),  # type: ignore[arg-type]
    )
    from bigslide.napari._regions import write_run_regions

    write_run_regions(viewer, session, out / "regions")
    table = session.table()  # again: rows now point at the saved regions
    table.to_csv(out / "slides.csv")
    config.to_yaml(out / "config.yaml")  # the table named relative to it: the folder can move
    config.data.csv = str(out / "slides.csv")  # as `TrainConfig.from_yaml` reads it back
    return config


def drive(run: Generator[Event, None, Any]) -> Generator[Event, None, Any]:
    """The engine's events, passed through for a napari worker.

    The worker reports a RuntimeError from the generator only as a warning, so (torch) runtime errors
    are re-raised as `TrainingError`, which reaches the worker's `errored` signal and the user.
    """
    try:
        return (yield from run)
    except RuntimeError as err:
        raise TrainingError(f"training failed: {err}") from err
