"""A survival study in the panels: the Train panel says what the table's columns imply, the run trains
that task, and the Results panel shows the run's Kaplan-Meier plot of its test split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qtpy.QtCore import Qt

from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.config import TrainConfig
from bigslide.synthetic.study import make_study_set
from tests.gui.test_train import start


@pytest.fixture(scope="module")
def survival_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_study_set(tmp_path_factory.mktemp("survival"), "survival", n=12, size=(512, 512), seed=2)


def test_a_survival_table_trains_survival_and_shows_kaplan_meier(
    viewer: Any, dock: Any, qtbot: Any, survival_set: Path, tmp_path: Path
) -> None:
    slides = dock("Slides")
    slides.load_csv(survival_set)
    slides.tile_size.setValue(32)
    # the table shows what the task learns from, editable; no Label column to type classes into
    header = [slides.table.horizontalHeaderItem(i).text() for i in range(slides.table.columnCount())]
    assert header[:4] == ["Slide", "Time", "Event", "Split"]
    assert "Label" not in header
    assert slides.table.item(0, 1).text() == f"{slides.session.rows[0].time:g}"
    assert slides.table.item(0, 1).flags() & Qt.ItemFlag.ItemIsEditable
    assert not slides.table.item(0, 0).flags() & Qt.ItemFlag.ItemIsEditable
    slides.table.item(0, 2).setText("2")  # typed into the Event cell: refused, kept, said why
    assert slides.session.rows[0].event in (0, 1)
    assert "event must be at most 1" in slides.status.text()
    assert slides.table.cellWidget(0, 3) is None  # no widget drawn over the cells
    widget = dock("Train")
    assert "Label" not in widget.status.text()
    assert "times and events come from" in widget.status.text()
    assert "columns slide, time, event, split, oracle" in widget.table_info.text()
    assert "task: survival (time to event, censored)" in widget.table_info.text()
    assert widget.table_info.text().startswith("12 slides;")
    results = dock("Results")
    assert results.run_plot.isHidden()

    widget.set_method("abmil_acc", hidden=32, attention_dim=16, chunk_size=4)
    widget.data_form.set_values({"bag_size": 8, "batch_size": 1, "augment": False})
    widget.backbone.setCurrentText("test_resnet")
    widget.epochs.setValue(1)
    widget.device.setCurrentText("cpu")
    widget.out_dir.setText(str(tmp_path / "runs"))
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=120_000)
    assert record.fired == ["returned", "finished"], record.fired

    config = TrainConfig.from_yaml(widget.run_dir / "config.yaml")
    assert config.data.task == "survival"
    assert "time,event" in Path(config.data.csv).read_text().splitlines()[0]
    assert "c_index" in widget.status.text() or "Finished" in widget.status.text()
    assert set(widget.metric_plot.series) >= {"val c_index"}
    # the finished run's checkpoint is offered in Results, with its test split's Kaplan-Meier plot
    assert Path(results.checkpoint.text()) == widget.run_dir / "checkpoints" / "last.pt"
    assert (widget.run_dir / "km.png").is_file()
    assert not results.run_plot.isHidden()
    assert results.run_plot.pixmap().width() > 200

    # a slide's risk is read against the run's validation cases: its percentile and risk group
    [slide] = viewer.open(slides.session.rows[0].path, plugin="bigslide")
    results.slide_box.setCurrentText(slide.name)
    results.device.setCurrentText("cpu")
    assert results.run() is not None
    qtbot.waitUntil(lambda: results.worker is None and results.run_button.isEnabled(), timeout=60_000)
    reference = load_checkpoint(results.checkpoint.text())["risk_reference"]
    risks = np.asarray(reference["risks"])
    assert reference["split"] == "validation"
    assert len(risks) == sum(1 for r in slides.session.rows if r.split == "val") >= 2
    risk = results.prediction.risk
    share = f"{np.mean(risks < risk):.0%}"
    assert f"higher than {share} of the {len(risks)} validation cases' risks" in results.result.text()
    assert ("high-risk group" if risk > np.median(risks) else "low-risk group") in results.result.text()


def test_a_table_without_what_the_task_needs_is_named_before_start(dock: Any, survival_set: Path) -> None:
    slides = dock("Slides")
    slides.load_csv(survival_set)
    session = slides.session
    session.rows[3].time = None
    widget = dock("Train")
    problems = widget.problems()
    assert len(problems) == 1
    assert problems[0].startswith(
        f"slide(s) without time and event for survival: {session.rows[3].path.name}"
    )


def test_stain_settings_from_the_train_panel_reach_the_run(
    dock: Any, survival_set: Path, tmp_path: Path
) -> None:
    dock("Slides").load_csv(survival_set)
    widget = dock("Train")
    widget.data_form.set_values(
        {"stain_augment": True, "stain_augment_strength": 1.5, "stain_normalise": "macenko"}
    )
    widget.out_dir.setText(str(tmp_path / "runs"))
    config = widget.write_config()
    saved = TrainConfig.from_yaml(widget.run_dir / "config.yaml")
    for c in (config, saved):
        assert (c.data.stain_augment, c.data.stain_augment_strength, c.data.stain_normalise) == (
            True,
            1.5,
            "macenko",
        )
