"""What a pathologist meets before and around Start: forms that refuse impossible values where they are
typed, only the chosen method's and head's parameters, checks in words naming the field, new run folders,
status lines that end in an outcome, heatmap legends and readable plot axes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from bigslide.explain.heatmap import ScoreGrid
from bigslide.napari._plot import nice_ticks, tick_labels
from tests.gui.test_train import train_panel


def error_texts(notifications: list[Any]) -> list[str]:
    return [str(n.message) for n in notifications if n.severity == "error"]


def test_abmil_form_shows_only_the_chosen_heads_parameters(dock: Any) -> None:
    widget = dock("Train")
    widget.set_method("abmil_acc")
    form = widget.params_form
    shown = set(form.visible_fields())
    assert {"aggregator", "hidden", "attention_dim", "chunk_size", "bn_mode"} <= shown
    assert not shown & {"heads", "pseudo_bags", "distill"}
    form.set_values({"aggregator": "transmil"})
    shown = set(form.visible_fields())
    assert "heads" in shown
    assert not shown & {"attention_dim", "pseudo_bags", "distill"}
    form.set_values({"aggregator": "dtfd"})
    assert {"pseudo_bags", "distill", "attention_dim"} <= set(form.visible_fields())


def test_floats_set_from_code_are_shown_and_saved_as_given(dock: Any, tiny_set: Path, tmp_path: Path) -> None:
    widget = train_panel(dock, tiny_set, tmp_path / "runs", "abmil_acc")
    chunk = widget.params_form.widgets["chunk_size"]
    with pytest.raises(ValueError, match="at least 1"):
        chunk.setValue(0)  # refused from code as when typed, never clamped
    assert chunk.value() == 4
    assert "≥ 1" in chunk.edit.toolTip()

    widget.set_method("patchgd", patch_size=32, latent_dim=16, epsilon=2, encoder_bn="frozen")
    sampling = widget.params_form.widgets["sampling"]
    assert sampling.text() == "0.125"
    sampling.setValue(0.0625)
    assert sampling.text() == "0.0625"
    widget.lr.setValue(0.00003)
    assert widget.lr.value() == 0.00003
    widget.write_config()
    config = yaml.safe_load((widget.run_dir / "config.yaml").read_text())
    assert config["method"]["params"]["sampling"] == 0.0625
    assert config["optim"]["lr"] == 0.00003


def test_checks_before_start_name_the_field(
    viewer: Any, dock: Any, tiny_set: Path, tmp_path: Path, notifications: list[Any], make_slide: Any
) -> None:
    runs = tmp_path / "runs"
    widget = train_panel(dock, tiny_set, runs, "abmil_acc")
    slides = dock("Slides")
    rows = widget.session.rows
    # one class
    original = [(r.label, r.split) for r in rows]
    for row in rows:
        row.label = "tumor"
    assert widget.start() is None
    assert "at least two classes" in widget.status.text()
    assert "Label column" in widget.status.text()
    assert widget.status.text().startswith("Not started: ")
    assert any("at least two classes" in m for m in error_texts(notifications))
    # nothing left for validation
    for row, (label, _split) in zip(rows, original):
        row.label, row.split = label, "train"
    assert widget.start() is None
    assert "no slide is left for validation" in widget.status.text()
    assert "Split" in widget.status.text()
    # a slide whose file states no µm/px, and no fallback typed
    for row, (label, split) in zip(rows, original):
        row.label, row.split = label, split
    unstated = make_slide(np.full((300, 300, 3), 200, np.uint8), flavour="tiff", mpp=None, name="no-size")
    viewer.open(unstated.path, plugin="bigslide")
    slides.set_label(len(rows) - 1, "normal")
    assert widget.start() is None
    assert "no-size.tif" in widget.status.text()
    assert "'slide µm/px if unstated' field" in widget.status.text()
    assert not runs.exists()  # a refused start writes nothing


def test_each_start_gets_a_new_run_folder(dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    widget = train_panel(dock, tiny_set, runs, "abmil_acc")
    folders = []
    for _ in range(2):
        worker = widget.start()
        assert worker is not None
        qtbot.waitUntil(lambda: widget.worker is None, timeout=120_000)
        folders.append(widget.run_dir)
        assert widget.status.text().startswith("Finished.")
    assert folders[0] != folders[1]
    assert all((f / "checkpoints" / "last.pt").is_file() for f in folders)
    assert all(f.parent == runs.resolve() and f.name.startswith("abmil_acc-") for f in folders)


def test_results_status_ends_in_the_outcome(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, notifications: list[Any]
) -> None:
    viewer.open(tiny_set.parent / "slide_000.svs", plugin="bigslide")
    panel = dock("Results")
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    panel.checkpoint.setText(str(broken))
    panel.device.setCurrentText("cpu")
    assert panel.run() is not None
    qtbot.waitUntil(panel.run_button.isEnabled, timeout=60_000)
    assert panel.result.text().startswith("Inference failed on slide_000: ")
    assert "broken.pt" in panel.result.text()
    panel.checkpoint.setText(str(tmp_path / "missing.pt"))
    assert panel.run() is None
    assert f"No checkpoint at '{tmp_path / 'missing.pt'}'" in panel.result.text()
    panel.checkpoint.setText("")
    assert panel.run() is None
    assert panel.result.text().startswith("No checkpoint chosen: train a model"), panel.result.text()


def test_count_tiles_error_is_the_last_word(
    viewer: Any, dock: Any, qtbot: Any, make_slide: Any, notifications: list[Any]
) -> None:
    unstated = make_slide(np.full((300, 300, 3), 200, np.uint8), flavour="tiff", mpp=None, name="no-size-2")
    panel = dock("Slides")
    viewer.open(unstated.path, plugin="bigslide")
    panel.count_tiles()
    qtbot.waitUntil(panel.count_button.isEnabled, timeout=30_000)
    assert panel.status.text().startswith("Counting tiles failed on 1 slide: no-size-2.tif: ")
    assert "'slide µm/px if unstated' field" in panel.status.text()
    assert "tiles in" not in panel.status.text()


def test_newest_heatmap_shown_with_its_legend(viewer: Any, dock: Any, qtbot: Any) -> None:
    slide, _ = viewer.open_sample("bigslide", "slide")
    panel = dock("Results")
    rng = np.random.default_rng(0)
    first = panel.add_grid(ScoreGrid(rng.random((8, 8)), 64.0), slide, "sample slide first")
    second = panel.add_grid(ScoreGrid(rng.random((8, 8)), 64.0), slide, "sample slide second")
    assert second.visible
    assert not first.visible
    legend = viewer.canvas.overlays.text
    qtbot.waitUntil(lambda: legend.visible)  # drawn just after the map, in its own event-loop turn
    assert "sample slide second" in legend.text
    assert "rank in the slide" in legend.text
    bar = panel.colour_bar
    assert "rank in the slide" in bar.caption
    assert (bar.low_text, bar.high_text) == ("0", "1")
    assert len(bar.colours) == 32
    assert bar.colours[0] != bar.colours[-1]
    panel.heatmap_box.setCurrentText(first.name)
    assert first.visible
    assert not second.visible
    assert "sample slide first" in legend.text
    panel.normalisation.setCurrentText("raw")
    assert "as they are" in legend.text
    assert "as they are" in bar.caption
    low, high = np.nanmin(first.metadata["grid"].scores), np.nanmax(first.metadata["grid"].scores)
    assert float(bar.low_text) == pytest.approx(low, abs=0.06)
    assert float(bar.high_text) == pytest.approx(high, abs=0.06)
    index = panel.heatmap_box.findText(first.name)
    assert panel.heatmap_box.itemData(index, 3) == first.name  # full name on hover (ToolTipRole)


@pytest.mark.parametrize(
    ("low", "high"), [(0.6985, 0.6995), (0.0, 1.0), (0.2, 3.7), (1e-4, 3e-4), (100.0, 2500.0)]
)
def test_plot_ticks_cover_the_data_and_read_differently(low: float, high: float) -> None:
    ticks = nice_ticks(low, high)
    assert ticks[0] <= low
    assert ticks[-1] >= high - 1e-12
    assert 2 <= len(ticks) <= 6
    labels = tick_labels(ticks)
    assert len(set(labels)) == len(labels)


def test_the_first_heatmap_gets_its_colour_bar_with_every_end_label_in_view(
    viewer: Any, dock: Any, qtbot: Any
) -> None:
    slide, _ = viewer.open_sample("bigslide", "slide")
    panel = dock("Results")
    panel.normalisation.setCurrentText("raw")
    scores = np.linspace(1.2e-4, 4.1e-4, 64).reshape(8, 8)  # raw attention of a large bag
    layer = panel.add_grid(ScoreGrid(scores, 64.0), slide, "sample slide attention")
    bar = panel.colour_bar
    assert len(bar.colours) == 32  # drawn with the first map, before any control is touched
    assert "as they are" in bar.caption
    assert (bar.low_text, bar.high_text) == ("0.00012", "0.00041")
    image = bar.grab().toImage()  # both end labels painted inside the widget: no text on its edges
    band = range(2, 20)
    for x in (0, 1, image.width() - 2, image.width() - 1):
        assert all(image.pixelColor(x, y).lightness() < 150 for y in band), x
    legend = viewer.canvas.overlays.text
    qtbot.waitUntil(lambda: legend.visible)
    assert legend.position == "top_left"  # napari's notifications rise at the bottom right
    assert layer.name in legend.text


def test_a_label_or_split_typed_against_its_case_refuses_start_naming_the_slides(
    dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, notifications: list[Any]
) -> None:
    """Slides of one patient (the table's case column) must agree: a label or split typed over one of them
    refuses Start, naming the slides, instead of a run that stops a few seconds in on its own copy's row."""
    rows = [line.split(",") for line in tiny_set.read_text().splitlines()[1:]]
    cased = tmp_path / "cases.csv"
    lines = ["slide,label,split,case"]
    lines += [f"{tiny_set.parent / r[0]},{r[1]},,{r[1]}-patient" for r in rows]
    cased.write_text("\n".join(lines) + "\n")
    widget = train_panel(dock, cased, tmp_path / "runs", "abmil_acc")
    slides = dock("Slides")
    runs_before = list((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else []
    other = "normal" if slides.session.rows[0].label == "tumor" else "tumor"
    slides.set_label(0, other)  # typed over one slide of its case
    assert slides.session.rows[0].label == other
    assert widget.start() is None
    status = widget.status.text()
    assert status.startswith("Not started:"), status
    assert "case '" in status, status
    assert slides.session.rows[0].path.name in status, status
    assert "Slides panel" in status
    assert list((tmp_path / "runs").glob("*")) == runs_before  # no run folder left behind
