"""Where to teach next: the few places on the training slides whose answer (lesion, Not lesion) would
teach an attention-MIL model most, each with the reason it was chosen.

Three kinds of place, mixed so that no one kind or slide takes every place:
- *false alarm*: high attention (at least `HIGH` times its slide's mean) on a slide labelled with the
  class whose slides hold no lesion (the normal class). Such a slide has nothing to find, so every tile
  it attends to strongly is a mistake the answer corrects. A normal slide the model attends to evenly has
  no false alarm: its strongest places are asked about only when no other kind has a place left.
- *uncertain*: on the other slides, tiles whose attention rank moves most when dropout is drawn on the
  tile features (`MILMethod.attention_spread`): where the model is guessing.
- *looked at*: the strongest attention on the other slides: is it really the lesion?

A suggestion is a square of `area_tiles` x `area_tiles` tiles of the model's grid around the chosen
tile, on tissue, clear of the others and of the slide's teaching annotations. Suggestions are written as
QuPath GeoJSON of class `REVIEW_CLASS`, which ends in "*": bigslide does not train on it. An answer
turns a suggestion into a teaching annotation (`save_answer`).
"""

from __future__ import annotations

import itertools
import json
import math
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import shapely
from shapely.geometry import Polygon, box, mapping

from bigslide.errors import DataError
from bigslide.explain.heatmap import ScoreGrid
from bigslide.files import atomic_write_text
from bigslide.tiling.annotations import (
    Annotation,
    class_index,
    instance_classes,
    read_annotations,
    write_annotations,
)
from bigslide.tiling.regions import plain_geojson, read_features
from bigslide.wsi.names import output_names

REVIEW_CLASS = "Suggestion*"
"""The class suggestions are written with: QuPath shows it, bigslide trains only on answered ones."""
REVIEW_COLOUR = (255, 0, 255)
KINDS = ("false_alarm", "uncertain", "looked_at")
# Of every four places: two false alarms (an answer known to correct the model), one uncertain, one
# looked at; a kind with nothing left gives its turn to the next, and so do false alarms below HIGH.
TURNS = ("false_alarm", "uncertain", "false_alarm", "looked_at")
NORMAL_NAMES = (
    "normal",
    "negative",
    "neg",
    "benign",
    "healthy",
    "no",
    "0",
    "none",
    "absent",
    "no lesion",
    "lesion-free",
    "non-tumor",
    "non-tumour",
    "non-neoplastic",
    "no tumor",
    "no tumour",
    "tumor-free",
    "tumour-free",
)
DROPOUT_SAMPLES = 16
HIGH = 2.0
"""Attention this many times its slide's mean is called high in a reason, and makes a false alarm on a
normal slide; a model that attends nearly evenly (a weak or an early one) still gets its strongest places
asked about, without the word."""


@dataclass(frozen=True)
class Suggestion:
    """A place to answer on `slide`: a level-0 box (x0, y0, x1, y1), why it was chosen, and its rank
    (1 = answer first)."""

    slide: Path
    box: tuple[float, float, float, float]
    kind: str
    reason: str
    score: float
    rank: int = 0

    @property
    def polygon(self) -> Polygon:
        return box(*self.box)

    @property
    def centre(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return (x0 + x1) / 2, (y0 + y1) / 2


@dataclass
class SlideScores:
    """What suggestions are drawn from for one slide: its attention map (and spread map), its label in
    the table (None: unlabelled) and its teaching annotations (areas to skip)."""

    slide: Path
    attention: ScoreGrid
    label: str | None = None
    spread: ScoreGrid | None = None
    annotations: Sequence[Annotation] = field(default_factory=list)


def normal_class(classes: Sequence[str]) -> str | None:
    """The class whose slides hold no lesion, by its name (normal, negative, benign, ...); None when no
    class is named so (pass it explicitly)."""
    for name in classes:
        if " ".join(name.split()).casefold() in NORMAL_NAMES:
            return name
    return None


def suggest(
    slides: Sequence[SlideScores],
    count: int,
    *,
    normal: str | None,
    area_tiles: int = 3,
) -> list[Suggestion]:
    """Up to `count` places, ranked (see the module); `normal` is the class of lesion-free slides (None:
    no false alarms are sought)."""
    if count < 1:
        raise DataError(f"count: {count} suggestions asked; ask for at least 1")
    if area_tiles < 1:
        raise DataError(f"area_tiles: {area_tiles}; an area is at least 1 tile")
    pools = {kind: _pool([_candidates(s, normal)[kind] for s in slides]) for kind in KINDS}
    with_places = {int(i) for _s, index, _r, _c in pools.values() for i in np.unique(index)}
    cap = max(1, math.ceil(2 * count / max(1, len(with_places))))
    unions = {
        i: shapely.union_all([a.geometry for a in s.annotations])
        for i, s in enumerate(slides)
        if s.annotations
    }
    taken: dict[int, list[tuple[int, int]]] = {}
    per_slide: Counter[int] = Counter()
    chosen: list[Suggestion] = []
    cursor = dict.fromkeys(KINDS, 0)
    for kind in itertools.cycle(TURNS):
        if len(chosen) >= count or all(cursor[k] >= len(pools[k][0]) for k in KINDS):
            break
        scores, indices, rows, cols = pools[kind]
        if kind == "false_alarm" and _no_alarm_left(pools, cursor):
            continue
        while cursor[kind] < len(scores):
            at = cursor[kind]
            cursor[kind] += 1
            score, index, row, col = float(scores[at]), int(indices[at]), int(rows[at]), int(cols[at])
            s = slides[index]
            if per_slide[index] >= cap or overlaps(taken.get(index, []), row, col, area_tiles):
                continue
            area = area_box(s.attention, row, col, area_tiles)
            if index in unions and _covered(area, unions[index]):
                continue
            taken.setdefault(index, []).append((row, col))
            per_slide[index] += 1
            reason = _reason(kind, score, s.label)
            chosen.append(Suggestion(s.slide, area.bounds, kind, reason, score, len(chosen) + 1))
            break
    return chosen


def _no_alarm_left(pools: Mapping[str, tuple[np.ndarray, ...]], cursor: dict[str, int]) -> bool:
    """Whether a false alarm's turn passes: the strongest normal-slide place left is below `HIGH` times
    its slide's mean (nothing to correct there) while another kind still has places to ask about."""
    scores = pools["false_alarm"][0]
    weak = cursor["false_alarm"] < len(scores) and scores[cursor["false_alarm"]] < HIGH
    return bool(weak) and any(cursor[k] < len(pools[k][0]) for k in KINDS if k != "false_alarm")


Candidates = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A slide's candidates of one kind: (score, row, col) arrays over its map's cells."""


def _candidates(s: SlideScores, normal: str | None) -> dict[str, Candidates]:
    """Per kind, the slide's cells worth asking about and their scores (every cell above the slide's mean
    attention; for the uncertain kind, every cell whose rank moves at all)."""
    none = (np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    out = dict.fromkeys(KINDS, none)
    scores = s.attention.scores
    rows, cols = np.nonzero(np.isfinite(scores))
    if not len(rows):
        return out
    values = scores[rows, cols].astype(np.float64)
    values = values - min(0.0, values.min())  # raw scores below zero counted from the lowest
    mean = values.mean()
    relative = values / mean if mean > 0 else np.zeros_like(values)
    negative = normal is not None and s.label is not None and s.label == normal
    looked = relative > 1  # above the slide's mean: a place the model looks
    out["false_alarm" if negative else "looked_at"] = (relative[looked], rows[looked], cols[looked])
    if s.spread is not None and not negative:
        spread = _on_grid(s.spread, s.attention, rows, cols)
        moves = np.isfinite(spread) & (spread > 0)
        out["uncertain"] = (spread[moves], rows[moves], cols[moves])
    return out


def _pool(per_slide: list[Candidates]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every slide's candidates of one kind as (score, slide index, row, col), highest score first (ties
    in slide order, then row-major)."""
    if not per_slide:
        empty = np.zeros(0, np.int64)
        return np.zeros(0), empty, empty, empty
    scores = np.concatenate([c[0] for c in per_slide]).astype(np.float64)
    index = np.concatenate([np.full(len(c[0]), i, np.int64) for i, c in enumerate(per_slide)])
    rows = np.concatenate([c[1] for c in per_slide]).astype(np.int64)
    cols = np.concatenate([c[2] for c in per_slide]).astype(np.int64)
    order = np.argsort(-scores, kind="stable")
    return scores[order], index[order], rows[order], cols[order]


def _reason(kind: str, score: float, label: str | None) -> str:
    """Why a place was chosen, in words (made only for the places chosen)."""
    if kind == "uncertain":
        return f"uncertain: its attention rank moves by {score:.0%} of the slide across dropout samples"
    labelled = f"a slide labelled {label}" if label is not None else "an unlabelled slide"
    question = "" if kind == "false_alarm" else ": is it the lesion?"
    high = "high attention" if score >= HIGH else "attention"
    return f"{high} ({score:.2f}x the slide's mean) on {labelled}{question}"


def strongest_attention(suggestions: Sequence[Suggestion]) -> float | None:
    """The highest attention, relative to its slide's mean, of the places chosen for their attention
    (None: none was)."""
    return max((s.score for s in suggestions if s.kind != "uncertain"), default=None)


def flat_attention(suggestions: Sequence[Suggestion]) -> str | None:
    """Words for a model whose strongest places chosen for their attention are all below HIGH times their
    slide's mean (None when one reaches it, or none was chosen for its attention): such a model has not
    learnt where to look, and the places it asks about are near random."""
    strongest = strongest_attention(suggestions)
    if strongest is None or strongest >= HIGH:
        return None
    return (
        f"the model attends nearly evenly on these slides (its strongest place {strongest:.2f}x its "
        f"slide's mean, below {HIGH:g}x): it has not learnt where to look yet, so these places are near "
        "random; train it further before asking"
    )


def _on_grid(values: ScoreGrid, like: ScoreGrid, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """`values` at the cells (rows, cols) of `like` (two maps of one prediction share a grid)."""
    x = like.origin[0] + (cols + 0.5) * like.cell_size_level0
    y = like.origin[1] + (rows + 0.5) * like.cell_size_level0
    c = np.floor((x - values.origin[0]) / values.cell_size_level0).astype(int)
    r = np.floor((y - values.origin[1]) / values.cell_size_level0).astype(int)
    inside = (r >= 0) & (c >= 0) & (r < values.scores.shape[0]) & (c < values.scores.shape[1])
    out = np.full(len(rows), np.nan)
    out[inside] = values.scores[r[inside], c[inside]]
    return out


def overlaps(taken: list[tuple[int, int]], row: int, col: int, side: int) -> bool:
    """Whether an area around (row, col) would overlap one already taken on the slide."""
    return any(abs(row - r) < side and abs(col - c) < side for r, c in taken)


def area_box(grid: ScoreGrid, row: int, col: int, side: int) -> Polygon:
    cell = grid.cell_size_level0
    x0 = grid.origin[0] + (col - side // 2) * cell
    y0 = grid.origin[1] + (row - side // 2) * cell
    return box(x0, y0, x0 + side * cell, y0 + side * cell)


def _covered(area: Polygon, annotated: shapely.Geometry) -> bool:
    """Whether a slide's teaching annotations already cover the area's centre, or half of it."""
    return bool(annotated.contains(area.centroid) or annotated.intersection(area).area >= area.area / 2)


def write_suggestions(suggestions: Sequence[Suggestion], path: str | Path) -> list[Path]:
    """Write every suggestion to `path` (each feature names its slide), and, for QuPath (which imports a
    file onto the image open), each slide's to `<path without suffix>/<name>.suggestions.geojson` (the
    slide's `output_names`: two slides called HE.svs in two case folders get a file each).
    Returns the files written, `path` first."""
    path = Path(path)
    written = [atomic_write_text(path, _collection(suggestions))]
    by_slide: dict[Path, list[Suggestion]] = {}
    for s in suggestions:
        by_slide.setdefault(s.slide, []).append(s)
    folder = path.with_suffix("")
    names = output_names(by_slide)
    for slide, some in by_slide.items():
        written.append(atomic_write_text(folder / f"{names[slide]}.suggestions.geojson", _collection(some)))
    return written


def _collection(suggestions: Sequence[Suggestion]) -> str:
    features = [
        {
            "type": "Feature",
            "id": str(uuid.uuid4()),
            "geometry": plain_geojson(mapping(s.polygon)),
            "properties": {
                "objectType": "annotation",
                "name": f"{s.rank}. {s.reason}",
                "classification": {"name": REVIEW_CLASS, "color": list(REVIEW_COLOUR)},
                "measurements": {"rank": s.rank, "score": s.score},
                "slide": str(s.slide),
                "kind": s.kind,
                "reason": s.reason,
            },
        }
        for s in suggestions
    ]
    return json.dumps({"type": "FeatureCollection", "features": features})


def read_suggestions(path: str | Path) -> list[Suggestion]:
    """The suggestions of a file `write_suggestions` wrote (or QuPath saved back), in rank order."""
    path = Path(path)
    out = []
    for index, feature in enumerate(read_features(path, "suggestions", DataError)):
        where = f"{path}: feature {index}"
        props = feature.get("properties") if isinstance(feature, dict) else None
        if not isinstance(props, dict) or not isinstance(props.get("slide"), str):
            raise DataError(f"{where}: not a bigslide suggestion (no 'slide' property)")
        try:
            polygon = shapely.geometry.shape(feature["geometry"])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise DataError(f"{where}: no valid geometry ({err})") from None
        measurements = props.get("measurements") or {}
        out.append(
            Suggestion(
                Path(props["slide"]),
                tuple(float(v) for v in polygon.bounds),  # type: ignore[arg-type]
                str(props.get("kind", "")),
                str(props.get("reason", "")),
                float(measurements.get("score", 0.0)),
                int(measurements.get("rank", index + 1)),
            )
        )
    return sorted(out, key=lambda s: s.rank)


def save_answer(
    suggestion: Suggestion, answer: str, annotations_file: str | Path, classes: Sequence[str] = ()
) -> Path:
    """Add the answered suggestion to a slide's teaching annotations (the file is created when
    missing; written atomically): its area, classed `answer` (a task class or "Not lesion")."""
    annotations_file = Path(annotations_file)
    if classes:
        class_index(answer, instance_classes(classes), "answer")
    saved = read_annotations(annotations_file) if annotations_file.is_file() else []
    return write_annotations([*saved, Annotation(suggestion.polygon, answer)], annotations_file, classes)
