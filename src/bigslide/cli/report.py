"""Write inference results: a predictions CSV (and a Kaplan-Meier plot for survival) and, per slide,
heatmaps as npz + PNG overlay + GeoJSON."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from bigslide.data.endpoint import Endpoint
from bigslide.data.table import SlideTable
from bigslide.engine.inference import SlidePrediction
from bigslide.explain.export import grid_geojson, overlay_png
from bigslide.explain.survival import km_plot, risk_groups
from bigslide.files import atomic_write_text
from bigslide.slide import open_slide, slide_stem


def write_heatmaps(pred: SlidePrediction, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stem = slide_stem(pred.slide)
    paths: list[Path] = []
    with open_slide(pred.slide) as slide:
        for name, grid in pred.grids.items():
            paths.append(grid.save_npz(out / f"{stem}.{name}.npz"))
            paths.append(overlay_png(grid, slide, out / f"{stem}.{name}.png"))
            paths.append(grid_geojson(grid, out / f"{stem}.{name}.geojson"))
    return paths


def write_predictions(
    preds: list[SlidePrediction], out: Path, *, heatmaps: bool = True, table: SlideTable | None = None
) -> Path:
    """`predictions.csv`: per slide, or per case when slides are grouped into cases (a `case` column and
    the case's slides joined by ";"), the class and its probabilities, the predicted number, or the risk
    (higher = earlier event) with the survival curve. Heatmaps are per slide. With the table's survival
    times and events, the Kaplan-Meier plot of the median-split risk groups with its log-rank p-value
    (`km.png`)."""
    out.mkdir(parents=True, exist_ok=True)
    endpoint = (preds[0].endpoint if preds else None) or Endpoint(classes=preds[0].classes if preds else [])
    by_case = any(p.case is not None for p in preds)
    rows: dict[str, list[SlidePrediction]] = {}
    for p in preds:
        rows.setdefault(p.case if by_case and p.case is not None else str(p.slide), []).append(p)
        if heatmaps:
            write_heatmaps(p, out / "heatmaps")
    lines = [
        [*(["case", "slides"] if by_case else ["slide"]), *_columns(endpoint.task), *endpoint.output_names]
    ]
    for key, group in rows.items():
        p = group[0]
        outputs = [f"{v:.6f}" for v in np.atleast_1d(p.probs)] if endpoint.output_names else []
        names = [key, ";".join(str(g.slide) for g in group)] if by_case else [key]
        lines.append([*names, *_values(p), *outputs])
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(lines)
    path = atomic_write_text(out / "predictions.csv", text.getvalue())
    if endpoint.task == "survival" and table is not None:
        known = {e.path: e for e in table.entries if e.time is not None and e.event is not None}
        firsts = [group[0] for group in rows.values()]
        scored = [(known[p.slide], p.risk) for p in firsts if p.slide in known]
        if len(scored) >= 2:
            time = np.array([e.time for e, _ in scored], dtype=float)
            event = np.array([e.event for e, _ in scored], dtype=float)
            km_plot(risk_groups(time, event, np.array([r for _, r in scored])), out / "km.png")
    return path


def _columns(task: str) -> list[str]:
    return {"classification": ["predicted"], "regression": ["predicted"], "survival": ["risk"]}[task]


def _values(p: SlidePrediction) -> list[str]:
    if p.task == "survival":
        return [f"{p.risk:.6f}"]
    if p.task == "regression":
        return [f"{float(p.probs[0]):.6g}"]
    return [p.label]
