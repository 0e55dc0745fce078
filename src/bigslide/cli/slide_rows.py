"""Per-slide outputs of `bigslide predict`, and `predictions.csv` assembled from them.

Each slide, once predicted, gets its heatmaps (`heatmaps/<name>.<map>.npz|png|geojson`, its name from
`output_names`) and then its row, `slides/<stem>.<key>.json` (key: a digest of the slide's path, so two
slides of one name in different folders keep apart): the prediction's outputs, or the slide's error,
with the settings it was predicted with. Every file is written under a temporary name and renamed, and
the row last, so a row on disk means the slide's outputs are whole. A rerun keeps the slides whose row
holds a prediction made with the same checkpoint (by content), repeats and slide_mpp (and heatmaps, when
asked for) of the slide file as it is now (its size and modification time: a file replaced under the same
name is predicted again) and predicts the others, failed ones included. `predictions.csv` is then rebuilt
from the rows of the table's slides, in table order, and, where the table labels its cases, their score
(`bigslide.engine.cohort_score`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from bigslide.cli.report import write_heatmaps, write_predictions
from bigslide.data.endpoint import Endpoint
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideTable
from bigslide.data.tile_cache import files_identity
from bigslide.engine.cohort_score import FILE_NAME as SCORE_FILE
from bigslide.engine.cohort_score import CohortScore, score_cohort
from bigslide.engine.decision import Decision
from bigslide.engine.slide_prediction import SlideFailure, SlidePrediction
from bigslide.explain.tissue_check import CSV_NAME, check_row, write_check_csv
from bigslide.files import atomic_write_text
from bigslide.tiling.grid import TileGrid

ROWS = "slides"
HEATMAPS = "heatmaps"


def checkpoint_digest(path: str | Path) -> str:
    """sha256 of the checkpoint file: rows are kept only for the weights that made them."""
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def row_path(out: Path, slide: Path) -> Path:
    key = hashlib.sha256(str(slide).encode()).hexdigest()[:12]
    return out / ROWS / f"{slide.name.split('.')[0]}.{key}.json"


def write_slide_outputs(
    out: Path,
    result: SlidePrediction | SlideFailure,
    *,
    settings: dict[str, Any],
    heatmaps: bool,
    tiles: int = 0,
    grid: TileGrid | None = None,
    slides: SlideCache | None = None,
    name: str | None = None,
) -> Path:
    """The slide's heatmaps (a prediction's, when `heatmaps`; drawn where `slides` decode; named `name`)
    and its tissue check's line (with its `grid`; the thumbnail was drawn where the slide was read), then
    its row."""
    row: dict[str, Any] = {
        "slide": str(result.slide),
        "settings": settings,
        "file": files_identity(result.slide),
        "tiles": tiles,
    }
    if grid is not None:
        row["tissue_check"] = check_row(result.slide, grid)
    if isinstance(result, SlideFailure):
        row |= {"error": result.error, "outputs": None, "heatmaps": None}
    else:
        files = write_heatmaps(result, out / HEATMAPS, slides, name) if heatmaps else None
        row |= {
            "error": "",
            # JSON numbers round-trip a float exactly; the dtype brings back the very array predicted
            "outputs": np.atleast_1d(result.probs).astype(float).tolist(),
            "dtype": str(np.asarray(result.probs).dtype),
            "heatmaps": None if files is None else [str(p.relative_to(out)) for p in files],
        }
    return atomic_write_text(row_path(out, result.slide), json.dumps(row, indent=1) + "\n")


def read_row(out: Path, slide: Path) -> dict[str, Any] | None:
    """The slide's row, or None when there is none (or an unreadable one: predicted again)."""
    try:
        row = json.loads(row_path(out, slide).read_text())
    except (OSError, ValueError):
        return None
    return row if isinstance(row, dict) and row.get("slide") == str(slide) else None


def settings_by_row(table: SlideTable, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row's settings: a row giving its slide's µm/px (`mpp`) has it as its `slide_mpp`; a slide of a
    case of several also keeps its case's slides and theirs, since the case's prediction is made from all
    of them (a slide moved into or out of a case makes its rows stale)."""
    entries = table.entries
    by_row = [settings if e.mpp is None else {**settings, "slide_mpp": e.mpp} for e in entries]
    for rows in table.cases().values():
        if len(rows) > 1:
            slides = [str(entries[r].path) for r in rows]
            mpps = [entries[r].mpp for r in rows]
            for r in rows:
                by_row[r] = {**by_row[r], "case_slides": slides}
                if any(m is not None for m in mpps):
                    by_row[r]["case_mpps"] = mpps
    return by_row


def kept(out: Path, slide: Path, settings: dict[str, Any], *, heatmaps: bool) -> bool:
    """Whether an earlier run's outputs for `slide` stand for this run: a prediction (not an error) with
    the same settings, and its heatmaps on disk when this run wants them."""
    row = read_row(out, slide)
    if row is None or row.get("error") or row.get("outputs") is None or row.get("settings") != settings:
        return False
    if row.get("file") != files_identity(slide):  # the file was replaced (or touched) since
        return False
    if not heatmaps:
        return True
    files = row.get("heatmaps")
    return files is not None and all((out / f).is_file() for f in files)


class Assembled(NamedTuple):
    csv: Path
    score: CohortScore | None  # None: the table labels none of the cases predicted


def assemble_predictions(
    out: Path,
    table: SlideTable,
    *,
    classes: list[str],
    endpoint: Endpoint,
    titles: dict[str, str] | None = None,
    epochs: int = 0,
    decision: Decision | None = None,
) -> Assembled:
    """`predictions.csv` (and the survival plot) from the rows of `table`'s slides, in table order; a
    slide without a row (not reached yet) is left out. Classes are called by `decision`. Where the table
    labels its cases, their score too (`cohort_metrics.json`)."""
    results: list[SlidePrediction | SlideFailure] = []
    for entry in table.entries:
        row = read_row(out, entry.path)
        if row is None:
            continue
        if row.get("outputs") is None:
            results.append(SlideFailure(entry.path, str(row.get("error") or "no outputs")))
        else:
            probs = np.asarray(row["outputs"], dtype=np.dtype(row.get("dtype", "float64")))
            results.append(
                SlidePrediction(
                    entry.path, probs, classes, {}, dict(titles or {}), epochs, endpoint, decision=decision
                )
            )
    checks = [
        row["tissue_check"] for e in table.entries if (row := read_row(out, e.path)) and "tissue_check" in row
    ]
    if checks:
        write_check_csv(checks, out / CSV_NAME)
    csv = write_predictions(results, out, heatmaps=False, table=table, endpoint=endpoint)
    score = score_cohort(table, results, endpoint, decision)
    if score is not None:
        score.write(out)
    else:  # no label now: a score from an earlier run on a labelled table would be taken for this one's
        (out / SCORE_FILE).unlink(missing_ok=True)
    return Assembled(csv, score)
