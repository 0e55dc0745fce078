"""The Train panel's choices: the method and its parameters, the model and optimiser settings, the data
settings with the stain reference, and the runs folder; written as a run folder by `write_config`.

`TrainForm` builds them into one scrolling form; `TrainWidget` (`_train_widget.py`) adds the run control
below it (Start/Stop, progress, status, plots) and greys the form out while a run is under way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from qtpy.QtCore import Qt
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from bigslide.napari._number import NumberField
from bigslide.napari._panel import Panel
from bigslide.napari._qt import combo_box, path_row, set_items

if TYPE_CHECKING:
    from bigslide.engine.config import ModelConfig
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
    "skip_bad_slides",
)
KIND_FIELDS = {
    "bag": ("bag_size", "instance_weight", "instance_loss"),
    "image": ("image_size", "batch_size"),
}
KIND_WORDS = {
    "bag": "learns from tiles of each slide, pooled into one prediction per slide",
    "image": "learns from each slide read as one large image",
}
BUNDLED_REFERENCE = "bundled H&E reference"
CHOOSE_FILE = "a slide file…"
SLIDE_FILES = "Slides (*.svs *.tif *.tiff *.ndpi *.dcm *.png *.jpg *.jpeg)"


class TrainForm(Panel):
    """The choices of a training run, in a scroll area; the panel built on it sets `session` and
    `run_dir` (the folder `write_config` makes) before `build_form` runs."""

    session: Session
    run_dir: Path | None

    def build_form(self) -> QScrollArea:
        """Make the form's widgets and return them in a scroll area (kept as `form_scroll`: a refused
        number is scrolled into view)."""
        from bigslide.engine.config import DataConfig, OptimConfig
        from bigslide.methods.base import available_methods, get_method
        from bigslide.napari._forms import DataclassForm

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
        from bigslide.nn.hub_models import cached_hub_models

        self.backbone = combo_box(
            [*BACKBONES, *cached_hub_models()],  # and the timm models of the Hugging Face cache
            editable=True,
            tip=(
                "Any timm model name; hf-hub:ORG/NAME for a model in the Hugging Face cache; "
                "package.module:factory for an nn.Module of your own"
            ),
        )
        # where the backbone's weights start: random, the published ones, or a file of the user's
        self.pretrained = QCheckBox("published weights")
        self.pretrained.setToolTip(
            "Start from the backbone's published weights: timm's ImageNet weights (downloaded once), or an "
            "hf-hub:ORG/NAME model's own, from the Hugging Face cache. Off: random weights"
        )
        self.weights = QLineEdit()
        self.weights.setPlaceholderText("none (.safetensors, .pt, .pth, .bin)")
        self.weights.setToolTip(
            "A state dict of the backbone (e.g. a pathology foundation model's), used instead of the "
            "published weights"
        )
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
        settings = QFormLayout()
        settings.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        settings.addRow("slides", self.table_info)
        settings.addRow("method", self.method_box)
        settings.addRow(self.summary)
        settings.addRow("backbone", self.backbone)
        settings.addRow("start from", self.pretrained)
        settings.addRow("weights file", path_row(self.weights, self._browse_weights))
        settings.addRow("epochs", self.epochs)
        settings.addRow("learning rate", self.lr)
        settings.addRow("max steps (0 = no limit)", self.max_steps)
        settings.addRow("device", self.device)
        settings.addRow("runs folder", path_row(self.out_dir, self._browse_out_dir))
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

        # the chosen method's parameters and the open slides (as stain references) stay current
        self.method_box.currentIndexChanged.connect(lambda _i: self._on_method_changed(self.method_name()))
        self._on_method_changed(self.method_name())
        self.viewer.layers.events.inserted.connect(lambda _e: self._list_references())
        self.viewer.layers.events.removed.connect(lambda _e: self._list_references())
        self._list_references()
        return scroll

    # -- method --------------------------------------------------------------------------------------
    def method_name(self) -> str:
        """The registry name of the chosen method (what config.yaml and the CLI call it)."""
        return str(self.method_box.currentData() or "")

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

    def _browse_weights(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Backbone weights",
            self.weights.text(),
            "Weights (*.safetensors *.pt *.pth *.bin);;All files (*)",
        )
        if path:
            self.weights.setText(path)

    def model_config(self) -> ModelConfig:
        """The backbone and where its weights start, as chosen."""
        from bigslide.engine.config import ModelConfig

        weights = self.weights.text().strip()
        return ModelConfig(
            backbone=self.backbone.currentText().strip(),
            pretrained=self.pretrained.isChecked(),
            weights=weights or None,
        )

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

    # -- the choices as a run ------------------------------------------------------------------------
    def write_config(self) -> Any:
        """Write a new run folder for the current choices (`<run>/config.yaml` and the slide table)."""
        from bigslide.engine.config import OptimConfig
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
            model=self.model_config(),
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
