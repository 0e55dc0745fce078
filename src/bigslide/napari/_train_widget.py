"""Train panel: pick a method and its parameters, press Start, watch progress; Stop saves a checkpoint.

The engine's training generator runs in a napari worker thread; its events update the progress bar
and the plots in the GUI thread. Stop asks the worker to quit; once it reports `aborted`, the engine
generator is closed (in the worker thread, so the GUI stays live) and writes `checkpoints/last.pt`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari.qt.threading import create_worker
from napari.utils.notifications import show_error, show_info
from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from bigslide.napari._number import NumberField
from bigslide.napari._panel import Panel
from bigslide.napari._qt import combo_box, set_items
from bigslide.napari._time_left import TimeLeft

if TYPE_CHECKING:
    from bigslide.napari._forms import DataclassForm
    from bigslide.napari._session import Session

BACKBONES = ("resnet18", "resnet34", "resnet50", "efficientnet_b0", "mobilenetv3_small_100", "convnext_tiny")
DATA_FIELDS = (
    "bag_size",
    "instance_weight",
    "instance_loss",
    "image_size",
    "batch_size",
    "augment",
    "stain_augment",
    "stain_augment_strength",
    "stain_normalise",
)
KIND_FIELDS = {
    "bag": ("bag_size", "instance_weight", "instance_loss"),
    "image": ("image_size", "batch_size"),
}
KIND_WORDS = {
    "bag": "learns from tiles of each slide, pooled into one prediction per slide",
    "image": "learns from each slide read as one large image",
}
PLOTTED_METRICS = ("accuracy", "auc", "c_index", "pearson_r")  # classes; survival; regression
GIL_SWITCH_S = 0.001
BUNDLED_REFERENCE = "bundled H&E reference"
CHOOSE_FILE = "a slide file…"
SLIDE_FILES = "Slides (*.svs *.tif *.tiff *.ndpi *.dcm)"


class TrainWidget(Panel):
    run_created = Signal(object)
    """Emitted with the worker of a new run just before it starts (connect here to see every signal)."""

    def build(self, body: QWidget) -> None:
        from bigslide.engine.config import DataConfig, OptimConfig
        from bigslide.methods.base import available_methods, get_method
        from bigslide.napari._forms import DataclassForm
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

        self.method_box = QComboBox()
        for index, name in enumerate(available_methods()):
            self.method_box.addItem(get_method(name).title(), name)
            tip = f"{name} in config.yaml and the command line"
            self.method_box.setItemData(index, tip, Qt.ItemDataRole.ToolTipRole)
        self.method_box.setToolTip("Training method; its parameters are listed below")
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.table_info = QLabel()
        self.table_info.setWordWrap(True)
        self.table_info.setToolTip(
            "The slide table's columns set the task: time,event train survival; target, regression; "
            "label, classes. A case column makes each case one bag over its slides."
        )
        self.params_box = QGroupBox("Method parameters")
        self.params_layout = QVBoxLayout(self.params_box)
        self.params_form: DataclassForm | None = None
        self.data_form = DataclassForm(DataConfig, include=DATA_FIELDS)
        self.stain_reference = QComboBox()
        self.stain_reference.setToolTip(
            "The slide whose stain every slide is mapped onto (fitted when training starts and kept "
            "with the model): the bundled H&E reference, an open slide, or a slide file"
        )
        self.stain_reference.activated.connect(self._on_reference_chosen)
        self.data_form.layout_.addRow("stain reference", self.stain_reference)
        normalise = self.data_form.widgets["stain_normalise"]
        assert isinstance(normalise, QComboBox)
        normalise.currentIndexChanged.connect(lambda _i: self._show_reference())

        defaults = OptimConfig()
        self.backbone = combo_box(BACKBONES, editable=True, tip="Any timm model name")
        self.epochs = NumberField(int, defaults.epochs, name="epochs", minimum=1, maximum=100_000)
        self.lr = NumberField(
            float,
            defaults.lr,
            name="learning rate",
            above=0,
            maximum=10,
            tip="Peak learning rate, e.g. 1e-4 or 0.0001 (scientific notation is fine)",
        )
        self.max_steps = NumberField(
            int, 0, name="max steps", minimum=0, tip="Stop after this many steps (0 = no limit: every epoch)"
        )
        self.device = QComboBox()
        self.device.addItems(["auto", "cpu", "cuda"])
        self.device.setToolTip("auto: the GPU when there is one, else the CPU")
        self.out_dir = QLineEdit(str(Path.cwd() / "runs"))
        self.out_dir.setToolTip(
            "Each Start makes a new run folder in here, named by method, date and time (never overwritten): "
            "slide table, regions, config.yaml, checkpoints and metrics"
        )
        browse = QPushButton("…")
        browse.setMaximumWidth(30)
        browse.clicked.connect(self._browse_out_dir)

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

        out_row = QHBoxLayout()
        out_row.addWidget(self.out_dir)
        out_row.addWidget(browse)
        settings = QFormLayout()
        settings.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        settings.addRow("slides", self.table_info)
        settings.addRow("method", self.method_box)
        settings.addRow(self.summary)
        settings.addRow("backbone", self.backbone)
        settings.addRow("epochs", self.epochs)
        settings.addRow("learning rate", self.lr)
        settings.addRow("max steps (0 = no limit)", self.max_steps)
        settings.addRow("device", self.device)
        settings.addRow("runs folder", out_row)
        data_box = QGroupBox("Data")
        QVBoxLayout(data_box).addWidget(self.data_form)
        form = QWidget()
        form_layout = QVBoxLayout(form)
        form_layout.addLayout(settings)
        form_layout.addWidget(self.params_box)
        form_layout.addWidget(data_box)
        form_layout.addStretch()
        scroll = self.form_scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(form)
        scroll.setMinimumHeight(160)
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

        self.method_box.currentIndexChanged.connect(lambda _i: self._on_method_changed(self.method_name()))
        self._on_method_changed(self.method_name())
        self.session.changed.connect(self._on_table_changed)
        self.viewer.layers.events.inserted.connect(lambda _e: self._list_references())
        self.viewer.layers.events.removed.connect(lambda _e: self._list_references())
        self._list_references()
        self._on_table_changed()

    # -- form ----------------------------------------------------------------------------------------
    def method_name(self) -> str:
        """The registry name of the chosen method (what config.yaml and the CLI call it)."""
        return str(self.method_box.currentData() or "")

    def _on_table_changed(self) -> None:
        rows = self.session.rows
        self.table_info.setText(self.session.describe() if rows else "none yet (Slides panel)")
        if self.worker is not None:
            return
        if not rows:
            self.status.setText("Open slides or load a slide table in the Slides panel, then press Start.")
        elif self.session.task == "classification":
            self.status.setText("Label the slides in the Slides panel (Label column), then press Start.")
        else:
            what = "times and events" if self.session.task == "survival" else "targets"
            self.status.setText(f"The {what} come from {self.session.table_name}: press Start to train.")

    def _on_method_changed(self, name: str) -> None:
        from bigslide.methods.base import get_method
        from bigslide.napari._forms import DataclassForm

        if self.params_form is not None:
            self.params_layout.removeWidget(self.params_form)
            self.params_form.deleteLater()
            self.params_form = None
        if not name:
            return
        cls = get_method(name)
        self.summary.setText(f"<i>{cls.summary}</i> (it {KIND_WORDS[cls.kind]})")
        for kind, fields in KIND_FIELDS.items():  # bags of tiles, or batches of whole images
            for field in fields:
                self.data_form.set_shown(field, kind == cls.kind)
        self.params_form = DataclassForm(cls.Params)
        self.params_layout.addWidget(self.params_form)
        self.params_box.setVisible(len(self.params_form) > 0)

    def set_method(self, name: str, **params: Any) -> None:
        """Choose a method by its registry name (and set some of its parameters)."""
        index = self.method_box.findData(name)
        if index < 0:
            raise ValueError(f"no method {name!r} in the panel")
        self.method_box.setCurrentIndex(index)
        if self.params_form is not None:
            self.params_form.set_values(params)

    def _browse_out_dir(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Run folder", self.out_dir.text())
        if folder:
            self.out_dir.setText(folder)

    # -- stain reference -----------------------------------------------------------------------------
    def _list_references(self) -> None:
        from bigslide.napari._roles import slide_layers

        chosen = self.stain_reference.currentData()
        items = [(BUNDLED_REFERENCE, "")] + [(s.name, s.metadata["path"]) for s in slide_layers(self.viewer)]
        if chosen and chosen not in [value for _name, value in items]:
            items.append((Path(chosen).name, chosen))  # a file chosen earlier
        set_items(self.stain_reference, [name for name, _value in items] + [CHOOSE_FILE])
        for index, (_name, value) in enumerate(items):
            self.stain_reference.setItemData(index, value)
        self.stain_reference.setItemData(len(items), None)
        index = self.stain_reference.findData(chosen or "")
        self.stain_reference.setCurrentIndex(max(index, 0))
        self._show_reference()

    def _on_reference_chosen(self, index: int) -> None:
        if self.stain_reference.itemText(index) != CHOOSE_FILE:
            return
        path, _ = QFileDialog.getOpenFileName(self, "Stain reference slide", "", SLIDE_FILES)
        self.choose_stain_reference(path or None)

    def choose_stain_reference(self, path: str | Path | None) -> None:
        """Normalise stains onto this slide file (None: the bundled H&E reference)."""
        self.stain_reference.setCurrentIndex(0)
        if path is not None:
            self.stain_reference.insertItem(1, Path(path).name, str(Path(path).resolve()))
            self.stain_reference.setCurrentIndex(1)

    def stain_reference_path(self) -> str | None:
        value = self.stain_reference.currentData()
        return str(value) if value else None

    def _show_reference(self) -> None:
        normalising = self.data_form.values().get("stain_normalise", "none") != "none"
        self.data_form.layout_.setRowVisible(self.stain_reference, normalising)

    # -- run -----------------------------------------------------------------------------------------
    def write_config(self) -> Any:
        """Write a new run folder for the current choices (`<run>/config.yaml` and the slide table)."""
        from bigslide.engine.config import ModelConfig, OptimConfig
        from bigslide.napari._run import new_run_folder, write_run_folder

        optim = OptimConfig(
            lr=float(self.lr.value() or 0),
            epochs=int(self.epochs.value() or 1),
            max_steps=int(self.max_steps.value() or 0) or None,
        )
        data_values = self.data_form.values()
        if data_values.get("stain_normalise", "none") != "none":
            data_values["stain_reference"] = self.stain_reference_path()
        self.run_dir = new_run_folder(self.out_dir.text(), self.method_name())
        return write_run_folder(
            self.viewer,
            self.session,
            self.run_dir,
            method=self.method_name(),
            method_params=self.params_form.values() if self.params_form is not None else {},
            data_values=data_values,
            model=ModelConfig(backbone=self.backbone.currentText().strip()),
            optim=optim,
            device=self.device.currentText(),
        )

    def typed_problems(self) -> list[str]:
        """Numbers typed into this panel's fields and the Slides panel's that are refused, each named."""
        own = [f.refusal() for f in (self.epochs, self.lr, self.max_steps)]
        forms = [*self.data_form.problems(), *(self.params_form.problems() if self.params_form else [])]
        return [text for text in own if text] + forms + self.session.problems()

    def _show_first_refused(self) -> None:
        """Scroll to the first field of this panel holding a refused number, its reason in view."""
        forms = [self.data_form, *([self.params_form] if self.params_form else [])]
        fields = [self.epochs, self.lr, self.max_steps] + [w for f in forms for w in f.widgets.values()]
        refused = next(
            (f for f in fields if isinstance(f, NumberField) and f.problem() and f.isVisible()), None
        )
        if refused is not None:
            self.form_scroll.ensureWidgetVisible(refused.message)
            refused.edit.setFocus()

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

        if self.worker is not None:
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
        worker.yielded.connect(self._on_event)
        # closing runs in the worker thread (direct connection), so saving never freezes the GUI
        worker.aborted.connect(self._close_run, Qt.ConnectionType.DirectConnection)
        worker.returned.connect(self._on_returned)
        worker.errored.connect(self._on_error)
        worker.finished.connect(self._on_finished)
        self.worker = worker
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

    def stop(self) -> None:
        if self.worker is not None:
            self.stopped = True
            self.status.setText("Stopping after the current step; saving a checkpoint…")
            self.stop_button.setEnabled(False)
            self.worker.quit()

    def _close_run(self) -> None:
        if self.run_gen is not None:
            self.run_gen.close()  # the engine saves checkpoints/last.pt on close

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
            from bigslide.engine.retrain_report import why_missing  # loaded: a run is under way

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
            self.status.setText(f"epoch {event.epoch + 1} {event.split}: {shown}")
        elif kind == "CheckpointSaved":
            self.last_checkpoint = Path(event.path)
            self.session.checkpoint_saved.emit(self.last_checkpoint)
        elif kind == "Message":
            self.status.setText(event.text)

    def _on_returned(self, result: Any) -> None:
        self.last_checkpoint = getattr(result, "checkpoint", None) or self.last_checkpoint
        if self.last_checkpoint is not None:
            self.session.run_finished.emit(self.last_checkpoint)
        self.status.setText(f"Finished. Checkpoint: {self.last_checkpoint}")
        show_info(f"Training finished; checkpoint saved to {self.last_checkpoint}")

    def _on_error(self, err: Exception) -> None:
        from bigslide.napari._run import in_panel_words

        text = in_panel_words(f"Training failed: {err}")
        show_error(text)
        self.status.setText(text)

    def _on_finished(self) -> None:
        if self.stopped and self.config_path is not None:
            checkpoint = self.config_path.parent / "checkpoints" / "last.pt"
            if checkpoint.is_file():
                self.last_checkpoint = checkpoint
                self.status.setText(f"Stopped. Checkpoint: {checkpoint}")
            else:
                self.status.setText("Stopped before the first step: no checkpoint was written.")
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


def _limit_torch_threads() -> None:
    """Keep the viewer responsive while training: leave one core to the GUI thread, and have Python hand
    the GIL over every millisecond (not every 5), so the GUI thread never queues behind the run's."""
    import torch

    cores = os.cpu_count() or 1
    if cores > 1 and torch.get_num_threads() >= cores:
        torch.set_num_threads(cores - 1)
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
