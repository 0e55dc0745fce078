"""Training from the Train panel: every registered method runs to the end, stops on request with a
checkpoint, reports errors as notifications, and keeps the viewer responsive."""

from __future__ import annotations

import itertools
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from qtpy.QtCore import Qt, QTimer

from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.config import TrainConfig
from bigslide.methods.base import available_methods
from bigslide.napari._run import SKIP_BAD_FIELD
from tests.toy_method import toy_method

__all__ = ["toy_method"]  # the fixture

# the smallest settings each method accepts: 32 px tiles, 8-tile bags, 64 px images
TINY_PARAMS: dict[str, dict[str, Any]] = {
    "patchgd": {"patch_size": 32, "latent_dim": 16, "epsilon": 2, "encoder_bn": "frozen"},
    "abmil_acc": {"hidden": 32, "attention_dim": 16, "chunk_size": 4},
    "full_bag": {"hidden": 32, "attention_dim": 16},
    "frozen_abmil": {"hidden": 32, "attention_dim": 16},
    "biglayer_mil": {"hidden": 32, "attention_dim": 16, "budget_mb": 4.0},
    "biglayer_image": {"budget_mb": 4.0},
}


class Recorder:
    """Which worker signals fired, and the events it yielded."""

    def __init__(self, worker: Any) -> None:
        self.fired: list[str] = []
        self.events: list[Any] = []
        for name in ("returned", "aborted", "errored", "finished"):
            getattr(worker, name).connect(lambda *_a, n=name: self.fired.append(n))
        worker.yielded.connect(self.events.append)


def train_panel(dock: Any, tiny_set: Path, out: Path, method: str) -> Any:
    slides = dock("Slides")
    slides.load_csv(tiny_set)
    slides.tile_size.setValue(32)
    widget = dock("Train")
    widget.set_method(method, **TINY_PARAMS.get(method, {}))
    widget.data_form.set_values({"bag_size": 8, "image_size": 64, "batch_size": 1, "augment": False})
    widget.backbone.setCurrentText("resnet18")
    widget.epochs.setValue(1)
    widget.max_steps.setValue(2)
    widget.device.setCurrentText("cpu")
    widget.out_dir.setText(str(out))
    return widget


def start(widget: Any) -> Recorder:
    records: list[Recorder] = []
    widget.run_created.connect(lambda worker: records.append(Recorder(worker)))
    assert widget.start() is not None
    widget.run_created.disconnect()
    return records[0]


def training(dock: Any, qtbot: Any, tiny_set: Path, out: Path, method: str) -> tuple[Any, Recorder]:
    """The Train panel and the record of a long run it started, once the run has made its first step."""
    widget = train_panel(dock, tiny_set, out, method)
    widget.max_steps.setValue(0)
    widget.epochs.setValue(50)
    record = start(widget)
    qtbot.waitUntil(lambda: any(type(e).__name__ == "Progress" for e in record.events), timeout=120_000)
    return widget, record


# a gap this long means work on the viewer's thread (a step or an inference there takes ≥ 0.6 s); shorter
# gaps come from the GIL and a loaded machine (up to ~0.13 s seen on 2 busy cores)
FROZEN_MS = 250


class LoopGaps:
    """The longest the GUI thread went without running its event loop, from a 10 ms timer's ticks."""

    def __init__(self) -> None:
        self.ticks: list[float] = []
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(lambda: self.ticks.append(time.perf_counter()))

    def __enter__(self) -> LoopGaps:
        self.ticks.append(time.perf_counter())
        self.timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.timer.stop()

    @property
    def max_ms(self) -> float:
        return max(b - a for a, b in itertools.pairwise(self.ticks)) * 1000

    def split(self, moment: float) -> tuple[float, float]:
        """Longest gap (ms) that ended before `moment` (a perf_counter time), and the longest after it."""
        gaps = [(b - a, b) for a, b in itertools.pairwise(self.ticks)]
        before = [g for g, b in gaps if b < moment]
        after = [g for g, b in gaps if b >= moment]
        return max(before, default=0.0) * 1000, max(after, default=0.0) * 1000

    def worst(self, n: int = 3) -> str:
        gaps = sorted(((b - a, a - self.ticks[0]) for a, b in itertools.pairwise(self.ticks)), reverse=True)
        return ", ".join(f"{g * 1000:.0f} ms at {t:.2f} s" for g, t in gaps[:n])


@pytest.mark.parametrize("method", available_methods())
def test_run_to_completion(dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, method: str) -> None:
    widget = train_panel(dock, tiny_set, tmp_path / "run", method)
    with LoopGaps() as gaps:
        record = start(widget)
        qtbot.waitUntil(lambda: "finished" in record.fired, timeout=120_000)
    print(f"{method}: longest event-loop gaps while training: {gaps.worst()}")
    assert gaps.max_ms < FROZEN_MS, f"{method} froze the viewer for {gaps.max_ms:.0f} ms"
    assert record.fired == ["returned", "finished"], record.fired
    checkpoint = widget.run_dir / "checkpoints" / "last.pt"
    assert checkpoint.is_file()
    assert widget.last_checkpoint == checkpoint
    steps = [e.step for e in record.events if type(e).__name__ == "Progress"]
    assert steps == [1, 2]
    assert widget.progress.value() == widget.progress.maximum() == 2
    assert len(widget.loss_plot.series["loss"]) == 2
    # the run folder replays from the CLI with the same choices
    config = TrainConfig.from_yaml(widget.run_dir / "config.yaml")
    assert config.method.name == method
    assert config.method.params == {**widget.params_form.values()}
    assert config.data.tile_size == 32
    assert config.optim.max_steps == 2
    assert Path(config.data.csv).read_text().count(".svs") == 4
    assert widget.start_button.isEnabled()
    assert not widget.stop_button.isEnabled()


@pytest.mark.parametrize("method", available_methods())
def test_stop_saves_checkpoint(dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, method: str) -> None:
    widget, record = training(dock, qtbot, tiny_set, tmp_path / "run", method)
    widget.stop_button.click()
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=60_000)
    assert record.fired == ["aborted", "finished"], record.fired
    assert (widget.run_dir / "checkpoints" / "last.pt").is_file()
    assert widget.last_checkpoint == widget.run_dir / "checkpoints" / "last.pt"
    assert "Stopped" in widget.status.text()
    assert widget.start_button.isEnabled()


def test_error_reaches_user_and_panel_recovers(
    dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, notifications: list[Any]
) -> None:
    # a slide that disappears after it was listed: the engine fails in the worker thread
    folder = tmp_path / "set"
    shutil.copytree(tiny_set.parent, folder)
    widget = train_panel(dock, folder / "slides.csv", tmp_path / "run", "abmil_acc")
    moved = folder / "slide_000.svs"
    moved.rename(folder / "elsewhere.svs")
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=60_000)
    assert record.fired == ["errored", "finished"]
    errors = [n.message for n in notifications if n.severity == "error"]
    assert any("slide_000.svs" in m for m in errors), errors
    assert widget.start_button.isEnabled()

    # a backbone timm does not know fails in the worker too, naming it
    moved.with_name("elsewhere.svs").rename(moved)
    widget.backbone.setCurrentText("no_such_net")
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=60_000)
    assert record.fired == ["errored", "finished"]
    assert any("no_such_net" in n.message for n in notifications if n.severity == "error")

    # fixed: the same panel trains
    widget.backbone.setCurrentText("resnet18")
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=120_000)
    assert record.fired == ["returned", "finished"]


def test_a_slide_that_will_not_decode_is_named_with_the_box_that_leaves_it_out(
    dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    import tifffile

    folder = tmp_path / "set"
    shutil.copytree(tiny_set.parent, folder)
    hurt = folder / "slide_000.svs"
    with tifffile.TiffFile(hurt) as tif:
        spots = [(o, n) for page in tif.pages for o, n in zip(page.dataoffsets, page.databytecounts)]
    with hurt.open("r+b") as f:  # it opens, but none of its tiles decodes
        for offset, count in spots:
            f.seek(offset + 2)
            f.write(bytes([0xFF, 0xC4, 0x00, 0x01]) * ((count - 4) // 4))
    widget = train_panel(dock, folder / "slides.csv", tmp_path / "run", "abmil_acc")
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=60_000)
    assert record.fired == ["errored", "finished"]
    status = widget.status.text()
    assert "slide_000.svs: cannot decode file tile (row 0, col 0) of level" in status, status
    assert status.endswith(f"{SKIP_BAD_FIELD} to leave such slides out"), status
    box = widget.data_form.widgets["skip_bad_slides"]
    box.click()  # the panel's data settings scroll below the dock's fold
    assert box.isChecked()
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=120_000)
    assert record.fired == ["returned", "finished"], widget.status.text()
    # the run's last words still name the slide it left out (its message passed long before)
    assert widget.status.text().endswith("Left out, unreadable (data.skip_bad_slides): slide_000.svs.")


def test_viewer_stays_responsive(dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path) -> None:
    widget = train_panel(dock, tiny_set, tmp_path / "run", "abmil_acc")
    widget.max_steps.setValue(6)
    ticks: list[float] = []
    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    timer.start()
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=120_000)
    timer.stop()
    assert record.fired == ["returned", "finished"]
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    print(f"timer ticks {len(ticks)}, max gap {max(gaps) * 1000:.1f} ms")
    assert max(gaps) * 1000 < FROZEN_MS  # 116 ms seen on 2 busy cores: under 0.1 s was no margin


def test_a_method_registered_by_a_script_gets_its_form_and_trains(
    toy_method: type, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    widget = train_panel(dock, tiny_set, tmp_path / "run", "toy_tile_mean")
    items = [widget.method_box.itemText(i) for i in range(widget.method_box.count())]
    assert "toy_tile_mean" in items
    assert widget.method_box.currentText() == "toy_tile_mean"
    assert set(widget.params_form.values()) == {"width", "pooling"}
    widget.params_form.set_values({"width": 4})
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=120_000)
    assert record.fired == ["returned", "finished"], record.fired
    config = TrainConfig.from_yaml(widget.run_dir / "config.yaml")
    assert config.method.name == "toy_tile_mean"
    assert config.method.params["width"] == 4


def test_the_metrics_plot_keeps_its_legend_off_the_lines_and_says_what_it_leaves_out(dock: Any) -> None:
    """A 3-epoch run: the x axis reads 1, 2, 3 (the test split, scored after the last epoch, is drawn at 3,
    not at a 4th epoch); the legend lies below the axes; a validation AUC that cannot be computed is named
    with its reason instead of silently missing."""
    from bigslide.engine.events import Metrics
    from bigslide.napari._plot import whole_ticks

    widget = dock("Train")
    plot = widget.metric_plot
    plot.clear()
    for epoch in range(3):
        widget._on_event(Metrics(epoch, "train", {"accuracy": 0.5 + 0.1 * epoch, "auc": 0.6}))
        widget._on_event(Metrics(epoch, "val", {"accuracy": 0.5, "auc": float("nan")}))
    widget._on_event(Metrics(3, "test", {"accuracy": 0.75, "auc": 0.8}))  # the engine's epoch count
    assert [x for x, _ in plot.series["test accuracy"]] == [3.0]
    assert max(x for values in plot.series.values() for x, _ in values) == 3.0
    assert whole_ticks(1.0, 3.0) == [1.0, 2.0, 3.0]
    assert "val auc" not in plot.series
    lines = [text for text, _colour in plot.legend_lines()]
    assert "val auc: not shown: the validation slides are all of one class" in lines
    assert {"train accuracy", "val accuracy", "test accuracy"} <= set(lines)
    assert "nan" not in widget.status.text()
    assert widget.status.text().startswith("test split: ")  # not "epoch 4 test" after a 3-epoch run
    plot.grab()  # drawn: the plot grows a row for each legend line, below the axes
    assert plot.minimumHeight() >= 150 + 15 * len(lines)


def test_the_backbone_starts_from_a_weights_file_typed_in_and_a_missing_one_is_named(
    dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, notifications: list[Any]
) -> None:
    import timm
    import torch
    from qtpy.QtCore import QPoint, Qt

    weights = tmp_path / "encoder.pt"
    torch.manual_seed(5)
    torch.save({"state_dict": timm.create_model("test_resnet", num_classes=0).state_dict()}, weights)
    widget = train_panel(dock, tiny_set, tmp_path / "run", "abmil_acc")
    widget.backbone.lineEdit().clear()
    qtbot.keyClicks(widget.backbone.lineEdit(), "test_resnet")
    qtbot.keyClicks(widget.weights, str(tmp_path / "missing.pt"))
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=60_000)
    assert record.fired == ["errored", "finished"]
    assert any("model.weights" in n.message and "missing.pt" in n.message for n in notifications)

    widget.weights.clear()
    qtbot.keyClicks(widget.weights, str(weights))
    box = widget.pretrained  # clicked on its tick box (the file is used instead of the published weights)
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))
    assert box.isChecked()
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=120_000)
    assert record.fired == ["returned", "finished"]
    config = TrainConfig.from_yaml(widget.run_dir / "config.yaml")
    assert (config.model.backbone, config.model.weights, config.model.pretrained) == (
        "test_resnet",
        str(weights),
        True,
    )


def test_a_train_panel_opened_again_during_a_run_shows_it_and_its_stop_saves_it(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path
) -> None:
    widget, record = training(dock, qtbot, tiny_set, tmp_path / "run", "abmil_acc")
    run_dir = widget.run_dir
    viewer.window.remove_dock_widget(widget)  # the dock's close button
    again = dock("Train")
    assert again is not widget
    assert again.stop_button.isEnabled()
    assert not again.start_button.isEnabled()
    assert str(run_dir) in again.status.text()
    assert again.start() is None  # no second run beside the first
    qtbot.mouseClick(again.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=60_000)
    assert record.fired == ["aborted", "finished"], record.fired
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["position"]["step"] >= 1
    qtbot.waitUntil(lambda: again.start_button.isEnabled(), timeout=10_000)
    assert "Stopped" in again.status.text()


def test_a_timm_model_of_the_hugging_face_cache_is_offered_and_trains_with_its_published_weights(
    dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """A pathology foundation model downloaded once into the Hugging Face cache is in the backbone list,
    picked from it as a person does, and trains offline from its own weights."""
    import timm
    from huggingface_hub import constants
    from qtpy.QtCore import QPoint, Qt

    from bigslide.nn.hub_models import hub_recipe
    from tests.test_encoders import put_in_cache

    cache = tmp_path / "hf" / "hub"
    put_in_cache(
        cache, "lab/tile-encoder", "test_resnet", {}, timm.create_model("test_resnet", num_classes=0)
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_recipe.cache_clear()
    widget = train_panel(dock, tiny_set, tmp_path / "run", "abmil_acc")
    listed = [widget.backbone.itemText(i) for i in range(widget.backbone.count())]
    assert "hf-hub:lab/tile-encoder" in listed
    widget.backbone.setCurrentIndex(listed.index("hf-hub:lab/tile-encoder"))  # picked from the list
    box = widget.pretrained
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))
    record = start(widget)
    qtbot.waitUntil(lambda: "finished" in record.fired, timeout=120_000)
    hub_recipe.cache_clear()
    assert record.fired == ["returned", "finished"]
    config = TrainConfig.from_yaml(widget.run_dir / "config.yaml")
    assert (config.model.backbone, config.model.pretrained) == ("hf-hub:lab/tile-encoder", True)
