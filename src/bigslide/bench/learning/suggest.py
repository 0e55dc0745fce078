"""The learning bench's suggest part: do the places `bigslide suggest` picks teach more than random tissue
areas, or the places of highest attention, for the same number of answers?

Per seed, ABMIL-ACC trains on the subtle-lesion slides for `--suggest-start-epochs` (no annotations: the
model a pathologist would be asked to improve). From that checkpoint each arm picks areas of 3 x 3 tiles
on the training slides, in its own order, and an oracle answers them from the lesion masks, as a
pathologist would at a glance: the positive class when at least half the area's tiles lie in a lesion,
"Not lesion" when none does, and skip otherwise. Each arm takes answers until it has k; the answers are
the training slides' annotations of a retrain (data.instance_weight 1, as *Retrain with annotations*):
with `--suggest-retrain continue` (the default, as that button) from the checkpoint for
`--suggest-epochs`, with `anew` (as its "train anew") from the start's initial weights for
`--suggest-start-epochs` + `--suggest-epochs`. Arms: *suggested* (`bigslide.explain.suggest`), *random*
(random tissue areas), *top_attention* (the highest attention of any training slide, relative to its
slide's mean). Controls retrained the same way: *none* (no annotations) and *outlines* (the annotations
part's outlines of a quarter of the training lesions and normal squares).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
from pathlib import Path

import numpy as np
import shapely

from bigslide.bench.learning.runs import scored_on_test, slide_config, train_run
from bigslide.data.table import SlideTable
from bigslide.engine import RunResult
from bigslide.engine.inference import predict_slides
from bigslide.explain.heatmap import ScoreGrid
from bigslide.explain.suggest import (
    DROPOUT_SAMPLES,
    SlideScores,
    area_box,
    normal_class,
    overlaps,
    strongest_attention,
    suggest,
)
from bigslide.synthetic.slide_set import load_lesions
from bigslide.tiling.annotations import NOT_LESION, Annotation, annotations_path, write_annotations

ARMS = ("suggested", "random", "top_attention")
CONTROLS = ("none", "outlines")
AREA = 3  # tiles per side of an area
LESION_ANSWER = 0.5  # share of an area's tiles in a lesion from which the oracle answers the lesion class

Place = tuple[Path, shapely.Polygon]


def start_run(args: argparse.Namespace, csv_path: Path, seed: int) -> RunResult:
    """The checkpoint every arm starts from: ABMIL-ACC without annotations."""
    config = slide_config(args, csv_path, "subtle", "abmil_acc", seed, "suggest-start")
    config.optim.epochs = args.suggest_start_epochs
    return train_run(config)


def retrain(
    args: argparse.Namespace,
    csv_path: Path,
    table: Path,
    start: RunResult,
    name: str,
    seed: int,
    weight: float,
) -> dict[str, float]:
    """Trained on `table` and scored on the subtle test slides: `start`'s checkpoint for `--suggest-epochs`
    (continue), or the start's initial weights (the same seed) for both parts' epochs (anew)."""
    assert start.checkpoint is not None
    config = slide_config(args, table, "subtle", "abmil_acc", seed, f"suggest-{name}")
    if args.suggest_retrain == "anew":
        config.optim.epochs = args.suggest_start_epochs + args.suggest_epochs
    else:
        config.optim.epochs = args.suggest_epochs
        config.model.init_from = str(start.checkpoint)
    config.data.instance_weight = weight
    result = train_run(config)
    return scored_on_test(result, csv_path, csv_path.parent / "lesions.json", "attention")


def arm_places(
    checkpoint: Path, train: SlideTable, arm: str, seed: int, wanted: int
) -> tuple[list[Place], dict[Path, np.ndarray], float]:
    """The areas the arm asks about on the training slides, in its order (the suggested arm: `wanted` of
    them, as `bigslide suggest --count`), each training slide's tile centres (level 0), and the highest
    attention relative to its slide's mean among the places chosen for their attention (the suggested
    arm; NaN for the others): below `HIGH`, `bigslide suggest` warns that the model has not learnt where
    to look."""
    preds, _ = predict_slides(
        checkpoint, train, attention_samples=DROPOUT_SAMPLES if arm == "suggested" else 0
    )
    grids = [p.grids["attention"] for p in preds]
    tiles = {e.path: _centres(g) for e, g in zip(train.entries, grids, strict=True)}
    if arm == "suggested":
        slides = [
            SlideScores(e.path, p.grids["attention"], e.label, p.grids.get("attention_spread"))
            for p, e in zip(preds, train.entries, strict=True)
        ]
        normal = normal_class(train.classes)
        chosen = suggest(slides, wanted, normal=normal, area_tiles=AREA)
        peak = strongest_attention(chosen)
        return [(s.slide, s.polygon) for s in chosen], tiles, float("nan") if peak is None else peak
    candidates = []  # (order key, slide index, row, col)
    rng = np.random.default_rng(seed)
    for index, g in enumerate(grids):
        rows, cols = np.nonzero(np.isfinite(g.scores))
        values = g.scores[rows, cols].astype(np.float64)
        keys = rng.random(len(rows)) if arm == "random" else -values / values.mean()
        candidates += list(zip(keys, [index] * len(rows), rows, cols))
    candidates.sort(key=lambda c: c[0])
    taken: dict[int, list[tuple[int, int]]] = {}
    places = []
    for _key, index, r, c in candidates:
        if overlaps(taken.get(index, []), int(r), int(c), AREA):
            continue
        taken.setdefault(index, []).append((int(r), int(c)))
        places.append((train.entries[index].path, area_box(grids[index], int(r), int(c), AREA)))
    return places, tiles, float("nan")


def oracle(area: shapely.Polygon, lesions: list[shapely.Polygon], tiles: np.ndarray) -> str | None:
    """The answer from the lesion masks: "lesion" (≥ `LESION_ANSWER` of the area's tiles, by their
    centres, in a lesion), `NOT_LESION` (none), None (skip: mixed, or no tile)."""
    inside = tiles[shapely.contains_xy(area, tiles[:, 0], tiles[:, 1])]
    if not len(inside):
        return None
    if not lesions:
        return NOT_LESION
    share = float(np.mean(shapely.contains_xy(shapely.union_all(lesions), inside[:, 0], inside[:, 1])))
    return "lesion" if share >= LESION_ANSWER else NOT_LESION if share == 0 else None


def answered_table(
    csv_path: Path, out: Path, places: list[Place], k: int, tiles: dict[Path, np.ndarray]
) -> tuple[Path, dict[str, float]]:
    """A copy of the set's table whose training slides carry the first `k` answered places of `places`
    as annotations (in `out`); returns it and the answers' counts."""
    table = SlideTable.from_csv(csv_path)
    lesions = load_lesions(csv_path.parent / "lesions.json")
    positive = next(e.label for e in table.entries if lesions[e.path.name])
    drawn: dict[Path, list[Annotation]] = {}
    counts = {"answered_lesion": 0.0, "answered_not_lesion": 0.0, "skipped": 0.0}
    for slide, area in places:
        if counts["answered_lesion"] + counts["answered_not_lesion"] >= k:
            break
        answer = oracle(area, [shapely.Polygon(p) for p in lesions[slide.name]], tiles[slide])
        if answer is None:
            counts["skipped"] += 1
            continue
        counts["answered_lesion" if answer == "lesion" else "answered_not_lesion"] += 1
        drawn.setdefault(slide, []).append(Annotation(area, positive if answer == "lesion" else NOT_LESION))
    out.mkdir(parents=True, exist_ok=True)
    with (out / "slides.csv").open("w", newline="") as f:  # slide paths stay absolute: not copied
        writer = csv.writer(f)
        writer.writerow(["slide", "label", "split", "annotations"])
        for e in table.entries:
            saved = ""
            if e.path in drawn:
                saved = str(
                    write_annotations(
                        drawn[e.path], annotations_path(out / "slides.csv", e.path), table.classes
                    )
                )
            writer.writerow([e.path, e.label, e.split, saved])
    return out / "slides.csv", counts


def start_scores(args: argparse.Namespace, csv_path: Path, seed: int) -> dict[str, float]:
    """The starting checkpoint on the test slides."""
    return scored_on_test(
        start_run(args, csv_path, seed), csv_path, csv_path.parent / "lesions.json", "attention"
    )


def control_run(
    args: argparse.Namespace, csv_path: Path, outlines: Path, name: str, seed: int
) -> dict[str, float]:
    """*none*: the start trained on for the same epochs without annotations; *outlines*: with the
    annotations part's outlines."""
    start = start_run(args, csv_path, seed)
    if name == "none":
        return retrain(args, csv_path, csv_path, start, name, seed, 0.0)
    return retrain(args, csv_path, outlines, start, name, seed, 1.0)


def arm_run(args: argparse.Namespace, csv_path: Path, arm: str, k: int, seed: int) -> dict[str, float]:
    """The start retrained on the first `k` answered places of `arm`, with the counts of the answers."""
    start = start_run(args, csv_path, seed)
    assert start.checkpoint is not None
    table = SlideTable.from_csv(csv_path)
    train = table.like([e for e in table.entries if e.split == "train"])
    places, tiles, peak = arm_places(start.checkpoint, train, arm, seed, 4 * k)
    out = Path(args.out) / f"suggest-answers-seed{seed}" / f"{arm}-k{k}"
    answered, counts = answered_table(csv_path, out, places, k, tiles)
    # the table's path is the same whatever its answers: the run is named by its places too, so that a
    # rerun with other places trains afresh instead of taking the earlier run's checkpoint as its own
    asked = hashlib.sha256(repr([(str(p), a.bounds) for p, a in places]).encode()).hexdigest()[:8]
    scores = retrain(args, csv_path, answered, start, f"{arm}-k{k}-{asked}", seed, 1.0)
    return {**scores, **counts, **({} if np.isnan(peak) else {"peak_attention": peak})}


def _centres(g: ScoreGrid) -> np.ndarray:
    """(N, 2) level-0 centres of the scored cells (the model's tiles) of a map."""
    rows, cols = np.nonzero(np.isfinite(g.scores))
    cell, (x0, y0) = g.cell_size_level0, g.origin
    return np.stack([x0 + (cols + 0.5) * cell, y0 + (rows + 0.5) * cell], axis=1)
