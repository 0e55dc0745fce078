"""Numbers typed into the panels, key by key as a person types them: kept exactly as typed (scientific
notation included) or refused beside the field with a reason, and no run starts while one is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from qtpy.QtCore import Qt

from tests.gui.test_train import train_panel


def type_into(qtbot: Any, field: Any, text: str) -> None:
    """Select what the field holds (Ctrl+A), delete it, type `text`, then press Enter."""
    qtbot.keyClick(field.edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(field.edit, Qt.Key.Key_Backspace)
    qtbot.keyClicks(field.edit, text)
    qtbot.keyClick(field.edit, Qt.Key.Key_Return)


def refused(field: Any) -> str:
    """The one-line reason shown under the field (empty when the number is kept)."""
    return field.message.text() if field.message.isVisibleTo(field) else ""


def test_scientific_notation_is_kept_and_reaches_the_run(
    dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    widget = train_panel(dock, tiny_set, tmp_path / "runs", "abmil_acc")
    type_into(qtbot, widget.lr, "1e-5")
    assert widget.lr.text() == "1e-5"
    assert widget.lr.value() == 1e-5
    assert refused(widget.lr) == ""
    type_into(qtbot, widget.epochs, "3")
    qtbot.keyClick(widget.epochs.edit, Qt.Key.Key_Up)  # the arrow keys step, as in a spin box
    assert widget.epochs.value() == 4
    assert widget.problems() == []
    widget.write_config()
    config = yaml.safe_load((widget.run_dir / "config.yaml").read_text())
    assert config["optim"]["lr"] == 1e-5
    assert config["optim"]["epochs"] == 4


@pytest.mark.parametrize(
    ("panel", "field", "typed", "reason"),
    [
        ("train", "lr", "-0.001", "must be greater than 0"),
        ("train", "lr", "0", "must be greater than 0"),
        ("train", "epochs", "2.5", "a whole number is needed"),
        ("data", "bag_size", "-5", "must be at least 0"),
        ("data", "stain_augment_strength", "-0.001", "must be at least 0"),
        ("params", "dropout", "-0.001", "must be at least 0"),
        ("slides", "target_mpp", "-5", "must be greater than 0"),
        ("slides", "target_mpp", "0,5", "use a point as the decimal mark: 0.5"),
        ("slides", "slide_mpp", "-5", "must be greater than 0"),
        ("slides", "min_tissue", "-0.001", "must be at least 0"),
        ("slides", "tile_size", "abc", "'abc' is not a number"),
    ],
)
def test_a_refused_number_is_named_beside_its_field_and_start_waits_for_it(
    dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, panel: str, field: str, typed: str, reason: str
) -> None:
    runs = tmp_path / "runs"
    widget = train_panel(dock, tiny_set, runs, "abmil_acc")
    slides = dock("Slides")
    box = {
        "train": lambda: getattr(widget, field),
        "data": lambda: widget.data_form.widgets[field],
        "params": lambda: widget.params_form.widgets[field],
        "slides": lambda: getattr(slides, field),
    }[panel]()
    kept = box.value()
    type_into(qtbot, box, typed)
    assert box.text() == typed  # shown as typed: never rewritten ("-0.0", "from file", a clamped 5)
    assert reason in refused(box)

    assert widget.start() is None  # refused, naming the field and what was typed
    assert f"(typed '{typed}')" in widget.status.text()
    assert reason in widget.status.text()
    assert not runs.exists() or not any(runs.iterdir())  # nothing written

    type_into(qtbot, box, str(kept) if kept is not None else "")
    assert refused(box) == ""
    assert widget.typed_problems() == []


def test_an_empty_slide_pixel_size_means_from_file(dock: Any, qtbot: Any) -> None:
    slides = dock("Slides")
    type_into(qtbot, slides.slide_mpp, "0.25")
    assert slides.session.slide_mpp == 0.25
    type_into(qtbot, slides.slide_mpp, "")
    assert slides.slide_mpp.edit.placeholderText() == "from file"
    assert slides.session.slide_mpp is None
    assert slides.session.problems() == []
