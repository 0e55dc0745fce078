"""Write inference results: a predictions CSV (and a Kaplan-Meier plot for survival) and, per slide,
heatmaps as npz + PNG overlay + GeoJSON."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bigslide.data.endpoint import Endpoint
from bigslide.data.slides import SlideCache
from bigslide.data.table import TASK_COLUMNS, SlideEntry, SlideTable
from bigslide.engine.slide_prediction import SlideFailure, SlidePrediction
from bigslide.explain.export import grid_geojson, overlay_png
from bigslide.explain.survival import km_plot, risk_groups
from bigslide.files import atomic_path, atomic_write_text
from bigslide.wsi.names import output_names, slide_stem
from bigslide.wsi.slide import open_slide


def write_heatmaps(
    pred: SlidePrediction, out: Path, slides: SlideCache | None = None, name: str | None = None
) -> list[Path]:
    """Per map: the grid (npz), its overlay on the thumbnail (PNG) and QuPath tiles (GeoJSON), named
    `<name>.<map>.<suffix>` (`name`: the slide's `output_names` among its cohort; by default its stem);
    each file written under a temporary name and renamed, so none is ever found half written. With
    `slides`, done where they decode (a decode worker: the thumbnail is read, the PNG encoded there)."""
    stem = name or slide_stem(pred.slide)
    if slides is not None:
        what = f"{pred.slide}: a decode worker process died while drawing its heatmaps"
        return slides.run(_write_heatmaps, pred, out, stem, what=what)
    return _write_heatmaps(None, pred, out, stem)


def _write_heatmaps(slides: SlideCache | None, pred: SlidePrediction, out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    with slides.opened(pred.slide) if slides is not None else open_slide(pred.slide) as slide:
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
    """`predictions.csv`: per slide, or per case when slides are grouped into cases (a `case` column and
    the case's slides joined by ";"), the class and its probabilities, the predicted number, or the risk
    (higher = earlier event) with the survival curve, and an `error` column: empty, or why the slide (a
    case: one of its slides) has no prediction. Heatmaps are per slide. With the table's survival times
    and events, the Kaplan-Meier plot of the median-split risk groups with its log-rank p-value
    (`km.png`). `endpoint` (default: the first prediction's) sets the columns; two classes called by a
    threshold chosen on validation get a `threshold` column."""
    out.mkdir(parents=True, exist_ok=True)
    preds = [r for r in results if isinstance(r, SlidePrediction)]
    if endpoint is None:
        endpoint = (preds[0].endpoint if preds else None) or Endpoint(
            classes=preds[0].classes if preds else []
        )
    cases = {e.path: e.case for e in table.entries} if table is not None else {}
    by_case = any(p.case is not None for p in preds) or any(c is not None for c in cases.values())
    groups: dict[str, list[SlidePrediction | SlideFailure]] = {}
    files = output_names([r.slide for r in results])
    for r in results:
        case = r.case if isinstance(r, SlidePrediction) and r.case is not None else cases.get(r.slide)
        groups.setdefault(case if by_case and case is not None else str(r.slide), []).append(r)
        if heatmaps and isinstance(r, SlidePrediction):
            write_heatmaps(r, out / "heatmaps", name=files[Path(r.slide)])
    names = ["case", "slides"] if by_case else ["slide"]
    entries = {e.path: e for e in table.entries} if table is not None else {}
    # the table's own values beside the prediction, when it gives them: a labelled cohort reads as scored
    truth = endpoint.task if any(e.labelled(endpoint.task) for e in entries.values()) else None  # its task
    decision = next((p.decision for p in preds if p.decision is not None), None)
    # two classes: the threshold the class was called with, on every row
    called = decision is not None and decision.source != "argmax" and len(endpoint.classes) == 2
    lines = [
        [
            *names,
            *(TASK_COLUMNS[truth] if truth else ()),
            *_columns(endpoint.task),
            *(["threshold"] if called else []),
            *endpoint.output_names,
            "error",
        ]
    ]
    firsts: list[SlidePrediction] = []
    for key, group in groups.items():
        named = [key, ";".join(str(g.slide) for g in group)] if by_case else [key]
        named += _truth(entries.get(group[0].slide), truth)
        failed = [g for g in group if isinstance(g, SlideFailure)]
        if failed:
            error = "; ".join(dict.fromkeys(f.error for f in failed))  # a case's failure, said once
            lines.append([*named, *[""] * (len(lines[0]) - len(named) - 1), error])
            continue
        first = group[0]
        assert isinstance(first, SlidePrediction)
        firsts.append(first)
        outputs = [f"{v:.6f}" for v in np.atleast_1d(first.probs)] if endpoint.output_names else []
        threshold = [f"{decision.threshold:.6g}"] if called and decision is not None else []
        lines.append([*named, *_values(first), *threshold, *outputs, ""])
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(lines)
    path = atomic_write_text(out / "predictions.csv", text.getvalue())
    if endpoint.task == "survival" and table is not None:
        known = {e.path: e for e in table.entries if e.labelled("survival")}
        scored = [(known[p.slide], p.risk) for p in firsts if p.slide in known]
        if len(scored) >= 2:
            time = np.array([e.time for e, _ in scored], dtype=float)
            event = np.array([e.event for e, _ in scored], dtype=float)
            km_plot(risk_groups(time, event, np.array([r for _, r in scored])), out / "km.png")
    return path


def _truth(entry: SlideEntry | None, task: str | None) -> list[str]:
    """The table's values of `task` (its TASK_COLUMNS) on `entry`'s row ('' where it gives none); none
    without a task."""
    if task is None:
        return []
    values = entry.outcome(task) if entry is not None else (None,) * len(TASK_COLUMNS[task])
    return ["" if v is None else f"{v:.10g}" if isinstance(v, float) else str(v) for v in values]


def _columns(task: str) -> list[str]:
    return {"classification": ["predicted"], "regression": ["predicted"], "survival": ["risk"]}[task]


def _values(p: SlidePrediction) -> list[str]:
    if p.task == "survival":
        return [f"{p.risk:.6f}"]
    if p.task == "regression":
        return [f"{float(p.probs[0]):.6g}"]
    return [p.label]
