"""Screenshots of the panels as a pathologist types and reads them, on a 1600 × 1000 virtual screen:

- typed_numbers.png: the learning rate typed as 1e-5 and kept; a bag size typed as -5 refused beside its
  field, and Start refused naming it;
- side_by_side_slides_first.png / side_by_side_panels_first.png: a slide that states no µm/px between two
  that do, opened before and after the panels, once its µm/px is typed;
- survival_table.png: the Slides panel holding a survival table (time and event columns);
- first_heatmap.png: the first heatmap of a session with its colour bar and the canvas legend.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python docs/make_panel_screenshots.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import napari
import numpy as np
from make_screenshots import dismiss_toasts, process, save, unstated_copy, wait_until
from qtpy.QtCore import Qt
from qtpy.QtTest import QTest


def viewer_with_panels() -> tuple[Any, Any]:
    viewer = napari.Viewer()
    viewer.canvas.overlays.scale_bar.visible = True
    viewer.window._qt_window.setGeometry(0, 0, 1600, 1000)
    _, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
    wait_until(lambda: panels.ready)
    return viewer, panels


def type_into(field: Any, text: str) -> None:
    """As a person types: select what is there, delete it, type, press Enter."""
    QTest.keyClick(field.edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    QTest.keyClick(field.edit, Qt.Key.Key_Backspace)
    QTest.keyClicks(field.edit, text)
    QTest.keyClick(field.edit, Qt.Key.Key_Return)


def window(viewer: Any, name: str) -> None:
    dismiss_toasts()
    process(300)
    save(viewer.screenshot(canvas_only=False, flash=False), name)


def typed_numbers(csv: Path, work: Path) -> None:
    viewer, panels = viewer_with_panels()
    panels.slides.load_csv(csv)
    train = panels.train
    train.out_dir.setText(str(work / "runs"))
    panels.tabs.setCurrentWidget(train)
    type_into(train.lr, "1e-5")
    assert train.lr.value() == 1e-5
    bag = train.data_form.widgets["bag_size"]
    type_into(bag, "-5")
    assert train.start() is None
    assert "tiles per slide (0 = all): must be at least 0 (typed '-5')" in train.status.text()
    window(viewer, "typed_numbers.png")
    viewer.close()


def side_by_side(slides: list[Path], panels_first: bool) -> None:
    viewer = napari.Viewer()
    viewer.window._qt_window.setGeometry(0, 0, 1600, 1000)
    panels = None
    if panels_first:
        _, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
        wait_until(lambda: panels.ready)
    for path in slides:
        viewer.open(path, plugin="bigslide")
        process(200)
    if panels is None:
        _, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
        wait_until(lambda: panels.ready)
    type_into(panels.slides.slide_mpp, "0.5")
    viewer.canvas.overlays.scale_bar.visible = True
    process(300)
    viewer.reset_view()
    name = "side_by_side_panels_first.png" if panels_first else "side_by_side_slides_first.png"
    window(viewer, name)
    viewer.close()


def survival_table(work: Path) -> None:
    from bigslide.synthetic.study import make_study_set

    csv = make_study_set(work / "survival", "survival", n=12, size=(512, 512), seed=2)
    viewer, panels = viewer_with_panels()
    panels.slides.load_csv(csv)
    panels.tabs.setCurrentWidget(panels.slides)
    window(viewer, "survival_table.png")
    panels.tabs.setCurrentWidget(panels.train)
    window(viewer, "survival_train_status.png")
    viewer.close()


def first_heatmap(csv: Path, work: Path) -> None:
    from bigslide.cli.demo import demo_config
    from bigslide.data.table import SlideTable
    from bigslide.engine import run_to_end, train

    result = run_to_end(train(demo_config(work / "demo-run", "abmil_acc", epochs=4)))
    table = SlideTable.from_csv(csv)
    held = next(e.path for e in table.entries if e.split == "test" and e.label == "tumor")
    viewer, panels = viewer_with_panels()
    [slide] = viewer.open(held, plugin="bigslide")
    results = panels.results
    panels.tabs.setCurrentWidget(results)
    results.slide_box.setCurrentText(slide.name)
    results.checkpoint.setText(str(result.checkpoint))
    results.device.setCurrentText("cpu")
    results.run()
    wait_until(lambda: results.worker is None and not results.pending_grids)
    assert len(results.colour_bar.colours) == 32
    window(viewer, "first_heatmap.png")
    viewer.close()


def main() -> None:
    from bigslide.data.sources import demo_dir
    from bigslide.synthetic.slide_set import make_slide_set

    work = Path(tempfile.mkdtemp())
    csv = make_slide_set(demo_dir())
    typed_numbers(csv, work)
    demo_slides = sorted(csv.parent.glob("*.svs"))
    unstated = unstated_copy(demo_slides[0], work / "no-mpp.tif")
    for panels_first in (False, True):
        side_by_side([demo_slides[1], unstated, demo_slides[2]], panels_first)
    survival_table(work)
    first_heatmap(csv, work)
    np.seterr(all="ignore")


if __name__ == "__main__":
    main()
