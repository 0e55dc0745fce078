"""Where to look next, in the Results panel: places suggested by a trained checkpoint are shown one at a
time on their slide (outlined and zoomed onto), and one key or click answers each: the answer is saved as
a teaching annotation of the slide and counted in the Slides table; Skip saves nothing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import shapely
from qtpy.QtCore import Qt

from bigslide.explain.suggest import HIGH, REVIEW_COLOUR, flat_attention
from bigslide.napari._suggest_queue import ROLE, answer_keys
from bigslide.tiling.annotations import NOT_LESION, annotated_count, annotations_path, read_annotations
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide
from tests.gui.test_results import tiny_checkpoint
from tests.gui.test_typed_numbers import type_into

PLACES = 4


def level0(slide: Any, world: Any) -> tuple[float, float]:
    """Level-0 (x, y) position of a world point on the slide (pixel k spans [k, k + 1))."""
    row, col = np.asarray(slide.world_to_data(world))[-2:]
    return float(col) + 0.5, float(row) + 0.5


def annotated_tiles(session: Any, path: Path) -> int:
    """The tiles a run would make of the slide (at the panel's tiling) inside its saved annotations."""
    row = session.row(path)
    with open_slide(path) as opened:
        grid = TileGrid.from_slide(
            opened, session.tile_size, target_mpp=session.target_mpp, min_tissue=session.min_tissue
        )
    return annotated_count(read_annotations(row.annotations), grid.coords, grid.tile_size_level0)


def saved_files(tiny_set: Path) -> dict[str, str]:
    folder = annotations_path(tiny_set, tiny_set.parent / "x.svs").parent
    return {p.name: p.read_text() for p in sorted(folder.glob("*"))} if folder.is_dir() else {}


def test_answers_given_with_one_key_are_saved_where_the_model_asked_and_counted(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    # a copy of the set: the session's set holds the annotations other tests saved beside its table
    saved = annotations_path(tiny_set, tiny_set).parent.name
    copied = shutil.copytree(tiny_set.parent, tmp_path / "set", ignore=shutil.ignore_patterns(saved))
    tiny_set = Path(copied) / tiny_set.name
    checkpoint = tiny_checkpoint(tiny_set, tmp_path / "run", "abmil_acc", {"hidden": 32, "attention_dim": 16})
    slides = dock("Slides")
    slides.load_csv(tiny_set)
    panel = dock("Results")
    panel.checkpoint.setText(str(checkpoint))
    panel.device.setCurrentText("cpu")
    # the first training slide open, its annotations layer too: an answer on it must reach the layer
    first = (tiny_set.parent / "slide_000.svs").resolve()
    [opened] = viewer.open(first, plugin="bigslide")
    panel.slide_box.setCurrentText(opened.name)
    drawn = panel.annotate.layer(create=True)
    box = panel.suggest
    assert box.place.isHidden()
    type_into(qtbot, box.count, str(PLACES))
    qtbot.mouseClick(box.suggest_button, Qt.MouseButton.LeftButton)
    assert box.worker is not None, box.status.text()
    qtbot.waitUntil(lambda: box.worker is None, timeout=120_000)
    assert box.status.text().startswith(f"{PLACES} places suggested on "), box.status.text()
    # a model that attends nearly evenly (this untrained one may) is said to ask about near-random places
    assert ("near random" in box.status.text()) == (flat_attention(box.queue) is not None)
    assert [b.text() for b in box.buttons.values()] == ["tumor (L)", f"{NOT_LESION} (N)", "Skip (S)"]
    canvas = viewer.window._qt_viewer.canvas.native
    rows = {r.path: index for index, r in enumerate(panel.session.rows)}
    expected: dict[Path, list[tuple[str, shapely.Polygon]]] = {}
    answers = [
        ("canvas", Qt.Key.Key_L, "tumor"),
        ("panel", Qt.Key.Key_S, None),
        ("canvas", Qt.Key.Key_N, NOT_LESION),
    ]
    for number, (where, key, answer) in enumerate([*answers, ("click", None, "tumor")], start=1):
        s = box.current()
        assert s is not None
        assert box.place.text() == f"Place {number} of {PLACES} — {PLACES - number + 1} left"
        assert s.reason in box.reason.text()
        assert s.slide.name in box.where.text()
        # a normal slide's place is called a likely false alarm only when attended well above its mean
        called = "false alarm" in box.where.text()
        assert called == (s.kind == "false_alarm" and s.score >= HIGH), (box.where.text(), s)
        slide = box._slide_layer(s.slide)  # opened when it was not
        assert slide is not None
        assert viewer.layers.selection.active is slide  # the keys reach the viewer, not a Shapes tool
        area = shapely.box(*s.box)
        camera = viewer.scene.camera
        assert area.contains(shapely.Point(level0(slide, camera.center)))  # centred on the place
        shown = (s.box[2] - s.box[0]) * float(slide.scale[-1]) * camera.zoom  # its width on the canvas
        assert 0.2 * min(viewer.canvas.size) < shown < min(viewer.canvas.size)  # large, with context
        [outline] = [layer for layer in viewer.layers if layer.metadata.get("bigslide_role") == ROLE]
        corners = [level0(slide, outline.data_to_world(v)) for v in outline.data[0]]
        assert shapely.Polygon(corners).normalize().equals_exact(area.normalize(), 1e-6)  # on the place
        np.testing.assert_allclose(outline.edge_color[0][:3], np.array(REVIEW_COLOUR) / 255)
        before = saved_files(tiny_set)
        if where == "canvas":
            qtbot.keyClick(canvas, key)
        elif where == "panel":
            qtbot.keyClick(box.buttons["Skip"], key)  # a key pressed on the panel
        else:
            qtbot.mouseClick(box.buttons["tumor"], Qt.MouseButton.LeftButton)
        if answer is None:
            assert saved_files(tiny_set) == before  # skipped: nothing saved
        else:
            expected.setdefault(s.slide, []).append((answer, area))

            # the Slides table's Annotated count: the tiles inside the slide's answers so far
            def shown(row: int = rows[s.slide]) -> str:
                return slides.table.item(row, slides.column("Annotated")).text()

            count = str(annotated_tiles(panel.session, s.slide))
            qtbot.waitUntil(lambda shown=shown, count=count: shown() == count, timeout=60_000)
    assert box.current() is None
    status = box.status.text()
    assert status.startswith(f"All {PLACES} places answered: 2 tumor, 1 {NOT_LESION}, 1 skipped"), status
    assert "Retrain with annotations" in status
    assert not [layer for layer in viewer.layers if layer.metadata.get("bigslide_role") == ROLE]
    for path, wanted in expected.items():
        row = panel.session.row(path)
        assert row is not None
        assert row.annotations == annotations_path(tiny_set, path)
        got = read_annotations(row.annotations)
        assert [a.name for a in got] == [name for name, _ in wanted]
        for annotation, (_name, area) in zip(got, wanted):
            assert annotation.geometry.normalize().equals_exact(area.normalize(), 1e-6)
    on_first = expected.get(first, [])
    assert list(drawn.features["class"]) == [name for name, _ in on_first]  # the open layer has them too
    assert drawn.feature_defaults["class"][0] == NOT_LESION  # it still draws the class chosen for it
    # the queue is over: its keys are given back, a key on the canvas saves nothing more
    assert not {"L", "N", "S"} & {str(k) for k in viewer.keymap}
    before = saved_files(tiny_set)
    qtbot.keyClick(canvas, Qt.Key.Key_L)
    assert saved_files(tiny_set) == before


def test_no_checkpoint_is_said_in_the_status_line_and_nothing_runs(
    dock: Any, qtbot: Any, tiny_set: Path, notifications: list[Any]
) -> None:
    dock("Slides").load_csv(tiny_set)
    box = dock("Results").suggest
    qtbot.mouseClick(box.suggest_button, Qt.MouseButton.LeftButton)
    assert box.worker is None
    status = box.status.text()  # nothing typed in the checkpoint field: not "no checkpoint at '.'"
    assert status.startswith("No place to suggest: no checkpoint chosen: train a model"), status
    assert any(n.severity == "error" for n in notifications)


def test_several_lesion_classes_get_a_key_each() -> None:
    assert answer_keys(["tumor"]) == {"tumor": "L"}
    assert answer_keys(["adenoma", "carcinoma", "sarcoma"]) == {
        "adenoma": "A",
        "carcinoma": "C",
        "sarcoma": "R",
    }


def test_keys_on_the_canvas_after_the_results_panel_is_closed_save_nothing_and_stop_the_queue(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, notifications: list[Any]
) -> None:
    """napari keeps a closed panel alive, unparented: the queue's keys must not go on saving answers that
    nobody sees; the key is refused in words and the keys are given back."""
    from bigslide.explain.suggest import Suggestion

    copied = shutil.copytree(tiny_set.parent, tmp_path / "set", ignore=shutil.ignore_patterns("annotations"))
    tiny_set = Path(copied) / tiny_set.name
    slides = dock("Slides")
    slides.load_csv(tiny_set)
    panel = dock("Results")
    box = panel.suggest
    slide = (tiny_set.parent / "slide_000.svs").resolve()
    places = [
        Suggestion(slide, (64.0 * k, 64.0, 64.0 * k + 96, 160.0), "uncertain", "moves", 0.5) for k in (1, 2)
    ]
    box.show_queue(places)
    canvas = viewer.window._qt_viewer.canvas.native
    viewer.window.remove_dock_widget(panel)  # the x on its title bar
    qtbot.keyClick(canvas, Qt.Key.Key_L)
    assert saved_files(tiny_set) == {}
    assert box.current() is None  # the queue stopped
    assert not {"L", "N", "S"} & {str(k) for k in viewer.keymap}
    assert any("saved nothing" in str(n.message) for n in notifications)
