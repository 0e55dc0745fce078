"""Write inference results: a predictions CSV and, per slide, heatmaps as npz + PNG overlay + GeoJSON."""

from __future__ import annotations

import csv
from pathlib import Path

from bigslide.engine.inference import SlidePrediction
from bigslide.explain.export import grid_geojson, overlay_png
from bigslide.slide import open_slide


def write_heatmaps(pred: SlidePrediction, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stem = pred.slide.name.split(".")[0]
    paths: list[Path] = []
    with open_slide(pred.slide) as slide:
        for name, grid in pred.grids.items():
            paths.append(grid.save_npz(out / f"{stem}.{name}.npz"))
            paths.append(overlay_png(grid, slide, out / f"{stem}.{name}.png"))
            paths.append(grid_geojson(grid, out / f"{stem}.{name}.geojson"))
    return paths


def write_predictions(preds: list[SlidePrediction], out: Path, *, heatmaps: bool = True) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "predictions.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        classes = preds[0].classes if preds else []
        writer.writerow(["slide", "predicted", *[f"p_{c}" for c in classes]])
        for p in preds:
            writer.writerow([str(p.slide), p.label, *[f"{v:.6f}" for v in p.probs]])
            if heatmaps:
                write_heatmaps(p, out / "heatmaps")
    return path
