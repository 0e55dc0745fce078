"""Screenshots of a survival study in the plugin, on a 1600 × 1000 virtual screen.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python docs/make_study_screenshots.py

A synthetic survival study (`bigslide.synthetic.study`, hazard from the tumour burden) is loaded in the
Slides panel; the Train panel shows the columns it read and the task they imply, and trains ABMIL-ACC
(sigmoid attention) on it; the Results panel then shows the run's Kaplan-Meier plot of its test split
and overlays the risk contribution of each tile on a held-out slide with lesions.
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

from make_screenshots import process, save, wait_until

EPOCHS = 12


def main() -> None:
    import napari

    from bigslide.synthetic.study import make_study_set

    work = Path(tempfile.mkdtemp(prefix="bigslide-study-shots-"))
    table = make_study_set(work / "survival", "survival", n=32, seed=5)
    with table.open() as f:
        rows = list(csv.DictReader(f))
    shown = max((r for r in rows if r["split"] == "test"), key=lambda r: float(r["oracle"]))

    viewer = napari.Viewer()
    viewer.window._qt_window.setGeometry(0, 0, 1600, 1000)
    _, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
    slides, train, results = panels.slides, panels.train, panels.results
    slides.load_csv(table)
    slides.target_mpp.setValue(1.0)
    slides.tile_size.setValue(32)
    train.set_method("abmil_acc", attention="sigmoid")
    train.backbone.setCurrentText("test_resnet")
    train.epochs.setValue(EPOCHS)
    train.lr.setValue(0.002)
    train.data_form.set_values({"bag_size": 64})
    train.device.setCurrentText("cpu")
    train.out_dir.setText(str(work / "runs"))
    panels.tabs.setCurrentWidget(train)
    process(300)
    assert train.start() is not None
    wait_until(lambda: train.progress.value() >= 2)
    process(300)
    save(train.grab(), "study_train_panel.png")
    wait_until(lambda: train.worker is None)
    print(train.status.text())

    [layer] = viewer.open(table.parent / shown["slide"], plugin="bigslide")
    panels.tabs.setCurrentWidget(results)
    results.slide_box.setCurrentText(layer.name)
    results.device.setCurrentText("cpu")
    results.run()
    wait_until(lambda: results.worker is None and not results.pending_grids)
    risk = next(h for h in viewer.layers if "risk" in h.name)
    results.heatmap_box.setCurrentText(risk.name)
    results.colormap.setCurrentText("inferno")
    viewer.reset_view()
    process(800)
    print(results.result.text())
    save(viewer.screenshot(canvas_only=False), "study_window.png")
    save(results.grab(), "study_results_panel.png")
    viewer.close()


if __name__ == "__main__":
    main()
