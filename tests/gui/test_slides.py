"""The Slides panel: open slides and CSV rows in one table, labels typed in place, CSV round trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bigslide.data.table import SlideTable
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide
from tests.conftest import textured_tissue
from tests.gui.test_typed_numbers import type_into


def replayed_run(viewer: Any, session: Any, folder: Path) -> Any:
    """The config a run started from the viewer writes to its folder, read back as a replay reads it."""
    from bigslide.engine.config import TrainConfig
    from bigslide.napari._run import write_run_folder

    defaults = TrainConfig()
    write_run_folder(
        viewer,
        session,
        folder,
        method="abmil_acc",
        method_params={},
        data_values={},
        model=defaults.model,
        optim=defaults.optim,
        device="cpu",
    )
    return TrainConfig.from_yaml(folder / "config.yaml")


def type_over_cell(qtbot: Any, table: Any, row: int, column: int, text: str) -> None:
    """As a person edits a cell: select it, F2, select what is there, type (nothing: clear it), Enter."""
    from qtpy.QtCore import Qt

    table.setCurrentCell(row, column)
    qtbot.keyClick(table, Qt.Key.Key_F2)
    qtbot.wait(50)
    editor = table.focusWidget()
    qtbot.keyClick(editor, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(editor, Qt.Key.Key_Backspace)
    qtbot.keyClicks(editor, text)
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.wait(50)  # the editor closes on the next turn of the event loop


def tiles_at(path: Path, mpp: float, session: Any) -> int:
    """The 64 px tiles of the slide at `path` read as `mpp` µm/px, with the session's resolution and least
    tissue: what the panel's count must say of it."""
    with open_slide(path) as slide:
        slide.mpp = (mpp, mpp)
        return len(
            TileGrid.from_slide(slide, 64, target_mpp=session.target_mpp, min_tissue=session.min_tissue)
        )


def test_training_set_sample_fills_the_table(viewer: Any, dock: Any, tmp_path: Path) -> None:
    panel = dock("Slides")
    layers = viewer.open_sample("bigslide", "training_set")
    slides = [layer for layer in layers if layer.metadata.get("bigslide_role") == "slide"]
    assert len(slides) == panel.table.rowCount() == 8
    labels = [panel.table.item(i, 1).text() for i in range(8)]
    assert set(labels) == {"tumor", "normal"}
    # side by side, not stacked: no two slides share a top-left corner in the world
    corners = {tuple(layer.data_to_world((0, 0))) for layer in slides}
    assert len(corners) == 8

    panel.set_label(0, "benign")
    saved = panel.save_csv(tmp_path / "set.csv")
    table = SlideTable.from_csv(saved)
    assert [e.label for e in table.entries] == ["benign", *labels[1:]]

    viewer.layers.remove(slides[0])  # closing a slide drops its row
    assert panel.table.rowCount() == 7


def test_csv_rows_and_tile_counts(viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, svs_slide: Any) -> None:
    panel = dock("Slides")
    viewer.open(svs_slide.path, plugin="bigslide")
    assert panel.table.rowCount() == 1
    assert panel.table.item(0, 1).text() == ""
    panel.load_csv(tiny_set)
    assert panel.table.rowCount() == 5
    panel.tile_size.setValue(64)
    assert panel.count_tiles() is not None
    assert not panel.count_button.isEnabled()
    qtbot.waitUntil(panel.count_button.isEnabled, timeout=30_000)  # enabled again when the worker finishes
    for row in panel.session.rows:
        with open_slide(row.path) as slide:
            expected = len(TileGrid.from_slide(slide, 64, min_tissue=panel.session.min_tissue))
        assert row.tiles == expected
    assert [panel.table.item(i, panel.column("Tiles")).text() for i in range(5)] == [
        str(r.tiles) for r in panel.session.rows
    ]


def test_bad_csv_is_reported(viewer: Any, dock: Any, tmp_path: Path, notifications: list[Any]) -> None:
    panel = dock("Slides")
    bad = tmp_path / "bad.csv"
    bad.write_text("slide,label\nmissing.svs,tumor\n")
    panel.load_csv(bad)
    assert any("missing.svs" in n.message for n in notifications if n.severity == "error")
    assert panel.table.rowCount() == 0


def test_a_slide_without_pixel_size_is_counted_once_its_um_per_px_is_given(
    viewer: Any,
    dock: Any,
    qtbot: Any,
    make_slide: Any,
    slide_image: Any,
    notifications: list[Any],
    tmp_path: Path,
) -> None:
    pink = textured_tissue(slide_image.shape[:2])  # grey noise is dust, flat pink a film
    unstated = make_slide(pink, flavour="tiff", mpp=None, name="no-mpp")
    panel = dock("Slides")
    viewer.open(unstated.path, plugin="bigslide")
    panel.set_label(0, "tumor")
    panel.tile_size.setValue(64)
    assert panel.count_tiles() is not None
    qtbot.waitUntil(panel.count_button.isEnabled, timeout=30_000)
    errors = [n.message for n in notifications if n.severity == "error"]
    assert any("no-mpp" in m and "pixel size" in m for m in errors), errors  # names the slide and says why
    assert panel.session.rows[0].tiles is None

    # its scanner's µm/px; read at 0.5 µm/px: 128 level-0 px per tile
    type_into(qtbot, panel.slide_mpp, "0.25")
    assert panel.session.slide_mpp == 0.25
    # the failure asked for this: the panel no longer says the slide cannot be tiled (test_toasts: its toast)
    assert panel.session.rows[0].untiled is None
    assert "pixel size" not in panel.status.text()
    panel.count_tiles()
    qtbot.waitUntil(panel.count_button.isEnabled, timeout=30_000)
    assert panel.session.rows[0].tiles == tiles_at(unstated.path, 0.25, panel.session) > 0

    assert replayed_run(viewer, panel.session, tmp_path / "run").data.slide_mpp == 0.25


def test_a_tables_mpp_column_sizes_and_tiles_a_slide_whose_file_states_none(
    viewer: Any, dock: Any, qtbot: Any, make_slide: Any, slide_image: Any, tmp_path: Path
) -> None:
    """A table listing each slide's scanner µm/px: the slide takes its row's size on the canvas, in the tile
    count and in the run, whatever fallback is typed for other slides."""
    pink = textured_tissue(slide_image.shape[:2])
    unstated = make_slide(pink, flavour="tiff", mpp=None, name="no-mpp")
    [layer] = viewer.open(unstated.path, plugin="bigslide")
    panel = dock("Slides")
    table = tmp_path / "slides.csv"
    table.write_text(f"slide,label,µm/px\n{unstated.path},tumor,0.25\n")
    panel.load_csv(table)
    qtbot.wait(50)
    assert layer.scale == pytest.approx((0.25, 0.25))  # in µm on the canvas
    assert panel.table.item(0, panel.column("µm/px")).text() == "0.25 (table)"
    type_into(qtbot, panel.slide_mpp, "0.5")  # the fallback, for other slides
    assert layer.scale == pytest.approx((0.25, 0.25))
    panel.tile_size.setValue(64)
    panel.count_tiles()
    qtbot.waitUntil(panel.count_button.isEnabled, timeout=30_000)
    assert panel.session.rows[0].tiles == tiles_at(unstated.path, 0.25, panel.session) > 0
    replayed_run(viewer, panel.session, tmp_path / "run")
    assert [e.mpp for e in SlideTable.from_csv(tmp_path / "run" / "slides.csv").entries] == [0.25]

    # a file that states its own µm/px, listed at another: the cell and the status line say so
    stated = make_slide(pink, flavour="svs", mpp=0.25, name="stated")
    viewer.open(stated.path, plugin="bigslide")
    table.write_text(f"slide,label,µm/px\n{stated.path},normal,0.5\n")
    panel.load_csv(table)
    row = next(i for i, r in enumerate(panel.session.rows) if r.path.name == "stated.svs")
    assert panel.table.item(row, panel.column("µm/px")).text() == "0.25 (table 0.5!)"
    assert "stated.svs: the table's mpp is at odds with the file's µm/px" in panel.status.text()


def test_pen_marks_box_on_by_default_leaves_out_a_violet_pen_on_the_glass_in_counts_and_runs(
    viewer: Any, dock: Any, qtbot: Any, tmp_path: Path
) -> None:
    from qtpy.QtCore import QPoint, Qt

    from bigslide.synthetic.marks import Pen, synthesize_marked_slide
    from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
    from bigslide.tiling.pixel_classes import PEN_FLATNESS, TissueSettings

    violet = Pen("violet", (118, 96, 182))  # hematoxylin's hue: colour alone keeps it as tissue
    marked = synthesize_marked_slide((768, 768), seed=17, mpp=2.0, inks=(violet,))
    path = write_pyramid(tmp_path / "pen.tif", downsample_pyramid(marked.rgb, 4), mpp=2.0, flavour="tiff")
    panel = dock("Slides")
    viewer.open(path, plugin="bigslide")
    panel.set_label(0, "tumor")

    def counted() -> int:
        panel.count_tiles()
        qtbot.waitUntil(panel.count_button.isEnabled, timeout=30_000)
        tiles = panel.session.rows[0].tiles
        assert tiles is not None
        assert panel.status.text() == f"{tiles} tiles in 1 slide."  # one slide, said as one
        return tiles

    assert panel.pen_marks.isChecked()  # on by default
    assert panel.session.tissue == TissueSettings(ink_flatness=PEN_FLATNESS)
    with_pens = counted()
    with open_slide(path) as slide:
        expected = len(
            TileGrid.from_slide(
                slide,
                panel.session.tile_size,
                target_mpp=panel.session.target_mpp,
                min_tissue=panel.session.min_tissue,
                tissue=TissueSettings(ink_flatness=PEN_FLATNESS),
            )
        )
    assert with_pens == expected
    assert replayed_run(viewer, panel.session, tmp_path / "run").data.ink_flatness == PEN_FLATNESS

    box = panel.pen_marks
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))  # on its tick box
    assert not panel.pen_marks.isChecked()
    assert panel.session.tissue == TissueSettings(ink_flatness=0.0)
    without = counted()
    assert with_pens < 0.8 * without  # colour alone keeps the pen's tiles on the glass
    assert replayed_run(viewer, panel.session, tmp_path / "run2").data.ink_flatness == 0.0


def test_a_table_change_after_the_panels_are_closed_reaches_no_deleted_widget(
    viewer: Any, dock: Any, qtbot: Any
) -> None:
    """A worker's result (an annotations count) may change the table after a panel has closed."""
    from qtpy import sip

    panels = [dock(name) for name in ("Slides", "Train", "Results")]
    session = panels[0].session
    for panel in panels:
        panel.deleteLater()
    qtbot.waitUntil(lambda: all(sip.isdeleted(p) for p in panels), timeout=10_000)
    session.changed.emit()  # raised RuntimeError: wrapped C/C++ object ... has been deleted


def test_slides_added_from_the_dialog_become_unlabelled_rows_without_opening(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qtpy.QtCore import Qt
    from qtpy.QtWidgets import QFileDialog

    panel = dock("Slides")
    chosen = [str(tiny_set.parent / f"slide_00{i}.svs") for i in (0, 1)]
    asked: list[str] = []

    def dialog(_parent: Any, _title: str, _folder: str, filters: str) -> tuple[list[str], str]:
        asked.append(filters)
        return chosen, filters

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", dialog)
    qtbot.mouseClick(panel.add_button, Qt.MouseButton.LeftButton)
    assert "*.svs" in asked[0]
    assert "*.mrxs" in asked[0]
    assert [str(row.path) for row in panel.session.rows] == [str(Path(p).resolve()) for p in chosen]
    assert all(row.label == "" for row in panel.session.rows)
    assert panel.table.rowCount() == 2
    assert len(viewer.layers) == 0  # listed, not opened
    assert panel.status.text().startswith("Added 2 slides.")
    qtbot.mouseClick(panel.add_button, Qt.MouseButton.LeftButton)  # the same again: no second row
    assert panel.table.rowCount() == 2
    assert panel.status.text().startswith("Added 0 slides")


def test_the_panels_ask_for_labels_only_for_the_slides_without_one(dock: Any, tiny_set: Path) -> None:
    panel, train = dock("Slides"), dock("Train")
    panel.load_csv(tiny_set)  # every row labelled
    said = "each slide's class is in the Label column (type over one to change it)."
    assert panel.status.text().endswith(said)
    assert train.status.text() == "Every slide has its class: press Start to train."
    panel.table.item(0, panel.column("Label")).setText("")  # a class erased in its cell
    assert "type a class in the Label column for the 1 slide without one" in panel.status.text()
    assert train.status.text().startswith("Label the 1 slide without a class in the Slides panel")


def test_a_slide_that_cannot_be_tiled_is_marked_and_the_others_counted(
    dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, notifications: list[Any]
) -> None:
    import csv

    with tiny_set.open() as f:
        rows = list(csv.DictReader(f))
    cut = tmp_path / "cut.svs"
    cut.write_bytes((tiny_set.parent / rows[0]["slide"]).read_bytes()[:3000])  # a copy cut short
    table = tmp_path / "slides.csv"
    with table.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["slide", "label"])
        writer.writerow([str(cut), rows[0]["label"]])
        writer.writerows([str(tiny_set.parent / r["slide"]), r["label"]] for r in rows)
    panel = dock("Slides")
    panel.load_csv(table)
    panel.tile_size.setValue(64)
    panel.count_tiles()
    qtbot.waitUntil(panel.count_button.isEnabled, timeout=30_000)
    first, *others = panel.session.rows
    assert first.tiles is None
    assert first.untiled
    assert all(r.tiles for r in others)  # counted past the slide before them
    assert panel.table.item(0, 0).text() == "cut.svs — not tiled"
    assert "cannot be tiled: " in panel.table.item(0, 0).toolTip()
    status = panel.status.text()
    assert status.startswith("Counting tiles failed on 1 slide: cut.svs: the file is cut short")
    assert status.endswith(f". {sum(r.tiles for r in others)} tiles in 4 slides (the others).")


def test_a_slides_own_pixel_size_is_typed_in_its_row(
    viewer: Any, dock: Any, qtbot: Any, make_slide: Any, slide_image: Any, tmp_path: Path
) -> None:
    """Two slides from two microscopes, neither stating its µm/px: each takes the one typed in its own row,
    on the canvas and in the run's table; a magnification typed there is refused, and clearing it gives
    the slide back to the fallback."""
    from qtpy.QtCore import Qt

    pink = textured_tissue(slide_image.shape[:2])
    layers = [
        viewer.open(make_slide(pink, flavour="tiff", mpp=None, name=name).path, plugin="bigslide")[0]
        for name in ("scope-a", "scope-b")
    ]
    panel = dock("Slides")
    column = panel.column("µm/px")

    def type_cell(row: int, text: str) -> None:  # select the cell, type over it, press Enter
        panel.table.setCurrentCell(row, column)
        qtbot.keyClicks(panel.table, text[0])  # the first key opens the cell's editor, holding it
        editor = panel.table.focusWidget()
        qtbot.keyClicks(editor, text[1:])
        qtbot.keyClick(editor, Qt.Key.Key_Return)
        qtbot.wait(50)  # the editor closes on the next turn of the event loop

    type_cell(0, "0.25")
    type_cell(1, "0.5")
    assert [r.mpp for r in panel.session.rows] == [0.25, 0.5]
    assert [tuple(layer.scale) for layer in layers] == [(0.25, 0.25), (0.5, 0.5)]
    assert panel.table.item(0, column).text() == "0.25 (table)"
    panel.set_label(0, "tumor")
    panel.set_label(1, "normal")
    replayed_run(viewer, panel.session, tmp_path / "run")  # the run reads each slide at its own
    assert [e.mpp for e in SlideTable.from_csv(tmp_path / "run" / "slides.csv").entries] == [0.25, 0.5]
    type_cell(0, "40")  # a magnification, not a pixel size
    assert panel.session.rows[0].mpp == 0.25
    assert "Row 1 (scope-a.tif): µm/px must be at most 10" in panel.status.text()
    type_over_cell(qtbot, panel.table, 0, column, "")  # cleared: the fallback below again (none: missing)
    assert panel.session.rows[0].mpp is None
    assert panel.table.item(0, column).text() == "missing"
    assert tuple(layers[0].scale) == (1.0, 1.0)  # drawn at the provisional size again


def test_slides_selected_become_one_case_renamed_in_the_case_column(
    viewer: Any, dock: Any, qtbot: Any, make_slide: Any, slide_image: Any, tmp_path: Path
) -> None:
    """A patient's slides opened one by one become one case without a table: selected with the mouse,
    One case, then the case's name typed over in its column; the run's table holds it."""
    from qtpy.QtCore import Qt

    pink = textured_tissue(slide_image.shape[:2])
    for name in ("p1-a", "p1-b", "p2"):
        viewer.open(make_slide(pink, flavour="svs", mpp=0.5, name=name).path, plugin="bigslide")
    panel = dock("Slides")
    qtbot.mouseClick(panel.case_button, Qt.MouseButton.LeftButton)  # nothing selected: says what to do
    assert panel.status.text().startswith("Select two or more slides")
    for row, modifier in ((0, Qt.KeyboardModifier.NoModifier), (1, Qt.KeyboardModifier.ControlModifier)):
        rect = panel.table.visualItemRect(panel.table.item(row, 0))
        qtbot.mouseClick(panel.table.viewport(), Qt.MouseButton.LeftButton, modifier, rect.center())
    qtbot.mouseClick(panel.case_button, Qt.MouseButton.LeftButton)
    assert [r.case for r in panel.session.rows] == ["p1-a", "p1-a", None]
    column = panel.column("Case")
    assert column >= 0  # shown once a slide has a case
    for row in (0, 1):
        type_over_cell(qtbot, panel.table, row, column, "patient 1")
    assert panel.session.rows[0].case == "patient 1"
    for row, label in enumerate(("tumor", "tumor", "normal")):
        panel.set_label(row, label)
    replayed_run(viewer, panel.session, tmp_path / "run")
    written = SlideTable.from_csv(tmp_path / "run" / "slides.csv")
    assert [e.case for e in written.entries] == ["patient 1", "patient 1", None]
    assert list(written.cases().values()) == [[0, 1], [2]]
