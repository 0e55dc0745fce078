"""The panels in a pathologist's words: methods by name, fields with units and no config names, no
Python lists in the status, a progress bar that says the time left, the stain reference chosen there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qtpy.QtWidgets import QLabel

from bigslide.engine.config import TrainConfig
from tests.gui.test_train import start, train_panel


def form_labels(form: Any) -> list[str]:
    layout = form.layout_
    labels = []
    for name in form.visible_fields():
        label = layout.labelForField(form.widgets[name])
        assert isinstance(label, QLabel)
        labels.append(label.text())
    return labels


def test_methods_and_fields_read_as_words(dock: Any) -> None:
    widget = dock("Train")
    shown = [widget.method_box.itemText(i) for i in range(widget.method_box.count())]
    assert {"ABMIL-ACC", "PatchGD", "Big-Layer, tiles", "Big-Layer, whole image"} <= set(shown)
    assert not any("_" in name for name in shown)
    for name in ("abmil_acc", "patchgd", "biglayer_mil", "full_image"):
        widget.set_method(name)
        assert widget.method_name() == name  # the registry name still reaches config.yaml
        labels = form_labels(widget.params_form) + form_labels(widget.data_form)
        assert not any("_" in label for label in labels), labels
        assert not {"bn mode", "forward chunk size", "hidden", "chunk size"} & set(labels), labels
        assert "→" not in widget.summary.text()
    widget.set_method("abmil_acc")
    assert "tiles per pass without gradients (0 = auto)" in form_labels(widget.params_form)
    assert "tile encoder normalisation" in form_labels(widget.params_form)
    shown_labels = form_labels(widget.params_form)
    assert not [label for label in shown_labels if "BatchNorm" in label or label == "MIL head"], shown_labels
    normalise = widget.data_form.widgets["stain_normalise"]
    assert [normalise.itemText(i) for i in range(normalise.count())] == ["off", "Macenko", "Reinhard"]


def test_the_stain_reference_is_chosen_in_the_panel(
    viewer: Any, dock: Any, tiny_set: Path, tmp_path: Path
) -> None:
    widget = train_panel(dock, tiny_set, tmp_path / "runs", "abmil_acc")
    form = widget.data_form
    assert not form.layout_.isRowVisible(widget.stain_reference)  # only with normalisation on
    form.set_values({"stain_normalise": "reinhard"})
    assert form.layout_.isRowVisible(widget.stain_reference)
    [slide] = viewer.open(tiny_set.parent / "slide_002.svs", plugin="bigslide")
    widget.stain_reference.setCurrentText(slide.name)  # an open slide, offered by name
    widget.write_config()
    config = TrainConfig.from_yaml(widget.run_dir / "config.yaml")
    assert config.data.stain_normalise == "reinhard"
    assert Path(config.data.stain_reference or "") == tiny_set.parent / "slide_002.svs"
    widget.choose_stain_reference(None)  # back to the bundled reference
    widget.write_config()
    assert TrainConfig.from_yaml(widget.run_dir / "config.yaml").data.stain_reference is None


def test_the_status_has_no_python_lists_and_the_progress_bar_says_the_time_left(
    dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    widget = train_panel(dock, tiny_set, tmp_path / "runs", "abmil_acc")
    widget.max_steps.setValue(4)
    widget.epochs.setValue(2)  # 2 training slides: 4 steps
    statuses: list[str] = []
    formats: list[str] = []
    widget.run_created.connect(
        lambda worker: worker.yielded.connect(
            lambda _e: (statuses.append(widget.status.text()), formats.append(widget.progress.format()))
        )
    )
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=120_000)
    assert any("classes normal, tumor" in s for s in statuses), statuses
    assert not any("[" in s for s in statuses), statuses
    assert any(f.startswith("step %v / %m — about ") and f.endswith(" left") for f in formats), formats
