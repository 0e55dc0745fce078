"""The learning bench's annotations part: does teaching by annotation help where slide labels alone are
slow, on the subtle-lesion slides?

Annotations are drawn from the lesion masks, as a pathologist would draw them: a quarter of the training
lesions (their outlines, classed as the positive class) and lesion-free squares of normal tissue on half of
the training slides ("Not lesion"), the same for every seed, written as QuPath GeoJSON beside a copy of the
slide table with an annotations column. ABMIL-ACC then trains on that table without the annotations
(data.instance_weight 0), with them teaching the attention, and with them teaching a tile classifier;
the test slides carry no annotations.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import shapely

from bigslide.bench.learning.runs import scored_on_test, slide_config, train_run
from bigslide.data.bags import BagDataset
from bigslide.data.table import SlideTable
from bigslide.synthetic.slide_set import load_lesions
from bigslide.tiling.annotations import NOT_LESION, Annotation, annotations_path, write_annotations

ARMS = {"none": 0.0, "attention": 1.0, "tiles": 1.0}
"""data.instance_weight of each run; the name says what the annotations teach."""
LESION_SHARE = 0.25  # of the training lesions, annotated
NORMAL_SIDE = 3  # tiles per side of a "Not lesion" square
AUC_GOAL = 0.9


def annotated_set(csv_path: Path, tile_size: int, target_mpp: float) -> Path:
    """A copy of the set's slide table with an annotations column (in `<set>/annotated/`), and the
    training slides' annotations drawn from the lesion masks; returns the new table."""
    out = csv_path.parent / "annotated" / "slides.csv"
    table = SlideTable.from_csv(csv_path)
    lesions = load_lesions(csv_path.parent / "lesions.json")
    train = [e for e in table.entries if e.split == "train"]
    rng = np.random.default_rng(2024)
    every = [(e.path.name, k) for e in train for k in range(len(lesions[e.path.name]))]
    chosen = {every[i] for i in rng.choice(len(every), round(LESION_SHARE * len(every)), replace=False)}
    grids = BagDataset(table.like(train), tile_size=tile_size, target_mpp=target_mpp, bag_size=0).grids
    positive = next(e.label for e in train if lesions[e.path.name])
    for index, (entry, grid) in enumerate(zip(train, grids)):
        polygons = [shapely.Polygon(p) for p in lesions[entry.path.name]]
        drawn = [Annotation(polygons[k], positive) for name, k in sorted(chosen) if name == entry.path.name]
        if index % 2 == 0:
            square = _normal_square(grid.coords, grid.tile_size_level0, polygons, rng)
            drawn += [Annotation(square, NOT_LESION)] if square is not None else []
        if drawn:
            entry.annotations = write_annotations(drawn, annotations_path(out, entry.path), table.classes)
    with out.open("w", newline="") as f:  # slide paths stay absolute: the slides are not copied
        writer = csv.writer(f)
        writer.writerow(["slide", "label", "split", "annotations"])
        for e in table.entries:
            writer.writerow([e.path, e.label, e.split, e.annotations or ""])
    return out


def _normal_square(
    coords: np.ndarray, tile: int, lesions: list[shapely.Polygon], rng: np.random.Generator
) -> shapely.Polygon | None:
    """A square of `NORMAL_SIDE` tiles' side around a random tissue tile, at least a tile clear of every
    lesion (None when the slide has no such place)."""
    side = NORMAL_SIDE * tile
    clear = shapely.union_all(lesions).buffer(tile) if lesions else shapely.Polygon()
    for i in rng.permutation(len(coords)):
        x, y = coords[i] - (NORMAL_SIDE // 2) * tile
        square = shapely.box(x, y, x + side, y + side)
        if not square.intersects(clear):
            return square
    return None


def annotation_run(args: argparse.Namespace, csv_path: Path, arm: str, seed: int) -> dict[str, float]:
    """ABMIL-ACC on the annotated subtle set, `arm` saying what the annotations teach ("none": they are
    ignored): test slide AUC and balanced accuracy (at the threshold chosen on validation, as every part
    scores), attention cell AUC on the test lesions, and the
    epochs to `AUC_GOAL` on the validation slides (`goal_epochs`)."""
    config = slide_config(args, csv_path, "subtle", "abmil_acc", seed, f"annotations-{arm}")
    config.optim.epochs = args.annotated_epochs
    config.data.instance_weight = ARMS[arm]
    if arm != "none":
        config.data.instance_loss = arm  # type: ignore[assignment]
    result = train_run(config)
    metrics = scored_on_test(result, csv_path, csv_path.parent.parent / "lesions.json", "attention")
    metrics.update(goal_epochs([float(r["val"]["auc"]) for r in result.history if "val" in r]))
    return metrics


def goal_epochs(val_auc: list[float]) -> dict[str, float]:
    """From the validation AUC of each epoch: the first epoch (1-based) that reaches `AUC_GOAL`, the first
    from which every later epoch stays at it (NaN when none does), and the last epoch's AUC."""
    reached = [epoch for epoch, auc in enumerate(val_auc, start=1) if auc >= AUC_GOAL]
    below = [epoch for epoch, auc in enumerate(val_auc, start=1) if auc < AUC_GOAL]
    stays = (below[-1] + 1 if below else 1) if val_auc and val_auc[-1] >= AUC_GOAL else float("nan")
    return {
        "epochs_to_goal": float(reached[0]) if reached else float("nan"),
        "epochs_to_stay": float(stays),
        "final_val_auc": val_auc[-1] if val_auc else float("nan"),
    }
