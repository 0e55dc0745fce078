"""Results panel: run a checkpoint on a slide, overlay its heatmaps exactly on the tissue, export them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari.qt.threading import create_worker
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QWidget,
)

from bigslide.napari._annotate import AnnotateBox
from bigslide.napari._heatmap_exports import HeatmapExports
from bigslide.napari._layers import (
    HEATMAP_COLORMAPS,
    add_empty_heatmap,
    add_heatmap,
    renormalise,
    show_legend,
    show_only,
)
from bigslide.napari._panel import Panel
from bigslide.napari._plot import ColourBar
from bigslide.napari._prediction_line import prediction_line
from bigslide.napari._qt import later, path_row, percent_slider, scrolled, set_items
from bigslide.napari._retrain import RetrainBox
from bigslide.napari._roles import find_layer, layers_with_role, slide_layers
from bigslide.napari._run import in_panel_words
from bigslide.napari._suggest_queue import SuggestBox
from bigslide.napari._toasts import show_error

if TYPE_CHECKING:
    from bigslide.napari._session import Session

NORMALISATIONS = ("rank", "percentile", "minmax", "raw")
PREVIEW_TILES = 1500
"""While a followed run trains, a slide with more tiles is previewed from a regular lattice of about this
many (one tile in s x s, drawn over its block): each epoch's map then arrives within the next epoch, and
costs the run a bounded share of the processor. The full map is drawn when the run ends."""
WORDS_FIRST_MS = 30
"""A prediction's words are painted before its map's layer is made."""


class ResultsWidget(HeatmapExports, Panel):
    def build(self, body: QWidget) -> None:
        from bigslide.napari._session import session_for

        self.session: Session = session_for(self.viewer)
        self.worker: Any = None
        self.prediction: Any = None
        # a followed run's newest checkpoint not yet shown, and whether a preview of it is enough
        self.pending_checkpoint: tuple[Path, bool] | None = None
        self.pending_grids: list[tuple[Any, str]] = []  # heatmaps of the last prediction not yet drawn
        self.training = False  # a run of this viewer is under way (its maps are previews)

        self.checkpoint = QLineEdit()
        self.checkpoint.setPlaceholderText("a run folder, or …/checkpoints/last.pt")
        self.slide_box = QComboBox()
        self.device = QComboBox()
        self.device.addItems(["auto", "cpu", "cuda"])
        self.run_button = QPushButton("Run on slide")
        self.run_button.setToolTip("Predict the slide and overlay its heatmaps")
        self.run_button.clicked.connect(lambda: self.run())
        self.result = QLabel("Choose a checkpoint and a slide.")
        self.result.setWordWrap(True)
        self.follow = QCheckBox("Follow training (redraw after each epoch)")
        self.follow.setToolTip(
            "While the Train panel runs, each epoch's checkpoint is run on the chosen slide in the "
            f"background, so you see the heatmap move as the model learns (a slide of more than "
            f"{PREVIEW_TILES} tiles from a lattice of about {PREVIEW_TILES} of them; every tile once the "
            "run ends)"
        )
        self.session.checkpoint_saved.connect(self.on_checkpoint)
        self.run_plot = QLabel()  # the run's Kaplan-Meier plot of its test split (survival)
        self.run_plot.setWordWrap(True)
        self.run_plot.hide()
        self.checkpoint.textChanged.connect(lambda _t: self.show_run_plot())
        self.session.run_finished.connect(self.on_run_finished)

        self.heatmap_box = QComboBox()
        self.colormap = QComboBox()
        self.colormap.addItems(HEATMAP_COLORMAPS)
        self.normalisation = QComboBox()
        self.normalisation.addItems(NORMALISATIONS)
        self.normalisation.setToolTip("rank: even spread of colours; raw: the scores as they are")
        self.opacity = percent_slider(50)
        self.colour_bar = ColourBar()
        self.colormap.currentTextChanged.connect(lambda _t: self.apply_display())
        self.normalisation.currentTextChanged.connect(lambda _t: self.apply_display())
        self.opacity.valueChanged.connect(lambda _v: self.apply_display())
        self.heatmap_box.currentTextChanged.connect(self._on_heatmap_chosen)

        self.png_button = QPushButton("PNG overlay…")
        self.npz_button = QPushButton("Grid (.npz)…")
        self.geojson_button = QPushButton("QuPath tiles…")
        self.png_button.clicked.connect(lambda: self.export_png())
        self.npz_button.clicked.connect(lambda: self.export_npz())
        self.geojson_button.clicked.connect(lambda: self.export_geojson())

        form = QFormLayout()
        form.addRow("checkpoint", path_row(self.checkpoint, self._browse_checkpoint))
        form.addRow("slide", self.slide_box)
        form.addRow("device", self.device)
        display = QFormLayout()
        display.addRow("heatmap", self.heatmap_box)
        display.addRow("colormap", self.colormap)
        display.addRow("normalisation", self.normalisation)
        display.addRow("opacity", self.opacity)
        display.addRow(self.colour_bar)
        exports = QHBoxLayout()
        for button in (self.png_button, self.npz_button, self.geojson_button):
            exports.addWidget(button)
        layout = scrolled(body)
        layout.addLayout(form)
        layout.addWidget(self.run_button)
        layout.addWidget(self.follow)
        layout.addWidget(self.result)
        layout.addWidget(self.run_plot)
        layout.addLayout(display)
        layout.addWidget(QLabel("Export the chosen heatmap:"))
        layout.addLayout(exports)
        self.annotate = AnnotateBox(self.viewer, self.session, self.slide_layer)
        self.retrain = RetrainBox(self)
        self.suggest = SuggestBox(self)
        layout.addWidget(self.annotate)
        layout.addWidget(self.suggest)
        layout.addWidget(self.retrain)
        layout.addStretch()

        self.viewer.layers.events.inserted.connect(self._on_layers_changed)
        self.viewer.layers.events.removed.connect(self._on_layers_changed)
        self._on_layers_changed()

    # -- choices ---------------------------------------------------------------------------------------
    def _on_layers_changed(self, _event: Any = None) -> None:
        set_items(self.slide_box, [layer.name for layer in slide_layers(self.viewer)])
        set_items(self.heatmap_box, [layer.name for layer in layers_with_role(self.viewer, "heatmap")])

    def slide_layer(self) -> Any:
        name = self.slide_box.currentText()
        return next((layer for layer in slide_layers(self.viewer) if layer.name == name), None)

    def heatmap_layer(self) -> Any:
        name = self.heatmap_box.currentText()
        return next((layer for layer in layers_with_role(self.viewer, "heatmap") if layer.name == name), None)

    def _browse_checkpoint(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Checkpoint", "", "Checkpoint (*.pt)")
        if path:
            self.checkpoint.setText(path)

    def show_run_plot(self) -> None:
        """Show the Kaplan-Meier plot of the checkpoint's run (its test split's predicted risk groups,
        `<run>/km.png`), when it has one."""
        from qtpy.QtGui import QPixmap

        text = self.checkpoint.text().strip()
        km = Path(text).expanduser().parent.parent / "km.png" if text else None
        pixmap = QPixmap(str(km)) if km is not None and km.is_file() else QPixmap()
        if pixmap.isNull():
            self.run_plot.hide()
            return
        self.run_plot.setPixmap(pixmap.scaledToWidth(min(pixmap.width(), 380)))
        self.run_plot.setToolTip(f"{km}: the test split's cases in two groups at the median predicted risk")
        self.run_plot.show()

    def chosen_checkpoint(self) -> Path:
        """The checkpoint typed or browsed to (`~` expanded; a run's folder for its latest checkpoint)."""
        from bigslide.engine.run_folder import checkpoint_of

        return checkpoint_of(Path(self.checkpoint.text().strip()).expanduser())

    def checkpoint_problem(self) -> str | None:
        """Why no checkpoint can be used (none chosen, or no file where it points), else None."""
        if not self.checkpoint.text().strip():
            return "no checkpoint chosen: train a model (Train panel) or choose a .pt file above"
        checkpoint = self.chosen_checkpoint()
        if not checkpoint.is_file():
            return f"no checkpoint at '{checkpoint}': train a model or choose a .pt file above"
        return None

    # -- inference -----------------------------------------------------------------------------------
    def run(self, checkpoint: Path | None = None, *, preview: bool = False) -> Any:
        """Predict the chosen slide in a worker thread; returns the started worker (or None). A `preview`
        reads a large slide's tiles on a lattice of about `PREVIEW_TILES` (quick, while a run trains)."""
        slide = self.slide_layer()
        checkpoint = checkpoint or self.chosen_checkpoint()
        if slide is None:
            self._fail("Open a slide first (File ▸ Open), then choose it above.")
            return None
        problem = None if checkpoint.is_file() else self.checkpoint_problem()
        if problem is not None:
            self._fail(f"{problem[0].upper()}{problem[1:]}.")
            return None
        row = self.session.row(slide.metadata["path"])
        regions = row.regions if row is not None else None
        worker = create_worker(
            _predict,
            checkpoint,
            slide.metadata["path"],
            regions=regions,
            device=self.device.currentText(),
            slide_mpp=self.session.fallback_mpp(slide.metadata["path"]),
            max_tiles=PREVIEW_TILES if preview else None,
            session=self.session,
            _start_thread=False,
            _ignore_errors=True,
        )
        worker.returned.connect(lambda prediction: self.show_prediction(prediction, slide))
        # the engine's words name config keys (data.slide_mpp); the panel names its fields instead
        worker.errored.connect(
            lambda err: self._fail(in_panel_words(f"Inference failed on {slide.name}: {err}"))
        )
        worker.finished.connect(self._on_finished)
        self.worker = worker
        self.run_button.setEnabled(False)
        self.result.setText(f"Running {checkpoint.name} on {slide.name}…")
        worker.start()
        return worker

    def _fail(self, text: str) -> None:
        self.result.setText(text)
        show_error(text)

    def _on_finished(self) -> None:
        self.worker = None
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        """Ready again once the worker is done and its heatmaps are on the canvas."""
        if self.worker is not None or self.pending_grids:
            return
        self.run_button.setEnabled(True)
        if self.pending_checkpoint is not None:  # a followed run saved again while this one ran
            (checkpoint, preview), self.pending_checkpoint = self.pending_checkpoint, None
            self.run(checkpoint, preview=preview)

    def on_run_finished(self, checkpoint: Path) -> None:
        """A run of this viewer finished: offer its checkpoint here, unless another one is chosen; when
        following, draw its full map."""
        self.training = False
        chosen = self.checkpoint.text().strip()
        if not chosen or Path(chosen).expanduser().resolve() == Path(checkpoint).resolve():
            self.checkpoint.setText(str(checkpoint))
            self.show_run_plot()  # the run wrote its plot after the last checkpoint
        if self.follow.isChecked() and self.slide_layer() is not None:
            self._follow(Path(checkpoint), preview=False)

    def on_checkpoint(self, checkpoint: Path) -> None:
        """A run of this viewer saved a checkpoint: when following, show it on the chosen slide (a preview
        of a large slide while the run trains)."""
        self.training = True
        if self.follow.isChecked() and self.slide_layer() is not None:
            self._follow(Path(checkpoint), preview=True)

    def _follow(self, checkpoint: Path, *, preview: bool) -> None:
        self.checkpoint.setText(str(checkpoint))
        if self.worker is not None:
            self.pending_checkpoint = (checkpoint, preview)  # only the newest waits; older ones are skipped
            return
        self.run(checkpoint, preview=preview)

    def show_prediction(self, prediction: Any, slide: Any) -> None:
        """Overlay the prediction's heatmaps on `slide`, one layer per event-loop turn (napari takes a
        tenth of a second to build a layer; three at once would freeze the viewer for longer)."""
        if slide not in self.viewer.layers:
            self.result.setText(f"{slide.name} was closed before its map was ready: no map drawn.")
            return
        self.prediction = prediction
        mpp = slide.metadata.get("mpp")
        row = self.session.row(slide.metadata["path"])
        case_slides = (
            sum(r.case == row.case for r in self.session.rows) if row is not None and row.case else 1
        )
        self.result.setText(
            prediction_line(prediction, slide.name, mpp[0] if mpp else None, row, case_slides)
        )
        grids = [(grid, map_name(slide, prediction, key)) for key, grid in prediction.grids.items()]
        self.pending_grids = list(reversed(grids))  # popped from the end: in the method's order
        # a timer of 0 ms may fire before the line is painted, and napari's making of the layer (a quarter
        # second on two cores) would keep it off the screen till then
        later(self, WORDS_FIRST_MS, lambda: self._add_next_grid(slide))

    def _add_next_grid(self, slide: Any) -> None:
        if self.pending_grids and slide in self.viewer.layers:
            grid, name = self.pending_grids.pop()
            self.add_grid(grid, slide, name)
            if self.pending_grids:
                later(self, 0, lambda: self._add_next_grid(slide))
                return
        self.pending_grids = []
        if self.prediction is not None and self.prediction.grids:
            first = next(iter(self.prediction.grids))
            self.heatmap_box.setCurrentText(map_name(slide, self.prediction, first))
        self._maybe_idle()

    def map_ahead(self, slide: Any, prediction: Any, key: str) -> None:
        """The slide's `key` map made now as an empty hidden layer, unless it has one: a run's maps are then
        drawn into it in place, not made as it ends (`add_empty_heatmap`)."""
        name = map_name(slide, prediction, key)
        if find_layer(self.viewer, name) is None:
            grid = prediction.grids[key]
            add_empty_heatmap(self.viewer, grid, slide, name=name, normalisation=self._normalisation())

    def add_grid(self, grid: Any, slide: Any, name: str) -> Any:
        layer = add_heatmap(self.viewer, grid, slide, name=name, normalisation=self._normalisation())
        if not grid.is_rgb:
            layer.colormap = self.colormap.currentText()
        layer.opacity = self.opacity.value() / 100
        self.heatmap_box.setCurrentText(layer.name)  # the newest map is the chosen one
        self._on_heatmap_chosen(layer.name)  # drawn again: its colour bar and legend, even if still chosen
        return layer

    # -- display ---------------------------------------------------------------------------------------
    def _normalisation(self) -> Any:
        return self.normalisation.currentText()

    def _on_heatmap_chosen(self, _name: str) -> None:
        layer = self.heatmap_layer()
        if layer is None:
            return
        show_only(self.viewer, layer.metadata.get("slide"), layer.name)  # the chosen map over its slide
        show_legend(self.viewer, layer)
        self.colour_bar.show_layer(layer)
        for widget in (self.colormap, self.normalisation, self.opacity):
            widget.blockSignals(True)
        # an RGB map (PCA) has its own colours: no colormap or normalisation to show or choose
        self.colormap.setEnabled(not layer.rgb)
        self.normalisation.setEnabled(not layer.rgb)
        if not layer.rgb and layer.colormap.name in HEATMAP_COLORMAPS:
            self.colormap.setCurrentText(layer.colormap.name)
        if not layer.rgb:
            self.normalisation.setCurrentText(layer.metadata.get("normalisation", "rank"))
        self.opacity.setValue(round(layer.opacity * 100))
        for widget in (self.colormap, self.normalisation, self.opacity):
            widget.blockSignals(False)

    def apply_display(self) -> None:
        layer = self.heatmap_layer()
        if layer is None:
            return
        layer.opacity = self.opacity.value() / 100
        if layer.rgb:
            return
        layer.colormap = self.colormap.currentText()
        if layer.metadata.get("normalisation") != self._normalisation():
            renormalise(layer, self._normalisation())
            show_legend(self.viewer, layer)
        self.colour_bar.show_layer(layer)


def _predict(checkpoint: Path, slide: str, *, session: Session, **kwargs: Any) -> Any:
    # in the worker thread: the first import of torch and timm takes most of a second, and the first
    # start of the decode workers waits for the fork server
    from bigslide.engine.inference import predict_slide
    from bigslide.napari._gc import settle_imports

    settle_imports()
    return predict_slide(checkpoint, slide, processes=session.decode_processes(), **kwargs)


def map_name(slide: Any, prediction: Any, key: str) -> str:
    """The layer name of a slide's map: "<slide> <the method's title for it>"."""
    return f"{slide.name} {prediction.titles.get(key, key)}"
