"""Suggestions of where to teach, from a trained checkpoint and a slide table (`bigslide suggest`)."""

from __future__ import annotations

from pathlib import Path

from bigslide.data.processes import DecodeProcesses
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.engine.inference import predict_slides
from bigslide.errors import DataError
from bigslide.explain.suggest import DROPOUT_SAMPLES, SlideScores, Suggestion, normal_class, suggest
from bigslide.tiling.annotations import annotations_path, read_annotations


def annotations_file(entry: SlideEntry, table_csv: str | Path | None) -> Path | None:
    """Where a slide's teaching annotations are: its row's annotations column, else the file the napari
    panel saves beside the table (`annotations/<slide>.annotations.geojson`)."""
    if entry.annotations is not None:
        return entry.annotations
    return annotations_path(table_csv, entry.path) if table_csv is not None else None


def suggest_from_checkpoint(
    checkpoint: str | Path,
    table: SlideTable,
    count: int = 20,
    *,
    table_csv: str | Path | None = None,
    normal: str | None = None,
    area_tiles: int = 3,
    samples: int = DROPOUT_SAMPLES,
    device: str = "auto",
    slide_mpp: float | None = None,
    processes: DecodeProcesses | None = None,
) -> list[Suggestion]:
    """Up to `count` places on the slides of `table` where an answer would teach the checkpoint's model
    most (`bigslide.explain.suggest`). `normal` is the class of slides without lesion (default: the class
    named normal, negative, benign, ...; none: no false alarms are sought); areas inside a slide's
    teaching annotations (its row's, or those saved beside `table_csv`) are skipped."""
    preds, _ = predict_slides(
        checkpoint, table, device=device, slide_mpp=slide_mpp, processes=processes, attention_samples=samples
    )
    classes = preds[0].classes if preds else []
    if normal is None and preds and preds[0].task == "classification":
        normal = normal_class(classes)
    elif normal is not None and normal not in classes:
        raise DataError(f"normal: {normal!r} is none of the model's classes ({', '.join(classes)})")
    slides = []
    for pred, entry in zip(preds, table.entries, strict=True):
        if "attention" not in pred.grids:
            raise DataError(
                f"{checkpoint}: its model scores no tiles (no attention map); suggestions need an "
                "attention-MIL method"
            )
        saved = annotations_file(entry, table_csv)
        drawn = read_annotations(saved) if saved is not None and saved.is_file() else []
        label = entry.label if entry.label in classes else None
        slides.append(
            SlideScores(entry.path, pred.grids["attention"], label, pred.grids.get("attention_spread"), drawn)
        )
    return suggest(slides, count, normal=normal, area_tiles=area_tiles)
