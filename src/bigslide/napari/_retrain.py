"""Teach by annotation, the training half: "Retrain with annotations" fine-tunes the Results panel's chosen
checkpoint on the training set with its saved annotations, in a new run folder the CLI can replay
(`bigslide train <folder>/config.yaml`), while the Results panel follows the chosen slide's map.

The chosen checkpoint's map of the slide is drawn first on a copy of the slide just left of it ("before
retraining", the slides on its left making room), the pair filling the canvas; the slide itself then shows
the map of each new checkpoint as the run saves it, and the full map once the run ends: before and after,
side by side. When the run ends, the panel says what it changed (`bigslide.engine.retrain_report`): on
every annotated slide the share of the attention inside the lesion and the Not-lesion outlines, and the
validation figures of the starting and the retrained weights on the same validation slides. "Close the
comparison" removes the copy and its captions in one click.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from napari.qt.threading import create_worker
from qtpy.QtCore import Qt
from qtpy.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
)

from bigslide.napari._compare import (
    COMPARISON,
    beside_steps,
    caption,
    frame,
    give_back_room_steps,
    in_turns,
    removal_steps,
)
from bigslide.napari._layers import is_empty_heatmap
from bigslide.napari._number import NumberField
from bigslide.napari._retrain_run import BEFORE, Retrained, retrain_run
from bigslide.napari._roles import layers_with_role
from bigslide.napari._toasts import saved_in, show_error, show_info

if TYPE_CHECKING:
    import napari
    from qtpy.QtWidgets import QComboBox

    from bigslide.engine.config import TrainConfig
    from bigslide.napari._session import Session


class ResultsPanel(Protocol):
    """What retraining uses of the Results panel: its chosen checkpoint, slide, device and display."""

    viewer: napari.Viewer
    session: Session
    device: QComboBox
    follow: QCheckBox
    normalisation: QComboBox
    colormap: QComboBox

    def slide_layer(self) -> Any: ...

    def chosen_checkpoint(self) -> Path: ...

    def checkpoint_problem(self) -> str | None: ...

    def map_ahead(self, slide: Any, prediction: Any, key: str) -> None: ...


class RetrainBox(QGroupBox):
    """Epochs, the annotations' weight and the button that starts (and stops) a fine-tune run."""

    def __init__(self, panel: ResultsPanel) -> None:
        super().__init__("Retrain with annotations")
        self.panel = panel
        self.worker: Any = None
        self.run_gen: Any = None
        self.run_dir: Path | None = None
        self.last_checkpoint: Path | None = None
        self.stopped = False
        self.before_drawn = threading.Event()  # set: the fine-tune may start (see `retrain_run`)
        self.epochs = NumberField(
            int, 5, name="retraining epochs", minimum=1, maximum=10_000, tip="Epochs of the fine-tune run"
        )
        self.weight = NumberField(
            float,
            1.0,
            name="weight of annotated tiles",
            minimum=0,
            tip="Weight of the loss on annotated tiles beside the slide loss (data.instance_weight)",
        )
        self.anew = QCheckBox("train anew (for many outlines)")  # the rest in its tip: the panel stays narrow
        self.anew.setToolTip(
            "Trains the checkpoint's model from its starting weights instead of continuing from the "
            "checkpoint, the annotations taught from the first epoch: slower (as many epochs as the first "
            "run). With outlines of many lesions it teaches far more than continuing; with a few answered "
            "places it may leave the model worse than the first run (see the user guide)"
        )
        self.anew.toggled.connect(self._on_anew)
        self.button = QPushButton("Retrain with annotations")
        self.button.setToolTip(
            "Continues training the chosen checkpoint (or, anew, its model from the start) on the "
            "training set, learning from the saved annotations, in a new run folder; the chosen slide's "
            "map follows the run"
        )
        self.button.clicked.connect(lambda: self.stop() if self.worker is not None else self.start())
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.status = QLabel("Save annotations, then retrain the chosen checkpoint with them.")
        self.status.setWordWrap(True)
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.close_comparison = QPushButton("Close the comparison")
        self.close_comparison.setToolTip("Removes the 'before retraining' copy of the slide and the captions")
        self.close_comparison.clicked.connect(self.remove_comparison)
        self.close_comparison.setVisible(False)
        form = QFormLayout()
        form.addRow("epochs", self.epochs)
        form.addRow("weight of annotated tiles", self.weight)
        rows = QVBoxLayout(self)
        rows.addLayout(form)
        rows.addWidget(self.anew)
        rows.addWidget(self.button)
        rows.addWidget(self.progress)
        rows.addWidget(self.status)
        rows.addWidget(self.summary)
        rows.addWidget(self.close_comparison)

    # -- starting ----------------------------------------------------------------------------------
    def write_folder(self) -> TrainConfig:
        """The fine-tune run folder of the chosen checkpoint, beside the checkpoint's own run folder."""
        from bigslide.engine.finetune import write_finetune_folder
        from bigslide.napari._regions import write_run_regions
        from bigslide.napari._run import new_run_folder

        checkpoint = self.panel.chosen_checkpoint()
        session = self.panel.session
        session.table()  # a slide without a label fails here, before anything is written
        self.run_dir = new_run_folder(checkpoint.resolve().parent.parent.parent, "retrained")
        write_run_regions(self.panel.viewer, session, self.run_dir / "regions")  # rows now point there
        epochs, weight = self.epochs.value(), self.weight.value()
        assert isinstance(epochs, int)
        assert isinstance(weight, float | int)
        return write_finetune_folder(
            checkpoint,
            self.run_dir,
            session.table(),
            epochs=epochs,
            instance_weight=float(weight),
            anew=self.anew.isChecked(),
        )

    def _on_anew(self, anew: bool) -> None:
        """Anew, the run takes as many epochs as the checkpoint's own run, read from the run folder's
        `config.yaml` (loading the checkpoint itself would hold the viewer up)."""
        if not anew:
            return
        import yaml

        checkpoint = self.panel.chosen_checkpoint()
        try:
            config = yaml.safe_load((checkpoint.parent.parent / "config.yaml").read_text())
            epochs = int(config["optim"]["epochs"])
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
            return  # no run folder beside the checkpoint: the epochs typed stay
        self.epochs.setValue(epochs)

    def problems(self) -> list[str]:
        slide = self.panel.slide_layer()
        typed = [text for text in (self.epochs.refusal(), self.weight.refusal()) if text]
        if typed:
            return typed
        if slide is None:
            return ["open a slide and choose it above: its map is followed and compared"]
        problem = self.panel.checkpoint_problem()
        if problem is not None:
            return [problem]
        if not any(r.annotations for r in self.panel.session.rows):
            return ["no slide has saved annotations: draw some (Draw) and press Save"]
        return []

    def start(self) -> Any:
        """Write the run folder and start the fine-tune in a worker thread; returns the worker (or None,
        with the reason in the status line)."""
        from bigslide.errors import BigslideError

        problems = self.problems()
        config = None
        if not problems:
            try:
                config = self.write_folder()
            except (BigslideError, OSError) as err:
                problems = [str(err)]
        if problems or config is None:
            text = "Not started: " + "; ".join(problems) + "."
            self.status.setText(text)
            show_error(text)
            return None
        panel = self.panel
        slide = panel.slide_layer()
        checkpoint = panel.chosen_checkpoint()
        row = panel.session.row(slide.metadata["path"])
        panel.follow.setChecked(True)
        self.last_checkpoint = None
        self.stopped = False
        self.summary.setText("")
        table = panel.session.table()
        self.before_drawn = threading.Event()
        self.run_gen = retrain_run(
            checkpoint,
            slide.metadata["path"],
            config,
            table.like([e for e in table.entries if e.annotations is not None]),
            before_drawn=self.before_drawn,
            regions=row.regions if row is not None else None,
            device=panel.device.currentText(),
            slide_mpp=panel.session.slide_mpp,
            session=panel.session,
        )
        from bigslide.napari._run import drive

        worker = create_worker(drive, self.run_gen, _start_thread=False, _ignore_errors=True)
        worker.yielded.connect(lambda event: self._on_event(event, slide))
        worker.aborted.connect(self._close_run, Qt.ConnectionType.DirectConnection)
        worker.returned.connect(self._on_returned)
        worker.errored.connect(self._on_error)
        worker.finished.connect(self._on_finished)
        self.worker = worker
        self.button.setText("Stop retraining")
        self.progress.setRange(0, 0)
        self.status.setText(
            f"Drawing {checkpoint.name}'s map of {slide.name}, then retraining in {self.run_dir}…"
        )
        worker.start()
        return worker

    def stop(self) -> None:
        self.before_drawn.set()
        if self.worker is not None:
            self.stopped = True
            self.status.setText("Stopping after the current step; saving a checkpoint…")
            self.worker.quit()

    def _close_run(self) -> None:
        if self.run_gen is not None:
            self.run_gen.close()  # the engine saves checkpoints/last.pt on close

    # -- the run's events ------------------------------------------------------------------------------
    def _on_event(self, event: Any, slide: Any) -> None:
        kind = type(event).__name__
        if kind == "tuple" and event[0] == BEFORE:
            self.show_before(event[1], slide)
        elif kind == "Progress":
            self.progress.setRange(0, max(event.total, 1))
            self.progress.setValue(event.step)
        elif kind == "Metrics" and event.split == "val":
            from bigslide.engine.metric_words import SHOWN

            shown = ", ".join(
                f"{SHOWN[k]} {v:.3f}" for k, v in event.values.items() if k in SHOWN and math.isfinite(v)
            )
            self.status.setText(f"Retraining, epoch {event.epoch + 1} validation: {shown}")
        elif kind == "CheckpointSaved":
            self.last_checkpoint = Path(event.path)
            self.panel.session.checkpoint_saved.emit(self.last_checkpoint)  # the Results panel follows
        elif kind == "Message":
            self.status.setText(event.text)

    def show_before(self, prediction: Any, slide: Any) -> None:
        """The chosen checkpoint's map on a copy of the slide, just left of it; the slide's own map
        is the run's from now on."""
        viewer = self.panel.viewer
        if slide not in viewer.layers or "attention" not in prediction.grids:
            self.before_drawn.set()
            return
        beside = beside_steps(
            viewer,
            slide,
            prediction.grids["attention"],
            BEFORE,
            normalisation=self.panel.normalisation.currentText(),  # type: ignore[arg-type]
            colormap=self.panel.colormap.currentText(),
        )

        def steps() -> Iterator[None]:
            try:
                yield from beside
                yield
                if not layers_with_role(viewer, COMPARISON):
                    return  # the comparison was closed (or never made) meanwhile
                if slide in viewer.layers:
                    path = slide.metadata.get("path")
                    caption(viewer, slide, "after retraining", path)
                    frame(viewer, [slide, *layers_with_role(viewer, COMPARISON, path)])
                self.close_comparison.setVisible(True)
                yield
                if slide in viewer.layers:  # the retrained maps are drawn into it: no layer made at the end
                    self.panel.map_ahead(slide, prediction, "attention")
            finally:
                self.before_drawn.set()  # the fine-tune goes on

        in_turns(steps())  # four layers: 0.5-0.8 s made in one turn

    def remove_comparison(self) -> None:
        self.close_comparison.setVisible(False)
        viewer = self.panel.viewer
        in_turns(itertools.chain(give_back_room_steps(viewer), removal_steps(viewer, COMPARISON)))

    def _on_returned(self, retrained: Retrained) -> None:
        checkpoint = retrained.result.checkpoint or self.last_checkpoint
        if checkpoint is not None:
            self.panel.session.run_finished.emit(Path(checkpoint))  # the Results panel draws the full map
        self.status.setText(f"Retrained: {checkpoint}. Replay: bigslide train {self.run_dir}/config.yaml")
        self.summary.setText(
            "\n".join(retrained.summary) or "No annotated slide has an attention map to compare."
        )
        show_info(f"Retraining finished; {saved_in(checkpoint)}")

    def _on_error(self, err: Exception) -> None:
        from bigslide.napari._run import in_panel_words

        text = in_panel_words(f"Retraining failed: {err}")
        self.status.setText(text)
        show_error(text)
        self._drop_maps_ahead()

    def _drop_maps_ahead(self) -> None:
        viewer = self.panel.viewer
        for layer in [layer for layer in viewer.layers if is_empty_heatmap(layer)]:
            viewer.layers.remove(layer)  # made ahead for maps that will not come

    def _on_finished(self) -> None:
        if self.stopped and self.run_dir is not None:
            from bigslide.napari._run import stopped_status

            text, checkpoint = stopped_status(self.run_dir)
            self.last_checkpoint = checkpoint or self.last_checkpoint
            self.status.setText(text)
            self._drop_maps_ahead()
        self.worker = None
        self.run_gen = None
        self.button.setText("Retrain with annotations")
        if self.progress.maximum() == 0:
            self.progress.setRange(0, 1)
