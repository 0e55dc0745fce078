"""Train panel: pick a method and its parameters, press Start, watch progress; Stop saves a checkpoint.

The choices are `TrainForm`'s (`_train_form.py`); this module is the run control below them. The engine's
training generator runs in a napari worker thread; its events update the progress bar and the plots in
the GUI thread. Stop asks the worker to quit; once it reports `aborted`, the engine generator is closed
(in the worker thread, so the GUI stays live) and writes `checkpoints/last.pt`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari.qt.threading import create_worker
from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from bigslide.napari._qt import connect_while_alive
from bigslide.napari._time_left import TimeLeft
from bigslide.napari._toasts import saved_in, show_error, show_info
from bigslide.napari._train_form import TrainForm
from bigslide.words import counted

if TYPE_CHECKING:
    from bigslide.napari._session import Session

PLOTTED_METRICS = ("accuracy", "auc", "c_index", "pearson_r")  # classes; survival; regression
GIL_SWITCH_S = 0.001


class TrainWidget(TrainForm):
    run_created = Signal(object)
    """Emitted with the worker of a new run just before it starts (connect here to see every signal)."""

    def build(self, body: QWidget) -> None:
        from bigslide.napari._plot import LinePlot
        from bigslide.napari._session import session_for

        self.session: Session = session_for(self.viewer)
        self.worker: Any = None
        self.run_gen: Any = None
        self.config_path: Path | None = None
        self.run_dir: Path | None = None
        self.last_checkpoint: Path | None = None
        self.stopped = False
        self.time_left = TimeLeft()

        scroll = self.build_form()
        self.start_button = QPushButton("Start")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.start_button.clicked.connect(lambda: self.start())
        self.stop_button.clicked.connect(self.stop)
        self.progress = QProgressBar()
        self.progress.setFormat("step %v / %m")
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.loss_plot = LinePlot("training loss")
        self.metric_plot = LinePlot("metrics per epoch", whole_x=True)

        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.stop_button)
        plots = QHBoxLayout()
        plots.addWidget(self.loss_plot)
        plots.addWidget(self.metric_plot)
        # the choices scroll; Start/Stop, progress, status and plots stay in view below them
        layout = QVBoxLayout(body)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(scroll, stretch=1)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addLayout(plots)

        connect_while_alive(self.session.changed, self, self._on_table_changed)
        self._on_table_changed()
        if self.session.training is not None:  # this panel was closed and opened again during a run
            worker, self.run_dir = self.session.training
            self.config_path = self.run_dir / "config.yaml"
            self._follow(worker)
            self._set_running(True)
            self.progress.setRange(0, 0)
            self.status.setText(f"Training in {self.run_dir} (started before this panel was opened)…")

    def _on_table_changed(self) -> None:
        """The form's slides line, and (while no run is under way) what to do next in the status line."""
        rows = self.session.rows
        self.table_info.setText(self.session.describe() if rows else "none yet (Slides panel)")
        if self.worker is not None:
            return
        if not rows:
            self.status.setText("Open slides or load a slide table in the Slides panel, then press Start.")
        elif self.session.task == "classification":
            unlabelled = sum(1 for r in rows if not r.label.strip())
            self.status.setText(
                f"Label the {counted(unlabelled, 'slide')} without a class in the Slides panel "
                "(Label column), then press Start."
                if unlabelled
                else "Every slide has its class: press Start to train."
            )
        else:
            what = "times and events" if self.session.task == "survival" else "targets"
            self.status.setText(f"The {what} come from {self.session.table_name}: press Start to train.")

    # -- run -----------------------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """What would make this run fail or mean nothing, checked before anything is written."""
        from bigslide.napari._roles import slide_layers
        from bigslide.napari._run import check_before_start

        typed = self.typed_problems()
        if typed:
            return typed
        stated = {
            Path(s.metadata["path"]).resolve(): bool(s.metadata.get("stated_mpp"))
            for s in slide_layers(self.viewer)
        }
        return check_before_start(self.session, stated)

    def start(self) -> Any:
        """Start training in a worker thread; returns the worker, or None when the setup is wrong."""
        from bigslide.errors import BigslideError
        from bigslide.napari._gc import settle_imports
        from bigslide.napari._run import drive

        if self.worker is not None or self.session.training is not None:
            return None
        problems = self.problems()
        if not problems:
            try:
                config = self.write_config()
                self.config_path = Path(config.run.out_dir) / "config.yaml"
            except (BigslideError, OSError) as err:
                problems = [str(err)]
        if problems:
            text = "Not started: " + "; ".join(problems) + "."
            self.status.setText(text)
            show_error(text)
            self._show_first_refused()
            return None
        _limit_torch_threads()
        settle_imports()
        self.run_gen = self.session.train(config)  # its decode workers start on the run's thread
        self.stopped = False
        self.last_checkpoint = None
        worker = create_worker(drive, self.run_gen, _start_thread=False, _ignore_errors=True)
        # closing runs in the worker thread (direct connection), so saving never freezes the GUI; not a
        # slot of the panel's, so a stop still saves once the panel is closed (napari quits its workers)
        worker.aborted.connect(partial(_close_run, self.run_gen), Qt.ConnectionType.DirectConnection)
        assert self.run_dir is not None  # made by write_config
        self.session.training = (worker, self.run_dir)
        worker.finished.connect(partial(_forget_run, self.session, worker))
        self._follow(worker)
        self.loss_plot.clear("plotted from the first step on")
        self.metric_plot.clear("plotted after each epoch's validation")
        self.progress.setRange(0, 0)
        self.progress.setFormat("step %v / %m")
        self.time_left = TimeLeft()
        self._set_running(True)
        self.status.setText(f"Starting {self.method_box.currentText()} in {self.run_dir}…")
        self.run_created.emit(worker)
        worker.start()
        return worker

    def _follow(self, worker: Any) -> None:
        """Show `worker`'s run in this panel: its events, its end; Stop stops it."""
        self.left_out: list[str] = []  # slides the run left out (data.skip_bad_slides), named at its end
        worker.yielded.connect(self._on_event)
        worker.returned.connect(self._on_returned)
        worker.errored.connect(self._on_error)
        worker.finished.connect(self._on_finished)
        self.worker = worker

    def stop(self) -> None:
        if self.worker is not None:
            self.stopped = True
            self.status.setText("Stopping after the current step; saving a checkpoint…")
            self.stop_button.setEnabled(False)
            self.worker.quit()

    def _on_event(self, event: Any) -> None:
        kind = type(event).__name__
        if kind == "Progress":
            self.progress.setRange(0, max(event.total, 1))
            self.progress.setValue(event.step)
            left = self.time_left.update(event.step, event.total, time.monotonic())
            self.progress.setFormat(f"step %v / %m{f' — {left}' if left else ''}")
        elif kind == "Loss":
            self.loss_plot.add_point("loss", event.step, event.value)
        elif kind == "Metrics":
            from bigslide.engine.metric_words import why_missing  # loaded: a run is under way

            # the test split is scored once, after the last epoch: drawn at that epoch
            x = event.epoch + 1 if event.split != "test" else (self.metric_plot.last_x() or event.epoch)
            for key in PLOTTED_METRICS:
                if key in event.values:
                    name = f"{event.split} {key}"
                    if math.isfinite(event.values[key]):
                        self.metric_plot.add_point(name, x, event.values[key])
                    else:
                        self.metric_plot.note(name, f"not shown: {why_missing(key, event.split)}")
            shown = ", ".join(
                f"{k} {v:.3f}" for k, v in event.values.items() if k in PLOTTED_METRICS and math.isfinite(v)
            )
            when = "test split" if event.split == "test" else f"epoch {event.epoch + 1} {event.split}"
            self.status.setText(f"{when}: {shown}")
        elif kind == "CheckpointSaved":
            self.last_checkpoint = Path(event.path)
            self.session.checkpoint_saved.emit(self.last_checkpoint)
        elif kind == "Message":
            self.status.setText(event.text)
            self.left_out.extend(Path(path).name for path in event.left_out)

    def _on_returned(self, result: Any) -> None:
        self.last_checkpoint = getattr(result, "checkpoint", None) or self.last_checkpoint
        if self.last_checkpoint is not None:
            self.session.run_finished.emit(self.last_checkpoint)
        left_out = (
            f" Left out, unreadable (data.skip_bad_slides): {', '.join(dict.fromkeys(self.left_out))}."
            if self.left_out
            else ""
        )
        self.status.setText(f"Finished. Checkpoint: {self.last_checkpoint}.{left_out}")
        show_info(f"Training finished; {saved_in(self.last_checkpoint)}.{left_out}")

    def _on_error(self, err: Exception) -> None:
        from bigslide.napari._run import in_panel_words

        text = in_panel_words(f"Training failed: {err}")
        show_error(text)
        self.status.setText(text)

    def _on_finished(self) -> None:
        if self.stopped and self.config_path is not None:
            from bigslide.napari._run import stopped_status

            text, checkpoint = stopped_status(self.config_path.parent)
            self.last_checkpoint = checkpoint or self.last_checkpoint
            self.status.setText(text)
        self.worker = None
        self.run_gen = None
        self._set_running(False)
        self.progress.setFormat("step %v / %m")
        for plot in (self.loss_plot, self.metric_plot):
            plot.set_placeholder("no data from that run — press Start")
        if self.progress.maximum() == 0:
            self.progress.setRange(0, 1)

    def _set_running(self, running: bool) -> None:
        self.start_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        for widget in (self.method_box, self.params_box, self.backbone, self.epochs, self.lr, self.device):
            widget.setEnabled(not running)


def _close_run(run: Any) -> None:
    run.close()  # the engine saves checkpoints/last.pt on close


def _forget_run(session: Session, worker: Any) -> None:
    if session.training is not None and session.training[0] is worker:
        session.training = None


def _limit_torch_threads() -> None:
    """Keep the viewer responsive while training: leave one core to the GUI thread, and have Python hand
    the GIL over every millisecond (not every 5), so the GUI thread never queues behind the run's."""
    import torch

    cores = os.cpu_count() or 1
    if cores > 1 and torch.get_num_threads() >= cores:
        torch.set_num_threads(cores - 1)
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
