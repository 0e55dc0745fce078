"""The slide table: which slides to train on, their labels, splits and sampling regions (a CSV)."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from bigslide.errors import DataError

SPLITS = ("train", "val", "test")


@dataclass
class SlideEntry:
    path: Path
    label: str
    split: str | None = None
    regions: Path | None = None


@dataclass
class SlideTable:
    entries: list[SlideEntry]
    classes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.classes:
            self.classes = sorted({e.label for e in self.entries})

    def __len__(self) -> int:
        return len(self.entries)

    def encode(self, label: str) -> int:
        try:
            return self.classes.index(label)
        except ValueError:
            raise DataError(f"label {label!r} is not one of the classes {self.classes}") from None

    def subset(self, split: str) -> SlideTable:
        return SlideTable([e for e in self.entries if e.split == split], list(self.classes))

    @classmethod
    def from_csv(
        cls,
        path: str | Path,
        *,
        classes: list[str] | None = None,
        check_files: bool = True,
        labels_required: bool = True,
    ) -> SlideTable:
        """Read `slide,label[,split][,regions]`. Relative paths are relative to the CSV's folder.

        With `classes` given, a label outside them is an error naming the row. For prediction
        (`labels_required=False`) the label column may be missing or empty.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8-sig")
        except FileNotFoundError:
            raise DataError(f"{path}: no such slide table") from None
        except UnicodeDecodeError:
            raise DataError(f"{path}: not a text CSV file") from None
        reader = csv.DictReader(text.splitlines())
        columns = [c.strip() for c in reader.fieldnames or []]
        missing = ({"slide", "label"} if labels_required else {"slide"}) - set(columns)
        if missing:
            raise DataError(
                f"{path}: missing column(s) {sorted(missing)}; expected slide,label[,split][,regions]"
            )
        entries: list[SlideEntry] = []
        seen: dict[Path, int] = {}
        for row_no, raw in enumerate(reader, start=2):
            row = {(k or "").strip(): (v or "").strip() for k, v in raw.items()}
            where = f"{path}, row {row_no}"
            if not row.get("slide"):
                raise DataError(f"{where}: empty slide path")
            label = row.get("label", "")
            if not label and labels_required:
                raise DataError(f"{where}: empty label for {row['slide']}")
            slide = _resolve(path, row["slide"])
            if check_files and not slide.is_file():
                raise DataError(f"{where}: slide file not found: {slide}")
            if slide in seen:
                raise DataError(f"{where}: {slide.name} is listed twice (first at row {seen[slide]})")
            seen[slide] = row_no
            split = row.get("split") or None
            if split is not None and split not in SPLITS:
                raise DataError(f"{where}: split {split!r} is not one of {list(SPLITS)}")
            if classes is not None and label and label not in classes:
                raise DataError(f"{where}: unknown label {label!r}; known labels: {classes}")
            regions = _resolve(path, row["regions"]) if row.get("regions") else None
            if regions is not None and check_files and not regions.is_file():
                raise DataError(f"{where}: regions file not found: {regions}")
            entries.append(SlideEntry(slide, label, split, regions))
        if not entries:
            raise DataError(f"{path}: the slide table has no rows")
        return cls(entries, list(classes) if classes else [])

    def to_csv(self, path: str | Path) -> Path:
        """Write the table; paths are stored relative to the CSV when they lie below its folder."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        base = path.parent.resolve()
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["slide", "label", "split", "regions"])
            for e in self.entries:
                writer.writerow(
                    [
                        _relative(e.path, base),
                        e.label,
                        e.split or "",
                        _relative(e.regions, base) if e.regions else "",
                    ]
                )
        return path

    def with_splits(self, *, val_fraction: float = 0.25, seed: int = 0) -> SlideTable:
        """Fill missing splits with a stratified train/val split; existing splits are kept."""
        todo = [i for i, e in enumerate(self.entries) if e.split is None]
        if not todo:
            return self
        labels = np.array([self.entries[i].label for i in todo])
        n_val = round(len(todo) * val_fraction)
        entries = [SlideEntry(e.path, e.label, e.split, e.regions) for e in self.entries]
        if n_val == 0 or len(todo) - n_val == 0:
            for i in todo:
                entries[i].split = "train"
            return SlideTable(entries, list(self.classes))
        counts = np.unique(labels, return_counts=True)[1]
        stratify = labels if counts.min() >= 2 and n_val >= len(counts) else None
        train_idx, val_idx = train_test_split(todo, test_size=n_val, random_state=seed, stratify=stratify)
        for i in train_idx:
            entries[i].split = "train"
        for i in val_idx:
            entries[i].split = "val"
        return SlideTable(entries, list(self.classes))


def _resolve(csv_path: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (csv_path.parent / p).resolve()


def _relative(p: Path, base: Path) -> str:
    try:
        return str(p.resolve().relative_to(base))
    except ValueError:
        return str(p)
