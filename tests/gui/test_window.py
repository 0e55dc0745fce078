"""The whole window on a 1600 × 1000 screen: the tabbed panels fit, Start/Stop and progress stay in view
while training, and the Results panel follows a run epoch by epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qtpy.QtCore import QPoint, QRect
from qtpy.QtWidgets import QScrollArea

from tests.gui.test_train import train_panel

SCREEN = QRect(0, 0, 1600, 1000)


def on_screen(widget: Any) -> bool:
    """The widget is shown, not scrolled away or clipped, and lies on the 1600 × 1000 screen."""
    if not widget.isVisible() or widget.visibleRegion().isEmpty():
        return False
    top_left = widget.mapToGlobal(QPoint(0, 0))
    return SCREEN.contains(QRect(top_left, widget.size()))


def tabbed_panels_on_screen(viewer: Any, qtbot: Any) -> tuple[Any, Any]:
    """(napari's window, the tabbed panels) with the window shown on the 1600 × 1000 screen."""
    window = viewer.window._qt_window
    _, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
    qtbot.waitUntil(lambda: panels.ready, timeout=120_000)
    window.setGeometry(SCREEN)
    window.show()
    qtbot.waitExposed(window)
    return window, panels


def test_the_tabbed_panels_fit_the_screen_while_training(
    viewer: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    window, panels = tabbed_panels_on_screen(viewer, qtbot)
    assert window.minimumSizeHint().height() <= SCREEN.height()
    assert window.frameGeometry().height() <= SCREEN.height()
    for tab in range(panels.tabs.count()):  # every panel fits the dock's width: nothing scrolls sideways
        panels.tabs.setCurrentIndex(tab)
        qtbot.wait(50)
        for area in panels.tabs.currentWidget().findChildren(QScrollArea):
            assert not area.horizontalScrollBar().isVisible(), panels.tabs.tabText(tab)

    train = panels.train
    train.max_steps.setValue(6)
    panels.tabs.setCurrentWidget(train)
    panels.slides.load_csv(tiny_set)
    panels.slides.tile_size.setValue(32)
    train.set_method("abmil_acc", hidden=32, attention_dim=16, chunk_size=4)
    train.data_form.set_values({"bag_size": 8, "augment": False})
    train.device.setCurrentText("cpu")
    train.out_dir.setText(str(tmp_path / "runs"))
    qtbot.wait(50)
    for widget in (train.start_button, train.stop_button, train.progress, train.status, train.loss_plot):
        assert on_screen(widget), widget
    assert train.start() is not None
    qtbot.waitUntil(lambda: train.progress.value() >= 1, timeout=60_000)
    assert window.frameGeometry().height() <= SCREEN.height()
    for widget in (train.stop_button, train.progress, train.status, train.loss_plot, train.metric_plot):
        assert on_screen(widget), widget
    assert train.stop_button.isEnabled()
    # while it runs, an empty plot says what it waits for, not to press Start
    assert "Start" not in train.metric_plot.placeholder
    qtbot.waitUntil(lambda: train.worker is None, timeout=120_000)
    assert train.status.text().startswith("Finished.")


def test_results_follow_a_run_epoch_by_epoch(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    train = train_panel(dock, tiny_set, tmp_path / "runs", "abmil_acc")
    train.max_steps.setValue(0)
    train.epochs.setValue(3)
    [slide] = viewer.open(tiny_set.parent / "slide_001.svs", plugin="bigslide")
    results = dock("Results")
    results.slide_box.setCurrentText(slide.name)
    results.device.setCurrentText("cpu")
    results.follow.setChecked(True)
    shown: list[int] = []
    draw = results.show_prediction
    results.show_prediction = lambda prediction, layer: (
        shown.append(prediction.epochs),
        draw(prediction, layer),
    )
    assert train.start() is not None
    qtbot.waitUntil(lambda: train.worker is None, timeout=180_000)
    qtbot.waitUntil(lambda: results.worker is None and results.run_button.isEnabled(), timeout=60_000)
    # every epoch's weights were drawn, or skipped only for a newer one, and the last is the final model
    assert shown == sorted(shown)
    assert shown[-1] == 3
    assert len(shown) >= 2
    heatmaps = [layer for layer in viewer.layers if layer.metadata.get("bigslide_role") == "heatmap"]
    assert len(heatmaps) == 1  # redrawn in place, not one layer per epoch
    assert "after 3 epochs" in results.result.text()


def test_slide_names_stay_readable_beside_long_labels_and_cases(
    viewer: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    import csv

    _, panels = tabbed_panels_on_screen(viewer, qtbot)
    panels.tabs.setCurrentWidget(panels.slides)
    with tiny_set.open() as f:
        rows = list(csv.DictReader(f))
    # labels and cases from short to long: at some length the other columns leave the slide's name
    # a sliver, if its column only takes what they leave
    for extra in range(0, 48, 4):
        table = tmp_path / f"long{extra}.csv"
        with table.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["slide", "label", "case"])
            for i, r in enumerate(rows):
                label = f"{r['label']} {'x' * extra}"
                writer.writerow([str(tiny_set.parent / r["slide"]), label, f"patient {i:04d} {'y' * extra}"])
        panels.slides.load_csv(table)
        qtbot.wait(20)
        grid = panels.slides.table
        name = grid.item(0, 0)
        shown = grid.fontMetrics().horizontalAdvance(name.text())
        assert grid.visualItemRect(name).width() >= shown, extra  # "slide_000.svs" whole
        case = grid.item(0, panels.slides.column("Case"))
        assert grid.visualItemRect(case).width() >= grid.fontMetrics().horizontalAdvance(case.text()), extra


def test_panels_opened_one_by_one_are_tabs_of_one_dock_each_with_its_whole_height(
    viewer: Any, qtbot: Any
) -> None:
    """Opened from the Plugins menu one after the other, the panels stacked in one column left the last
    two rows high; as tabs of one dock, the one just opened shows, with the dock's height, its content
    from the top."""
    from qtpy.QtWidgets import QDockWidget

    window = viewer.window._qt_window
    window.setGeometry(SCREEN)
    window.show()
    qtbot.waitExposed(window)
    panels = {}
    for name in ("Slides", "Train", "Results"):
        _, panels[name] = viewer.window.add_plugin_dock_widget("bigslide", name)
        qtbot.waitUntil(lambda p=panels[name]: p.ready, timeout=120_000)
        qtbot.waitUntil(lambda p=panels[name]: on_screen(p), timeout=5_000)  # the one just opened shows
    docks = {name: panel.parent() for name, panel in panels.items()}
    assert all(isinstance(d, QDockWidget) for d in docks.values())
    assert set(window.tabifiedDockWidgets(docks["Results"])) == {docks["Slides"], docks["Train"]}
    assert panels["Results"].height() > 0.6 * SCREEN.height()
    assert not on_screen(panels["Slides"])  # behind its tab
    docks["Slides"].raise_()
    qtbot.waitUntil(lambda: on_screen(panels["Slides"]), timeout=5_000)
    table = panels["Slides"].table
    assert table.mapTo(panels["Slides"], QPoint(0, 0)).y() < 40  # at the top, not below an empty half
    assert window.frameGeometry().height() <= SCREEN.height()
