"""Teach by annotation in the Results panel: polygons drawn over a slide are saved as QuPath GeoJSON next to
the slide table in level-0 pixels, read back from QuPath, counted in the Slides table, and "Retrain with
annotations" fine-tunes the chosen checkpoint in a replayable run folder, its map shown before and after."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shapely
import yaml
from qtpy.QtCore import QPoint, Qt

from bigslide.data.table import SlideTable
from bigslide.engine.config import TrainConfig
from bigslide.tiling.annotations import (
    NOT_LESION,
    annotated_count,
    annotations_path,
    class_colour,
    read_annotations,
)
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide
from tests.gui.paint_order import PaintOrder
from tests.gui.test_results import tiny_checkpoint
from tests.gui.test_typed_numbers import type_into

LESION_BOX = [[64.0, 96.0], [64.0, 224.0], [192.0, 224.0], [192.0, 96.0]]  # napari (row, col), level 0
NORMAL_BOX = [[320.0, 320.0], [320.0, 448.0], [448.0, 448.0], [448.0, 320.0]]


def annotated_panel(viewer: Any, dock: Any, tiny_set: Path) -> tuple[Any, Any, Any]:
    """The tiny set's table loaded, its first slide open and chosen in the Results panel, two polygons
    drawn on it: a 'tumor' area and a 'Not lesion' one, as a pathologist does (choose, Draw, outline)."""
    slides = dock("Slides")
    slides.load_csv(tiny_set)
    [slide] = viewer.open(tiny_set.parent / "slide_000.svs", plugin="bigslide")
    panel = dock("Results")
    panel.slide_box.setCurrentText(slide.name)
    box = panel.annotate
    assert [box.class_box.itemText(i) for i in range(box.class_box.count())] == [
        NOT_LESION,
        "normal",
        "tumor",
    ]
    for name, polygon in (("tumor", LESION_BOX), (NOT_LESION, NORMAL_BOX)):
        box.class_box.setCurrentText(name)
        box.draw_button.click()
        layer = box.layer()
        assert layer.mode == "add_polygon"
        layer.add_polygons([np.array(polygon)])  # what a double-click closing the outline adds
    return slides, panel, layer


def test_drawn_annotations_are_saved_as_qupath_geojson_beside_the_table_and_counted(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path
) -> None:
    slides, panel, layer = annotated_panel(viewer, dock, tiny_set)
    assert list(layer.features["class"]) == [
        "tumor",
        NOT_LESION,
    ]  # each shape keeps the class it was drawn as
    np.testing.assert_allclose(layer.scale, slides.viewer.layers["slide_000"].scale)  # on the slide, in µm
    panel.annotate.save_button.click()
    slide_path = (tiny_set.parent / "slide_000.svs").resolve()
    saved = annotations_path(tiny_set, slide_path)
    assert saved.is_file()
    feature = json.loads(saved.read_text())["features"][0]
    assert feature["properties"]["classification"] == {
        "name": "tumor",
        "color": list(class_colour("tumor", ["normal", "tumor"])),
    }
    annotations = read_annotations(saved)
    assert [a.name for a in annotations] == ["tumor", NOT_LESION]
    # level-0 pixels, x right and y down: the (row, col) vertices swapped
    assert annotations[0].geometry.equals(shapely.box(96, 64, 224, 192))
    assert annotations[1].geometry.equals(shapely.box(320, 320, 448, 448))

    row = panel.session.row(slide_path)
    assert row is not None
    assert row.annotations == saved
    column = slides.column("Annotated")
    assert column >= 0
    index = panel.session.rows.index(row)
    qtbot.waitUntil(lambda: slides.table.item(index, column).text() != "", timeout=60_000)
    counted = int(slides.table.item(index, column).text())
    session = panel.session  # the tiles a run would make of the slide, at the panel's tiling
    with open_slide(slide_path) as opened:
        grid = TileGrid.from_slide(
            opened, session.tile_size, target_mpp=session.target_mpp, min_tissue=session.min_tissue
        )
    assert counted == annotated_count(annotations, grid.coords, grid.tile_size_level0) > 0
    assert "Annotated" in slides.columns
    assert panel.session.table().annotated()


def test_save_with_the_outlines_slide_closed_says_where_they_are_and_saves_once_it_is_open_again(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path
) -> None:
    _slides, panel, layer = annotated_panel(viewer, dock, tiny_set)
    [slide] = [found for found in viewer.layers if found.metadata.get("bigslide_role") == "slide"]
    viewer.layers.remove(slide)  # closed before Save: its outlines stay in their layer
    assert panel.annotate.save() is None
    status = panel.annotate.status.text()
    assert status.startswith(f"Nothing saved: the outlines in '{layer.name}' belong to slide_000.svs"), status
    assert "Open it again" in status
    [again] = viewer.open(tiny_set.parent / "slide_000.svs", plugin="bigslide")
    panel.slide_box.setCurrentText(again.name)
    saved = panel.annotate.save()
    assert saved is not None
    assert len(read_annotations(saved)) == 2


def test_a_qupath_export_is_drawn_on_the_slide_in_its_classes_colours(
    viewer: Any, dock: Any, tiny_set: Path, tmp_path: Path
) -> None:
    [slide] = viewer.open(tiny_set.parent / "slide_001.svs", plugin="bigslide")
    dock("Slides").load_csv(tiny_set)
    panel = dock("Results")
    panel.slide_box.setCurrentText(slide.name)
    export = tmp_path / "qupath.geojson"
    export.write_text(
        json.dumps(
            {
                "type": "FeatureCollection",
                "features": [
                    {
                        "type": "Feature",
                        "geometry": {
                            "type": "Polygon",
                            "coordinates": [[[10, 20], [200, 20], [200, 90], [10, 20]]],
                        },
                        "properties": {
                            "objectType": "annotation",
                            "classification": {"name": "tumor", "color": [200, 0, 0]},
                        },
                    }
                ],
            }
        )
    )
    layer = panel.annotate.load(export)
    assert list(layer.features["class"]) == ["tumor"]
    np.testing.assert_allclose(
        layer.data[0][:, ::-1], [[10, 20], [200, 20], [200, 90]]
    )  # (x, y) as in the file
    np.testing.assert_allclose(
        layer.edge_color[0][:3], np.array(class_colour("tumor", ["normal", "tumor"])) / 255
    )
    assert panel.annotate.status.text().startswith("Read 1 annotation (tumor) from qupath.geojson;")

    # another slide's export: it lies off this one, so it is refused and names where it lies
    off = {"type": "Polygon", "coordinates": [[[9000, 9000], [9500, 9000], [9500, 9400], [9000, 9000]]]}
    features = json.loads(export.read_text())["features"]
    far = tmp_path / "another-slide.geojson"
    far.write_text(json.dumps({"type": "FeatureCollection", "features": [{**features[0], "geometry": off}]}))
    assert panel.annotate.load(far) is None
    status = panel.annotate.status.text()
    assert status.startswith(f"another-slide.geojson: none of its 1 outline lies on {slide.name} ("), status
    assert "x 9000..9500, y 9000..9400" in status
    assert list(panel.annotate.layer().features["class"]) == ["tumor"]  # what was read before stays
    # some on the slide, some off: those off are left out, and counted
    both = tmp_path / "both.geojson"
    both.write_text(
        json.dumps({"type": "FeatureCollection", "features": [*features, {**features[0], "geometry": off}]})
    )
    assert len(panel.annotate.load(both).data) == 2  # the outline read before stays: nothing is lost
    status = panel.annotate.status.text()
    assert "1 outline outside" in status
    assert "beside the 1 outline already there" in status


def retrain_ready(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> tuple[Any, Any, Path]:
    """(Slides panel, Results panel, checkpoint): a first run's checkpoint chosen, a slide's outlines saved
    and counted."""
    checkpoint = tiny_checkpoint(
        tiny_set, tmp_path / "runs" / "first", "abmil_acc", {"hidden": 32, "attention_dim": 16}
    )
    slides, panel, _layer = annotated_panel(viewer, dock, tiny_set)
    panel.annotate.save_button.click()
    row = panel.session.row(tiny_set.parent / "slide_000.svs")
    qtbot.waitUntil(lambda: row is not None and row.annotated is not None, timeout=60_000)  # counted
    panel.checkpoint.setText(str(checkpoint))
    return slides, panel, checkpoint


def test_retrain_anew_trains_from_the_models_starting_weights_for_the_first_runs_epochs(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    _slides, panel, _checkpoint = retrain_ready(viewer, dock, qtbot, tiny_set, tmp_path)
    retrain = panel.retrain
    assert retrain.epochs.value() == 5  # a fine-tune's few epochs ...
    box = retrain.anew  # clicked on its box, as a person does (its label is shorter than the panel)
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))
    assert retrain.anew.isChecked()
    assert retrain.epochs.value() == 1  # ... anew, as many as the first run's
    config = retrain.write_folder()
    assert retrain.run_dir is not None
    saved = yaml.safe_load((retrain.run_dir / "config.yaml").read_text())
    for model, epochs in (
        (config.model.init_from, config.optim.epochs),
        (saved["model"]["init_from"], saved["optim"]["epochs"]),
    ):
        assert model is None  # not the checkpoint's weights
        assert epochs == 1
    assert saved["data"]["instance_weight"] == 1.0


def test_a_stopped_retrain_says_what_it_left_and_leaves_no_empty_map(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    from bigslide.napari._layers import is_empty_heatmap

    _slides, panel, _checkpoint = retrain_ready(viewer, dock, qtbot, tiny_set, tmp_path)
    panel.device.setCurrentText("cpu")
    retrain = panel.retrain
    type_into(qtbot, retrain.epochs, "50")
    qtbot.mouseClick(retrain.button, Qt.MouseButton.LeftButton)
    assert retrain.worker is not None, retrain.status.text()
    qtbot.waitUntil(lambda: any(is_empty_heatmap(layer) for layer in viewer.layers), timeout=120_000)
    qtbot.mouseClick(retrain.button, Qt.MouseButton.LeftButton)  # "Stop retraining"
    assert retrain.status.text().startswith("Stopping")
    qtbot.waitUntil(lambda: retrain.worker is None, timeout=120_000)
    status = retrain.status.text()
    left = retrain.run_dir / "checkpoints" / "last.pt"
    if left.is_file():
        assert status == f"Stopped. Checkpoint: {left}"
    else:
        assert status == "Stopped before the first step: no checkpoint was written."
    assert retrain.button.text() == "Retrain with annotations"
    assert not any(is_empty_heatmap(layer) for layer in viewer.layers)


def test_retrain_with_annotations_fine_tunes_the_checkpoint_in_a_replayable_run_and_shows_both_maps(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bigslide.napari import _retrain as retrain_module
    from bigslide.napari._compare import in_turns

    slides, panel, checkpoint = retrain_ready(viewer, dock, qtbot, tiny_set, tmp_path)
    panel.device.setCurrentText("cpu")
    retrain = panel.retrain
    type_into(qtbot, retrain.epochs, "1")
    type_into(qtbot, retrain.weight, "2.5")
    seen: list[Path] = []
    panel.session.checkpoint_saved.connect(seen.append)
    held: list[Any] = []
    monkeypatch.setattr(retrain_module, "in_turns", held.append)
    qtbot.mouseClick(retrain.button, Qt.MouseButton.LeftButton)
    assert retrain.worker is not None, retrain.status.text()
    assert retrain.button.text() == "Stop retraining"
    qtbot.waitUntil(lambda: bool(held), timeout=120_000)
    # the fine-tune waits for the viewer to draw the map before retraining: held back here, nothing trains
    steps: list[str] = []
    retrain.worker.yielded.connect(lambda event: steps.append(type(event).__name__))
    qtbot.wait(1500)
    assert "Progress" not in steps, steps
    in_turns(held.pop())
    monkeypatch.undo()  # the panel's own turns from here on
    qtbot.waitUntil(retrain.before_drawn.is_set, timeout=30_000)
    # the slide's own map is made now, empty and hidden: the retrained maps are drawn into it in place
    ahead = viewer.layers["slide_000 attention"]
    assert not ahead.visible
    assert np.isnan(ahead.data).all()
    qtbot.waitUntil(lambda: retrain.worker is None, timeout=240_000)
    assert "Progress" in steps
    assert retrain.status.text().startswith("Retrained:"), retrain.status.text()

    folder = retrain.run_dir
    assert folder is not None
    assert folder.parent == checkpoint.parent.parent.parent
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["model"]["init_from"] == str(checkpoint.resolve())
    assert (config["optim"]["epochs"], config["data"]["instance_weight"]) == (1, 2.5)
    assert Path(config["data"]["csv"]).name == "slides.csv"
    table = SlideTable.from_csv(folder / "slides.csv")
    annotated = [e for e in table.entries if e.annotations is not None]
    assert [e.path.name for e in annotated] == ["slide_000.svs"]
    assert (
        annotated[0].annotations.parent == (folder / "annotations").resolve()
    )  # the run keeps what it learned from
    replayed = TrainConfig.from_yaml(
        folder / "config.yaml"
    )  # what `bigslide train <folder>/config.yaml` reads
    assert replayed.data.csv == str((folder / "slides.csv").resolve())

    final = folder / "checkpoints" / "last.pt"
    assert seen
    assert seen[-1] == final
    qtbot.waitUntil(
        lambda: panel.run_button.isEnabled() and panel.checkpoint.text() == str(final), timeout=60_000
    )
    roles = [(layer.metadata.get("bigslide_role"), layer.name) for layer in viewer.layers]
    compared = [name for role, name in roles if role == "comparison"]
    assert any(name.startswith("slide_000 attention — before retraining") for name in compared), compared
    slide = viewer.layers["slide_000"]
    copy = next(layer for layer in viewer.layers if layer.name.startswith("slide_000 — before retraining"))
    assert copy.extent.world[1][-1] < slide.extent.world[0][-1]  # before on the left, after on the right
    for captioned, words in ((copy, "before retraining"), (slide, "after retraining")):
        [label] = [layer for layer in viewer.layers if layer.name == f"{captioned.name} caption"]
        assert label.metadata["bigslide_role"] == "comparison"  # closed with the comparison
        assert label.data.shape[-1] == 4, words  # letters on a clear ground
        assert label.data[..., 3].any(), words
        top, left = captioned.extent.world[0][-2:]
        assert label.extent.world[1][-2] <= top  # just above the slide it names, at its left edge
        assert label.extent.world[0][-2] > top - 0.2 * np.ptp(captioned.extent.world[:, -1])
        assert abs(label.extent.world[0][-1] - left) <= label.scale[-1]
    np.testing.assert_allclose(copy.scale, slide.scale)
    assert ("heatmap", "slide_000 attention") in roles  # the slide's own map: the retrained model's
    assert viewer.layers["slide_000 attention"] is ahead
    assert ahead.visible
    assert np.isfinite(ahead.data).any()
    assert "slide_000" in [s.name for s in slides.viewer.layers if s.metadata.get("bigslide_role") == "slide"]
    assert len(panel.session.rows) == 4  # the copy is no slide of the training set

    # what the retrain changed, in words: attention inside the outlines and validation, before -> after
    summary = retrain.summary.text()
    assert re.search(r"slide_000\.svs: attention inside the lesion outlines \d+ % → \d+ %", summary), summary
    assert "Not-lesion outlines" in summary, summary
    assert "Validation, same slides, before → after: accuracy " in summary, summary
    assert "nan" not in summary.lower(), summary
    # one click closes the comparison; the slide and its map stay
    assert not retrain.close_comparison.isHidden()
    qtbot.mouseClick(retrain.close_comparison, Qt.MouseButton.LeftButton)
    assert retrain.close_comparison.isHidden()
    # one layer per event-loop turn: removing a comparison's four at once froze the viewer 200 ms
    qtbot.waitUntil(
        lambda: not [layer for layer in viewer.layers if layer.metadata.get("bigslide_role") == "comparison"],
        timeout=5_000,
    )
    assert "slide_000" in viewer.layers
    assert "slide_000 attention" in viewer.layers


def test_each_outline_keeps_its_own_class_colour_when_the_next_class_is_chosen(
    viewer: Any, dock: Any, tiny_set: Path
) -> None:
    """tumor, then Not lesion, then tumor again, each outline still selected (as napari leaves the one just
    drawn) when the next class is chosen: every outline is drawn in its own class's colour."""
    _slides, panel, layer = annotated_panel(viewer, dock, tiny_set)
    box = panel.annotate
    layer.selected_data = {1}  # the Not lesion outline, just drawn
    box.class_box.setCurrentText("tumor")
    box.draw_button.click()
    layer.add_polygons([np.array(LESION_BOX) + 300.0])
    layer.selected_data = {2}
    box.class_box.setCurrentText(NOT_LESION)
    classes = [box.class_box.itemText(i) for i in range(box.class_box.count())]
    assert list(layer.features["class"]) == ["tumor", NOT_LESION, "tumor"]
    for index, name in enumerate(["tumor", NOT_LESION, "tumor"]):
        expected = np.array([*class_colour(name, classes), 255]) / 255
        np.testing.assert_allclose(layer.edge_color[index], expected, atol=1 / 255, err_msg=name)


def test_outlines_without_area_are_named_at_save_and_the_message_counts_what_was_written(
    viewer: Any, dock: Any, tiny_set: Path, notifications: list[Any]
) -> None:
    _slides, panel, layer = annotated_panel(viewer, dock, tiny_set)
    box = panel.annotate
    flat = np.array([[500.0, 500.0], [500.0, 560.0], [500.0, 560.0]])  # a double-click on the second corner
    layer.add_polygons([flat])
    saved = box.save()
    assert saved is not None
    assert len(json.loads(saved.read_text())["features"]) == 2
    text = box.status.text()
    assert text.startswith("Saved 2 annotations to ")
    assert "1 outline has no area and was not saved" in text
    assert any("1 outline has no area" in n.message for n in notifications if n.severity == "warning")

    layer.selected_data = {0, 1}
    layer.remove_selected()
    layer.add_polygons([flat + 100.0])  # two outlines, neither with an area
    assert box.save() is None
    assert box.status.text().startswith("Nothing saved: 2 outlines have no area and were not saved")
    assert len(read_annotations(saved)) == 2  # the last good file is kept


def _pump(qtbot: Any, ms: int = 60) -> None:
    qtbot.wait(ms)


def test_outlines_drawn_with_the_mouse_keep_every_corner_and_are_saved(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path
) -> None:
    """A person's mouse, not `add_polygons`: four clicks closed by a double-click on the last corner (a
    double-click is press, release, double-click, release) and a box dragged with the rectangle tool.
    Both keep four corners, in their class's colour, and Save writes both."""
    from qtpy.QtCore import QPoint
    from qtpy.QtTest import QTest

    slides = dock("Slides")
    slides.load_csv(tiny_set)
    [slide] = viewer.open(tiny_set.parent / "slide_000.svs", plugin="bigslide")
    viewer.window._qt_window.show()
    panel = dock("Results")
    panel.slide_box.setCurrentText(slide.name)
    box = panel.annotate
    viewer.reset_view()
    _pump(qtbot, 300)
    canvas = viewer.window._qt_viewer.canvas.native
    cx, cy = canvas.width() // 2, canvas.height() // 2
    left, none = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier

    box.class_box.setCurrentText("tumor")
    box.draw_button.click()
    layer = box.layer()
    corners = [
        QPoint(cx - 60, cy - 40),
        QPoint(cx + 60, cy - 40),
        QPoint(cx + 60, cy + 40),
        QPoint(cx - 60, cy + 40),
    ]
    for corner in corners:
        QTest.mouseMove(canvas, corner)
        _pump(qtbot)
        QTest.mouseClick(canvas, left, none, corner)
        _pump(qtbot)
    QTest.mouseDClick(canvas, left, none, corners[-1])  # the double-click's second press
    QTest.mouseRelease(canvas, left, none, corners[-1])
    _pump(qtbot, 200)
    assert len(layer.data) == 1, layer.data
    assert len(layer.data[0]) == 4, layer.data[0]  # no corner dropped: a box, not a triangle

    box.class_box.setCurrentText(NOT_LESION)
    box.draw_button.click()
    layer.mode = "add_rectangle"  # the rectangle tool of the layer controls
    start, end = QPoint(cx - 150, cy + 60), QPoint(cx - 70, cy + 120)
    QTest.mousePress(canvas, left, none, start)
    for k in range(1, 9):
        QTest.mouseMove(canvas, start + (end - start) * k / 8)
        _pump(qtbot, 20)
    QTest.mouseRelease(canvas, left, none, end)
    _pump(qtbot, 200)
    assert len(layer.data) == 2, layer.data
    assert len(layer.data[1]) == 4
    assert list(layer.features["class"]) == ["tumor", NOT_LESION]
    colours = [tuple(np.round(c[:3] * 255).astype(int)) for c in layer.edge_color]
    assert colours == [
        class_colour("tumor", ["normal", "tumor"]),
        class_colour(NOT_LESION, ["normal", "tumor"]),
    ]

    box.save_button.click()
    saved = annotations_path(tiny_set, (tiny_set.parent / "slide_000.svs").resolve())
    annotations = read_annotations(saved)
    assert [a.name for a in annotations] == ["tumor", NOT_LESION]
    for annotation in annotations:
        assert len(annotation.geometry.exterior.coords) == 5  # four corners, closed
        assert annotation.geometry.area > 0
    assert box.status.text().startswith("Saved 2 annotations"), box.status.text()


def test_pressing_draw_puts_its_words_on_screen_before_napari_makes_the_outline_layer(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path
) -> None:
    """napari makes a slide's first outline layer on the GUI thread, a freeze of a quarter of a second on
    two cores that no worker can take over: the status line says what to do before it, painted (on screen)
    before the layer is inserted, not after the freeze."""
    from qtpy.QtWidgets import QScrollArea

    window = viewer.window._qt_window
    _, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
    qtbot.waitUntil(lambda: panels.ready, timeout=120_000)
    window.setGeometry(0, 0, 1600, 1000)
    window.show()
    qtbot.waitExposed(window)
    panels.slides.load_csv(tiny_set)
    [slide] = viewer.open(tiny_set.parent / "slide_000.svs", plugin="bigslide")
    panel = panels.results
    panels.tabs.setCurrentWidget(panel)
    panel.slide_box.setCurrentText(slide.name)
    box = panel.annotate
    box.class_box.setCurrentText("tumor")
    for area in panel.findChildren(QScrollArea):
        area.ensureWidgetVisible(box.status)
    qtbot.waitUntil(lambda: not box.status.visibleRegion().isEmpty(), timeout=5000)
    order = PaintOrder(viewer, [box.status])
    qtbot.mouseClick(box.draw_button, Qt.MouseButton.LeftButton)
    order.stop()

    assert len(order.layers()) == 1, order.seen
    before = order.painted_before_the_first_layer()
    assert any(text.startswith("Drawing 'tumor' on slide_000") for text in before), order.seen
    assert box.layer().mode == "add_polygon"


def test_an_outline_picked_with_the_select_tool_takes_the_class_chosen_then_and_is_saved_with_it(
    viewer: Any, dock: Any, tiny_set: Path, tmp_path: Path
) -> None:
    """A pathologist who drew an outline in the wrong class picks it (select tool) and chooses the right
    class: the outline takes it, in its colour, and Save writes it, not the class it was drawn with."""
    import shutil

    copied = shutil.copytree(tiny_set.parent, tmp_path / "set", ignore=shutil.ignore_patterns("annotations"))
    _slides, panel, layer = annotated_panel(viewer, dock, Path(copied) / tiny_set.name)
    box = panel.annotate
    layer.mode = "select"
    layer.selected_data = {0}  # the tumor outline
    box.class_box.setCurrentText("normal")
    assert list(layer.features["class"]) == ["normal", NOT_LESION]
    layer.selected_data = {0}
    box.class_box.setCurrentText(NOT_LESION)  # as the last outline was drawn: chosen again from the list
    box.class_box.activated.emit(box.class_box.currentIndex())
    assert list(layer.features["class"]) == [NOT_LESION, NOT_LESION]
    classes = [box.class_box.itemText(i) for i in range(box.class_box.count())]
    expected = np.array([*class_colour(NOT_LESION, classes), 255]) / 255
    np.testing.assert_allclose(layer.edge_color[0], expected, atol=1 / 255)
    assert "now 'Not lesion'" in box.status.text()
    saved = box.save()
    assert saved is not None
    assert [a.name for a in read_annotations(saved)] == [NOT_LESION, NOT_LESION]
