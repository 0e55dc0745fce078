"""The slide table: which slides to train on, their labels, splits and sampling regions (a CSV)."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bigslide.data.labels import check_label_spelling, class_order
from bigslide.data.table_cells import (
    check_slide_folder,
    number_cell,
    pixel_size_cell,
    relative_path,
    resolve_path,
)
from bigslide.data.table_text import NUMBER_COLUMNS, SEPARATORS, read_table_text
from bigslide.errors import DataError
from bigslide.wsi.dicom_series import DICOM_SUFFIX, is_dicom_file, looks_like_dicom_folder, starts_as_tiff
from bigslide.wsi.names import WSI_SUFFIXES, is_slide_name

SPLITS = ("train", "val", "test")
TASKS = ("classification", "survival", "regression")
# What each task reads from the table, besides `slide` (and the optional split, regions, case).
TASK_COLUMNS = {"classification": ("label",), "survival": ("time", "event"), "regression": ("target",)}


@dataclass
class SlideEntry:
    """One row of the slide table. `case` groups a patient's slides (None: the slide is its own case);
    `time`/`event` are the survival endpoint (event 1 = observed, 0 = censored), `target` a number;
    `annotations` a QuPath GeoJSON of teaching annotations (`bigslide.tiling.annotations`); `mpp` the
    slide's level-0 µm per pixel, for a file that states none (`bigslide.data.slides.open_with_mpp`)."""

    path: Path
    label: str
    split: str | None = None
    regions: Path | None = None
    case: str | None = None
    time: float | None = None
    event: int | None = None
    target: float | None = None
    annotations: Path | None = None
    mpp: float | None = None

    @property
    def case_id(self) -> str:
        return self.case if self.case is not None else str(self.path)

    def outcome(self, task: str) -> tuple[object, ...]:
        """What the task learns from this row (slides of one case must agree on it)."""
        return {"classification": (self.label,), "survival": (self.time, self.event)}.get(
            task, (self.target,)
        )

    def labelled(self, task: str) -> bool:
        """Whether the row gives the task's values (a slide to predict may give none)."""
        return all(v is not None and v != "" for v in self.outcome(task))


def slides_at(path: Path) -> list[Path] | None:
    """The slides `path` names when it is not a slide table: itself (a slide file, by its name or, named
    otherwise, by its first bytes; a DICOM file; a folder holding one DICOM series), or every whole-slide
    file in a folder and its subfolders and every DICOM series folder among them, in name order. None for
    anything else (a table)."""
    if path.is_dir():
        if looks_like_dicom_folder(path):
            return [path]
        inside = sorted(path.rglob("*"))  # one walk of the tree
        found = [p for p in inside if p.is_file() and is_slide_name(p)]
        found += [p for p in inside if p.is_dir() and looks_like_dicom_folder(p)]
        if not found:
            raise DataError(
                f"{path}: a folder with no slide in it (whole-slide files are named "
                f"{', '.join(WSI_SUFFIXES)}, or a folder of DICOM files); give a slide table (CSV) for "
                "other images"
            )
        return found
    if is_slide_name(path, images=True) or path.suffix.lower() == DICOM_SUFFIX:
        if not path.exists():
            raise DataError(f"{path}: no such slide file")
        return [path]
    if path.is_file() and (starts_as_tiff(path) or is_dicom_file(path)):  # a slide named without its suffix
        return [path]
    return None


def implied_task(columns: list[str] | set[str]) -> str:
    """The task a table's columns imply: survival with time and event, regression with target, else
    classification (for viewers that show what a table holds)."""
    if {"time", "event"} <= set(columns):
        return "survival"
    return "regression" if "target" in columns else "classification"


@dataclass
class SlideTable:
    entries: list[SlideEntry]
    classes: list[str] = field(default_factory=list)
    task: str = "classification"

    def __post_init__(self) -> None:
        if not self.classes and self.task == "classification":
            named: dict[str, list[str]] = {}
            for e in self.entries:
                named.setdefault(e.label, []).append(e.path.name)
            check_label_spelling(named, "", "slide")
            self.classes = sorted(named, key=class_order)

    def __len__(self) -> int:
        return len(self.entries)

    def encode(self, label: str) -> int:
        try:
            return self.classes.index(label)
        except ValueError:
            raise DataError(f"label {label!r} is not one of the classes {self.classes}") from None

    def like(self, entries: list[SlideEntry]) -> SlideTable:
        """Another table of the same task and classes."""
        return SlideTable(entries, list(self.classes), self.task)

    def subset(self, split: str) -> SlideTable:
        return self.like([e for e in self.entries if e.split == split])

    def cases(self) -> dict[str, list[int]]:
        """Row indices of each case, in table order."""
        out: dict[str, list[int]] = {}
        for i, e in enumerate(self.entries):
            out.setdefault(e.case_id, []).append(i)
        return out

    def case_of_several(self) -> tuple[str, int] | None:
        """The first case made of more than one slide, with its number of slides; None when every case is
        one slide (for what reads slides one by one)."""
        return next(((c, len(rows)) for c, rows in self.cases().items() if len(rows) > 1), None)

    def strata(self, case_rows: list[list[int]]) -> np.ndarray:
        """What splits are stratified by, one value per case: the class, the event (survival), or
        nothing (regression)."""
        first = [self.entries[rows[0]] for rows in case_rows]
        if self.task == "classification":
            return np.array([e.label for e in first])
        if self.task == "survival":
            return np.array([str(e.event) for e in first])
        return np.zeros(len(first), dtype=str)

    @property
    def columns(self) -> list[str]:
        """The columns this table writes: slide, the task's, split, regions, and case, mpp and annotations
        when any row has one."""
        cols = ["slide", *TASK_COLUMNS[self.task], "split", "regions"]
        cols += ["case"] if any(e.case is not None for e in self.entries) else []
        cols += ["mpp"] if any(e.mpp is not None for e in self.entries) else []
        return cols + (["annotations"] if self.annotated() else [])

    def annotated(self) -> bool:
        """Whether any row points to teaching annotations."""
        return any(e.annotations is not None for e in self.entries)

    @classmethod
    def to_predict(cls, path: str | Path, *, classes: list[str] | None, task: str) -> SlideTable:
        """The slides a trained model looks at: a slide table (`from_csv`, its labels optional), one
        slide, or a folder of slides (`slides_at`). `classes`: the model's (a table's label outside them
        is an error naming its row)."""
        path = Path(path)
        slides = slides_at(path)
        if slides is None:
            return cls.from_csv(path, classes=classes, labels_required=False, task=task)
        return cls([SlideEntry(slide, "") for slide in slides], list(classes or []), task)

    @classmethod
    def from_csv(
        cls,
        path: str | Path,
        *,
        classes: list[str] | None = None,
        check_files: bool = True,
        labels_required: bool = True,
        task: str = "classification",
    ) -> SlideTable:
        """Read `slide` plus the task's columns (`label`; `time,event`; `target`) and the optional
        `split`, `regions`, `case`, `annotations` and `mpp` (also `µm/px` and other spellings). Relative
        paths are relative to the CSV's folder. A slide is a file, or a folder holding one DICOM
        whole-slide series.

        With `classes` given, a label outside them is an error naming the row. For prediction
        (`labels_required=False`) the task's columns may be missing or empty.
        """
        path = Path(path)
        if task not in TASKS:
            raise DataError(f"data.task: {task!r} is not one of {list(TASKS)}")
        columns, rows, separator = read_table_text(path)
        wanted = TASK_COLUMNS[task]
        missing = ({"slide", *wanted} if labels_required else {"slide"}) - set(columns)
        if missing:
            implied = implied_task(columns)
            hint = f"; its columns suggest data.task: {implied}" if implied != task else ""
            raise DataError(
                f"{path}: missing column(s) {', '.join(sorted(missing))} for data.task {task} "
                f"(columns read, separated by {SEPARATORS[separator]}: {', '.join(columns) or 'none'}); "
                f"expected slide,{','.join(wanted)}[,split][,regions][,case][,mpp][,annotations]{hint}"
            )
        entries: list[SlideEntry] = []
        seen: dict[Path, int] = {}
        label_rows: dict[str, list[int]] = {}
        for row_no, row in enumerate(rows, start=2):
            if separator == ";":  # a spreadsheet's decimal comma: 12,5 is 12.5
                row = {k: v.replace(",", ".") if k in NUMBER_COLUMNS else v for k, v in row.items()}
            where = f"{path}, row {row_no}"
            if not row.get("slide"):
                raise DataError(f"{where}: empty slide path")
            slide = resolve_path(path, row["slide"])
            if check_files and not slide.is_file():
                check_slide_folder(slide, where, row["slide"])
            if slide in seen:
                raise DataError(f"{where}: {slide.name} is listed twice (first at row {seen[slide]})")
            seen[slide] = row_no
            entry = SlideEntry(
                slide, row.get("label", ""), row.get("split") or None, None, row.get("case") or None
            )
            _read_outcome(entry, row, task, labels_required, where)
            if entry.split is not None and entry.split not in SPLITS:
                raise DataError(f"{where}: split {entry.split!r} is not one of {list(SPLITS)}")
            if classes is not None and entry.label and entry.label not in classes:
                raise DataError(f"{where}: unknown label {entry.label!r}; known labels: {classes}")
            entry.regions = resolve_path(path, row["regions"]) if row.get("regions") else None
            if entry.regions is not None and check_files and not entry.regions.is_file():
                raise DataError(f"{where}: regions file not found: {entry.regions}")
            entry.mpp = pixel_size_cell(row["mpp"], where) if row.get("mpp") else None
            entry.annotations = resolve_path(path, row["annotations"]) if row.get("annotations") else None
            if entry.annotations is not None and check_files and not entry.annotations.is_file():
                raise DataError(f"{where}: annotations file not found: {entry.annotations}")
            entries.append(entry)
            if entry.label:
                label_rows.setdefault(entry.label, []).append(row_no)
        if not entries:
            raise DataError(f"{path}: the slide table has no rows")
        # a case's slides at odds, named by their rows (entry i is row i + 2); prediction reads no split
        at_odds = case_conflicts(entries, task) if labels_required else []
        split = min((c for c in at_odds if c.what == "split"), key=lambda c: c.other, default=None)
        if split is not None:
            here, there = entries[split.other].split, entries[split.first].split
            raise DataError(
                f"{path}, row {split.other + 2}: case {split.case!r} is in split {here or '(none)'!r} here "
                f"but in {there or '(none)'!r} at row {split.first + 2}; a case's slides must be on one side"
            )
        if task == "classification":  # first: 'Tumor' against 'tumor' is a spelling, not a case at odds
            check_label_spelling(label_rows, f"{path}: ", "row")
        outcome = min((c for c in at_odds if c.what == "outcome"), key=lambda c: c.other, default=None)
        if outcome is not None:
            here, there = (
                outcome_words(entries[k].outcome(task), task) for k in (outcome.other, outcome.first)
            )
            raise DataError(
                f"{path}, row {outcome.other + 2}: case {outcome.case!r} has {here} here but {there} at row "
                f"{outcome.first + 2}; a case's slides must agree"
            )
        return cls(entries, list(classes) if classes else [], task)

    def to_csv(self, path: str | Path) -> Path:
        """Write the table; paths are stored relative to the CSV when they lie below its folder."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        base = path.parent.resolve()
        columns = self.columns
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            for e in self.entries:
                values = {
                    "slide": relative_path(e.path, base),
                    "label": e.label,
                    "time": "" if e.time is None else f"{e.time:g}",
                    "event": "" if e.event is None else str(e.event),
                    "target": "" if e.target is None else repr(e.target),
                    "split": e.split or "",
                    "regions": relative_path(e.regions, base) if e.regions else "",
                    "case": e.case or "",
                    "mpp": "" if e.mpp is None else f"{e.mpp:g}",
                    "annotations": relative_path(e.annotations, base) if e.annotations else "",
                }
                writer.writerow([values[c] for c in columns])
        return path

    def with_splits(self, *, val_fraction: float = 0.25, seed: int = 0) -> SlideTable:
        """Fill missing splits with a train/val split by case (a case's slides stay on one side),
        stratified by class or event; existing splits are kept."""
        from sklearn.model_selection import train_test_split  # here: sklearn takes a second to import

        cases = self.cases()
        todo = [rows for rows in cases.values() if all(self.entries[i].split is None for i in rows)]
        if not todo:
            return self
        entries = [dataclasses.replace(e) for e in self.entries]
        n_val = round(len(todo) * val_fraction)
        if n_val == 0 or len(todo) - n_val == 0:
            for rows in todo:
                for i in rows:
                    entries[i].split = "train"
            return self.like(entries)
        strata = self.strata(todo)
        counts = np.unique(strata, return_counts=True)[1]
        stratify = strata if counts.min() >= 2 and n_val >= len(counts) else None
        train_idx, val_idx = train_test_split(
            np.arange(len(todo)), test_size=n_val, random_state=seed, stratify=stratify
        )
        for side, picked in (("train", train_idx), ("val", val_idx)):
            for k in picked:
                for i in todo[k]:
                    entries[i].split = side
        return self.like(entries)


def _read_outcome(entry: SlideEntry, row: dict[str, str], task: str, required: bool, where: str) -> None:
    """The row's task columns into `entry`, with one-line errors naming the row."""
    if task == "classification":
        if not entry.label and required:
            raise DataError(f"{where}: empty label for {row['slide']}")
        return
    if task == "regression":
        value = row.get("target", "")
        if value or required:
            entry.target = number_cell(value, "target", where)
        return
    time, event = row.get("time", ""), row.get("event", "")
    if not (time or event or required):
        return
    entry.time = number_cell(time, "time", where)
    if entry.time <= 0:
        raise DataError(f"{where}: time must be > 0 (time to event or censoring), got {time}")
    if event not in ("0", "1", "0.0", "1.0"):
        raise DataError(f"{where}: event must be 1 (observed) or 0 (censored), got {event!r}")
    entry.event = int(float(event))


class CaseConflict(NamedTuple):
    """Two slides of one case at odds (`first` and `other`: indices into a table's entries) on `what`:
    "outcome" (what the task learns) or "split"."""

    case: str
    first: int
    other: int
    what: str


def case_conflicts(entries: Sequence[SlideEntry], task: str) -> list[CaseConflict]:
    """For each case (the case column), the first slide at odds with the case's first slide on what `task`
    learns, and the first at odds on the split: a case is one patient, learnt from and held out as one."""
    firsts: dict[str, int] = {}
    found: dict[tuple[str, str], CaseConflict] = {}
    for i, entry in enumerate(entries):
        if entry.case is None:
            continue
        first = firsts.setdefault(entry.case, i)
        if entry.outcome(task) != entries[first].outcome(task):
            found.setdefault((entry.case, "outcome"), CaseConflict(entry.case, first, i, "outcome"))
        if entry.split != entries[first].split:
            found.setdefault((entry.case, "split"), CaseConflict(entry.case, first, i, "split"))
    return list(found.values())


def outcome_words(outcome: tuple[object, ...], task: str) -> str:
    """A row's outcome (`SlideEntry.outcome`) as its columns and values: "label tumor", "time 3, event 1"."""
    return ", ".join(f"{c} {v}" for c, v in zip(TASK_COLUMNS[task], outcome))
