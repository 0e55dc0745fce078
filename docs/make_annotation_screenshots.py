"""Screenshots of teaching by annotation, on a 1600 × 1000 virtual screen, from a checkpoint trained on the
subtle-lesion slides without annotations (e.g. the learning bench's `annotations-none-seed0` run):

- annotate_wrong_hotspot.png: the checkpoint's attention map of the training slide whose hottest tile
  lies farthest from its lesions (the lesions' true outlines in white);
- annotate_correction.png: the correction drawn in the Results panel: 'Not lesion' over the hot spot,
  the lesion the map leaves darkest outlined as 'tumor', saved as QuPath GeoJSON;
- annotate_after_retraining.png: after "Retrain with annotations", the retrained model's map on the slide
  and the checkpoint's map beside it.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python docs/make_annotation_screenshots.py \\
        --checkpoint runs/bench-learning/annotations-none-seed0/checkpoints/last.pt \\
        --table ~/.cache/bigslide/learning-subtle-48/slides.csv --epochs 10
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import napari
import numpy as np
import shapely
from make_screenshots import IMAGES, dismiss_toasts, process, wait_until
from PIL import Image

from bigslide.data.table import SlideTable
from bigslide.engine import predict_slides
from bigslide.explain.localisation import cell_lesion_fraction, lesion_cell_auc
from bigslide.napari._layers import polygons_to_shapes, regions_layer_kwargs
from bigslide.synthetic.slide_set import load_lesions
from bigslide.tiling.annotations import NOT_LESION
from bigslide.tiling.regions import load_regions

MAX_BYTES = 900_000


def save(viewer: Any, name: str) -> None:
    """The whole window at its size; a palette of 256 colours when the full colours weigh too much."""
    dismiss_toasts()
    process(400)
    path = IMAGES / name
    picture = Image.fromarray(viewer.screenshot(canvas_only=False, flash=False)[..., :3])
    picture.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        picture.quantize(256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"{path} {picture.width}x{picture.height} {path.stat().st_size // 1000} kB")


def wrong_spot(checkpoint: Path, table: Path) -> tuple[Path, tuple[int, int], list[int]]:
    """The training slide with a lesion whose hottest lesion-free cell outranks its lesions the most: its
    path, that cell (row, col) and its lesions from the least attended."""
    entries = [e for e in SlideTable.from_csv(table).subset("train").entries if e.label == "tumor"]
    lesions = load_lesions(table.parent / "lesions.json")
    preds, _ = predict_slides(checkpoint, SlideTable.from_csv(table).like(entries), repeats=0)
    best: tuple[float, Path, tuple[int, int], list[int]] | None = None
    for entry, pred in zip(entries, preds):
        grid = pred.grids["attention"]
        polygons = lesions[entry.path.name]
        share = cell_lesion_fraction(grid, polygons)
        scores = np.where(np.isfinite(grid.scores), grid.scores, -np.inf)
        outside = np.where(share == 0, scores, -np.inf)
        hot = np.unravel_index(int(np.argmax(outside)), scores.shape)
        inside = [float(np.nanmax(np.where(_cells_in(grid, p), scores, -np.inf))) for p in polygons]
        margin = float(outside[hot]) - max(inside)
        if best is None or margin > best[0]:
            best = (margin, entry.path, (int(hot[0]), int(hot[1])), list(np.argsort(inside)))
    assert best is not None
    return best[1], best[2], best[3]


def _cells_in(grid: Any, polygon: np.ndarray) -> np.ndarray:
    return cell_lesion_fraction(grid, [polygon]) > 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--table", type=Path, required=True, help="the subtle set's slides.csv")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--weight", default="1")
    args = parser.parse_args()
    slide_path, hot, order = wrong_spot(args.checkpoint, args.table)
    print(f"{slide_path.name}: hottest lesion-free cell {hot}")
    work = Path(tempfile.mkdtemp(prefix="bigslide-annotate-"))
    table = work / "slides.csv"  # a copy beside which the annotations are saved
    SlideTable.from_csv(args.table).to_csv(table)
    checkpoint = work / "runs" / args.checkpoint.parent.parent.name / "checkpoints" / "last.pt"
    checkpoint.parent.mkdir(parents=True)
    shutil.copyfile(args.checkpoint, checkpoint)  # the retrained run goes beside this copy, in `work`

    viewer = napari.Viewer()
    viewer.window._qt_window.setGeometry(0, 0, 1600, 1000)
    viewer.canvas.overlays.scale_bar.visible = True
    _, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
    wait_until(lambda: panels.ready)
    panels.slides.load_csv(table)
    [slide] = viewer.open(slide_path, plugin="bigslide")
    truth = [
        r.geometry
        for r in load_regions(slide_path.parent / f"{slide_path.name.split('.')[0]}.lesions.geojson")
    ]
    outline = regions_layer_kwargs(slide, f"{slide.name} lesions (truth)", role="lesions")
    viewer.add_shapes(polygons_to_shapes(truth), shape_type="polygon", **{**outline, "edge_color": "white"})

    results = panels.results
    panels.tabs.setCurrentWidget(results)
    results.slide_box.setCurrentText(slide.name)
    results.checkpoint.setText(str(checkpoint))
    results.device.setCurrentText("cpu")
    results.run()
    wait_until(lambda: results.run_button.isEnabled() and results.heatmap_layer() is not None)
    viewer.layers.selection.active = slide
    viewer.reset_view()
    save(viewer, "annotate_wrong_hotspot.png")

    grid = results.prediction.grids["attention"]
    p = grid.cell_size_level0
    x0, y0 = grid.origin[0] + (hot[1] - 1) * p, grid.origin[1] + (hot[0] - 1) * p
    box = results.annotate
    box.class_box.setCurrentText(NOT_LESION)
    layer = box.draw()
    layer.add_polygons(polygons_to_shapes([shapely.box(x0, y0, x0 + 3 * p, y0 + 3 * p)]))
    box.class_box.setCurrentText("tumor")
    box.draw()
    layer.add_polygons(polygons_to_shapes([truth[i] for i in order[:2]]))  # the two least attended
    layer.mode = "pan_zoom"
    box.save()
    wait_until(lambda: "tiles lie in its annotations" in box.status.text())
    _scroll_to(results, box)
    save(viewer, "annotate_correction.png")

    retrain = results.retrain
    _type(retrain.epochs, str(args.epochs))
    _type(retrain.weight, args.weight)
    _scroll_to(results, retrain)
    retrain.button.click()
    wait_until(lambda: retrain.worker is None, timeout=3600)
    print(retrain.status.text())
    final = Path(retrain.run_dir or ".") / "checkpoints" / "last.pt"
    wait_until(
        lambda: results.run_button.isEnabled() and results.checkpoint.text() == str(final), timeout=600
    )
    process(1000)
    viewer.layers.selection.active = slide
    viewer.reset_view()
    _scroll_to(results, retrain)
    save(viewer, "annotate_after_retraining.png")
    before = next(layer for layer in viewer.layers if layer.name.endswith("attention — before retraining"))
    lesions = load_lesions(args.table.parent / "lesions.json")[slide_path.name]
    for when, grid in (("before", before.metadata["grid"]), ("after", results.prediction.grids["attention"])):
        ranks = grid.normalized("rank")
        print(
            f"{when}: hot spot rank {ranks[hot]:.2f}, lesion cell AUC {lesion_cell_auc(grid, lesions):.3f}, "
            f"mean rank of the two outlined lesions' cells "
            f"{np.nanmean(np.concatenate([ranks[_cells_in(grid, lesions[i])] for i in order[:2]])):.2f}"
        )
    print(f"annotations: {box.session.row(slide_path).annotations}; run: {retrain.run_dir}")
    viewer.close()


def _scroll_to(panel: Any, widget: Any) -> None:
    from qtpy.QtWidgets import QScrollArea

    area = panel.findChild(QScrollArea)
    if area is not None:
        area.ensureWidgetVisible(widget)
    process(200)


def _type(field: Any, text: str) -> None:
    from qtpy.QtCore import Qt
    from qtpy.QtTest import QTest

    QTest.keyClick(field.edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    QTest.keyClick(field.edit, Qt.Key.Key_Backspace)
    QTest.keyClicks(field.edit, text)
    QTest.keyClick(field.edit, Qt.Key.Key_Return)


if __name__ == "__main__":
    main()
