"""Write inference results: a predictions CSV (and a Kaplan-Meier plot for survival) and, per slide,
heatmaps as npz + PNG overlay + GeoJSON."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bigslide.data.endpoint import Endpoint
from bigslide.data.table import SlideTable
from bigslide.engine.inference import SlideFailure, SlidePrediction
from bigslide.explain.export import grid_geojson, overlay_png
from bigslide.explain.survival import km_plot, risk_groups
from bigslide.files import atomic_path, atomic_write_text
from bigslide.slide import open_slide


def write_heatmaps(pred: SlidePrediction, out: Path) -> list[Path]:
    """Per map: the grid (npz), its overlay on the thumbnail (PNG) and QuPath tiles (GeoJSON); each file
    written under a temporary name and renamed, so none is ever found half written."""
    out.mkdir(parents=True, exist_ok=True)
    stem = pred.slide.name.split(".")[0]
    paths: list[Path] = []
    with open_slide(pred.slide) as slide:
        for name, grid in pred.grids.items():
            for suffix, write in (
                ("npz", lambda p, g=grid: g.save_npz(p)),
                ("png", lambda p, g=grid: overlay_png(g, slide, p)),
                ("geojson", lambda p, g=grid: grid_geojson(g, p)),
            ):
                path = out / f"{stem}.{name}.{suffix}"
                with atomic_path(path) as tmp:
                    write(tmp)
                paths.append(path)
    return paths


def write_predictions(
    results: Sequence[SlidePrediction | SlideFailure],
    out: Path,
    *,
    heatmaps: bool = True,
    table: SlideTable | None = None,
    endpoint: Endpoint | None = None,
) -> Path:
    """`predictions.csv`: per slide the class and its probabilities, the predicted number, or the risk
    (higher = earlier event) with the survival curve, and an `error` column: empty, or why the slide has
    no prediction. With the table's survival times and events, the Kaplan-Meier plot of the median-split
    risk groups with its log-rank p-value (`km.png`). `endpoint` (default: the first prediction's) sets
    the columns."""
    out.mkdir(parents=True, exist_ok=True)
    preds = [r for r in results if isinstance(r, SlidePrediction)]
    if endpoint is None:
        endpoint = (preds[0].endpoint if preds else None) or Endpoint(
            classes=preds[0].classes if preds else []
        )
    lines = [["slide", *_columns(endpoint.task), *endpoint.output_names, "error"]]
    for r in results:
        if isinstance(r, SlideFailure):
            lines.append([str(r.slide), *[""] * (len(lines[0]) - 2), r.error])
            continue
        outputs = [f"{v:.6f}" for v in np.atleast_1d(r.probs)] if endpoint.output_names else []
        lines.append([str(r.slide), *_values(r), *outputs, ""])
        if heatmaps:
            write_heatmaps(r, out / "heatmaps")
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(lines)
    path = atomic_write_text(out / "predictions.csv", text.getvalue())
    if endpoint.task == "survival" and table is not None:
        known = {e.path: e for e in table.entries if e.time is not None and e.event is not None}
        rows = [(known[p.slide], p.risk) for p in preds if p.slide in known]
        if len(rows) >= 2:
            time = np.array([e.time for e, _ in rows], dtype=float)
            event = np.array([e.event for e, _ in rows], dtype=float)
            with atomic_path(out / "km.png") as tmp:
                km_plot(risk_groups(time, event, np.array([r for _, r in rows])), tmp)
    return path


def _columns(task: str) -> list[str]:
    return {"classification": ["predicted"], "regression": ["predicted"], "survival": ["risk"]}[task]


def _values(p: SlidePrediction) -> list[str]:
    if p.task == "survival":
        return [f"{p.risk:.6f}"]
    if p.task == "regression":
        return [f"{float(p.probs[0]):.6g}"]
    return [p.label]
