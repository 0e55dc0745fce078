"""Slides panel: the training set as a table (slide, label, split, regions, tiles), saved as a CSV."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari.qt.threading import thread_worker
from napari.utils.notifications import show_error, show_info
from qtpy.QtCore import Qt
from qtpy.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from bigslide.errors import BigslideError
from bigslide.napari._qt import float_box, scrolled, spin_box
from bigslide.napari._regions import slide_regions
from bigslide.napari._roles import ROLE
from bigslide.napari._run import in_panel_words
from bigslide.napari._session import SPLIT_CHOICES, Session, session_for

if TYPE_CHECKING:
    import napari

COLUMNS = ("Slide", "Label", "Split", "Regions", "Tiles")
LABEL_COLUMN = 1


class SlidesWidget(QWidget):
    """Lists open slides and slides from a table; labels are typed in place."""

    def __init__(self, napari_viewer: napari.Viewer) -> None:
        super().__init__()
        self.viewer = napari_viewer
        self.session: Session = session_for(napari_viewer)
        self._filling = False
        self.count_worker: Any = None
        self.count_error: str | None = None

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        header = self.table.horizontalHeader()
        assert header is not None
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().hide()  # type: ignore[union-attr]
        self.table.setMinimumHeight(160)
        self.table.itemChanged.connect(self._on_item_changed)

        self.tile_size = spin_box(16, 4096, self.session.tile_size, 16, tip="Side of a MIL tile in pixels")
        self.min_tissue = float_box(
            0.0,
            1.0,
            self.session.min_tissue,
            0.05,
            tip="Tiles with less tissue than this fraction are skipped",
        )
        self.target_mpp = float_box(
            0.05,
            64.0,
            self.session.target_mpp,
            0.25,
            tip="µm per pixel tiles are read at (20x = 0.5, 40x = 0.25)",
        )
        self.slide_mpp = float_box(
            0.0,
            64.0,
            self.session.slide_mpp or 0.0,
            0.25,
            tip="Level-0 µm per pixel of slides whose files state none (their scanner's); "
            "'from file' reads it from each file",
        )
        self.slide_mpp.setSpecialValueText("from file")  # shown at 0
        self.tile_size.valueChanged.connect(self._on_tiling_changed)
        self.target_mpp.valueChanged.connect(self._on_tiling_changed)
        self.slide_mpp.valueChanged.connect(self._on_tiling_changed)
        self.min_tissue.valueChanged.connect(self._on_tiling_changed)

        self.load_button = QPushButton("Load table…")
        self.save_button = QPushButton("Save table…")
        self.remove_button = QPushButton("Remove")
        self.count_button = QPushButton("Count tiles")
        self.load_button.setToolTip("Add slides from a CSV with columns slide,label[,split][,regions]")
        self.count_button.setToolTip("Tiles kept after tissue and region filtering, per slide")
        self.load_button.clicked.connect(lambda: self.load_csv())
        self.save_button.clicked.connect(lambda: self.save_csv())
        self.remove_button.clicked.connect(self.remove_selected)
        self.count_button.clicked.connect(self.count_tiles)
        self.status = QLabel("Open slides (File ▸ Open) or load a slide table.")
        self.status.setWordWrap(True)

        settings = QFormLayout()
        settings.addRow("tile size (px)", self.tile_size)
        settings.addRow("resolution (µm/px)", self.target_mpp)
        settings.addRow("slide µm/px if unstated", self.slide_mpp)
        settings.addRow("min tissue", self.min_tissue)
        buttons = QHBoxLayout()
        for button in (self.load_button, self.save_button, self.remove_button, self.count_button):
            buttons.addWidget(button)
        layout = scrolled(self)
        layout.addWidget(self.table)
        layout.addLayout(buttons)
        layout.addLayout(settings)
        layout.addWidget(self.status)
        layout.addStretch()

        self.session.changed.connect(self.refresh)
        self.viewer.layers.events.inserted.connect(self._on_layer_inserted)
        self.viewer.layers.events.removed.connect(self._on_layer_removed)
        for layer in self.viewer.layers:
            self._add_layer(layer)
        self.refresh()

    # -- rows --------------------------------------------------------------------------------------
    def refresh(self) -> None:
        self._filling = True
        try:
            self.table.setRowCount(len(self.session.rows))
            for i, row in enumerate(self.session.rows):
                self._set_item(i, 0, row.path.name, editable=False, tip=str(row.path))
                self._set_item(
                    i, 1, row.label, editable=True, tip="Type the slide's class, e.g. tumor / normal"
                )
                regions = row.regions.name if row.regions else ""
                self._set_item(i, 3, regions, editable=False, tip=str(row.regions or "whole slide"))
                self._set_item(i, 4, "" if row.tiles is None else str(row.tiles), editable=False)
                split = QComboBox()
                split.addItems([s or "auto" for s in SPLIT_CHOICES])
                split.setCurrentIndex(SPLIT_CHOICES.index(row.split) if row.split in SPLIT_CHOICES else 0)
                split.setToolTip("auto: a stratified train/val split is made when training starts")
                split.currentIndexChanged.connect(
                    lambda index, path=row.path: self.session.update(path, split=SPLIT_CHOICES[index])
                )
                self.table.setCellWidget(i, 2, split)
        finally:
            self._filling = False

    def _set_item(self, row: int, column: int, text: str, *, editable: bool, tip: str = "") -> None:
        item = QTableWidgetItem(text)
        if not editable:
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
        if tip:
            item.setToolTip(tip)
        self.table.setItem(row, column, item)

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        if self._filling or item.column() != LABEL_COLUMN:
            return
        row = self.session.rows[item.row()]
        row.label = item.text().strip()

    def set_label(self, index: int, label: str) -> None:
        """Type a label into row `index` (what a user does by double-clicking the cell)."""
        item = self.table.item(index, LABEL_COLUMN)
        if item is not None:
            item.setText(label)

    def remove_selected(self) -> None:
        rows = sorted({index.row() for index in self.table.selectedIndexes()}, reverse=True)
        for i in rows:
            self.session.remove(self.session.rows[i].path)

    # -- layers --------------------------------------------------------------------------------------
    def _on_layer_inserted(self, event: Any) -> None:
        self._add_layer(event.value)

    def _add_layer(self, layer: Any) -> None:
        meta = layer.metadata
        if meta.get(ROLE) == "slide" and meta.get("path"):
            self.session.add(
                meta["path"],
                label=str(meta.get("label", "")),
                split=str(meta.get("split", "")),
                from_layer=True,
            )

    def _on_layer_removed(self, event: Any) -> None:
        meta = event.value.metadata
        row = self.session.row(meta["path"]) if meta.get(ROLE) == "slide" and meta.get("path") else None
        if row is not None and row.from_layer:
            self.session.remove(row.path)

    # -- files ---------------------------------------------------------------------------------------
    def load_csv(self, path: str | Path | None = None) -> None:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Load slide table", "", "Slide table (*.csv)")
            if not path:
                return
        try:
            count = self.session.load_csv(path)
        except BigslideError as err:
            show_error(str(err))
            return
        self.status.setText(f"Loaded {count} slides from {Path(path).name}.")

    def save_csv(self, path: str | Path | None = None) -> Path | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(
                self, "Save slide table", "slides.csv", "Slide table (*.csv)"
            )
            if not path:
                return None
        try:
            saved = self.session.save_csv(path)
        except BigslideError as err:
            show_error(str(err))
            return None
        self.status.setText(f"Saved {len(self.session.rows)} slides to {saved}.")
        return saved

    # -- tiles ---------------------------------------------------------------------------------------
    def _on_tiling_changed(self) -> None:
        self.session.tile_size = self.tile_size.value()
        self.session.target_mpp = self.target_mpp.value()
        self.session.slide_mpp = self.slide_mpp.value() or None
        self.session.min_tissue = self.min_tissue.value()
        for row in self.session.rows:
            row.tiles = None
        self.refresh()

    def count_tiles(self) -> Any:
        """Count tiles per slide in a worker thread; returns the worker (already started)."""
        try:
            jobs = [
                (row.path, slide_regions(self.viewer, self.session, row.path)) for row in self.session.rows
            ]
        except BigslideError as err:
            show_error(str(err))
            return None
        self.count_button.setEnabled(False)
        self.status.setText("Counting tiles…")
        s = self.session
        worker = _count_tiles(jobs, s.tile_size, s.target_mpp, s.min_tissue, s.slide_mpp)
        self.count_error = None
        worker.yielded.connect(lambda result: self.session.update(result[0], tiles=result[1]))
        worker.errored.connect(self._count_failed)
        worker.finished.connect(self._count_finished)
        self.count_worker = worker
        worker.start()
        return worker

    def _count_failed(self, err: Exception) -> None:
        self.count_error = in_panel_words(f"Counting tiles failed: {err}")
        show_error(self.count_error)

    def _count_finished(self) -> None:
        self.count_button.setEnabled(True)
        if self.count_error is not None:
            self.status.setText(self.count_error)
            return
        total = sum(r.tiles or 0 for r in self.session.rows)
        self.status.setText(f"{total} tiles in {len(self.session.rows)} slides.")
        show_info(f"{total} tiles in {len(self.session.rows)} slides")


@thread_worker(ignore_errors=True)
def _count_tiles(
    jobs: list[tuple[Path, Any]],
    tile_size: int,
    target_mpp: float,
    min_tissue: float,
    slide_mpp: float | None,
) -> Generator[tuple[Path, int], None, None]:
    from bigslide.data.slides import open_with_mpp
    from bigslide.grid import TileGrid

    for path, regions in jobs:
        with open_with_mpp(path, slide_mpp) as slide:
            grid = TileGrid.from_slide(
                slide, tile_size, target_mpp=target_mpp, min_tissue=min_tissue, regions=regions
            )
        yield path, len(grid)
