"""Slides panel: the training set as a table whose columns follow the task (a label per slide; a time and
event for survival; a target for regression), the tiling settings, and the table saved as a CSV."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari.qt.threading import thread_worker
from napari.utils.notifications import show_error, show_info
from qtpy.QtCore import QAbstractItemModel, QModelIndex, Qt
from qtpy.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from bigslide.napari._number import NumberField, parse_number
from bigslide.napari._panel import Panel
from bigslide.napari._qt import scrolled
from bigslide.napari._session import counted
from bigslide.tiling.pixel_classes import PEN_FLATNESS

if TYPE_CHECKING:
    from bigslide.data.slides import SlideCache
    from bigslide.napari._session import Session, SlideRow
    from bigslide.tiling.pixel_classes import TissueSettings

SPLIT_WORDS = {"": "auto", "train": "train", "val": "val", "test": "test"}
MPP_TIPS = {
    "file": "Level-0 µm per pixel stated by the file",
    "typed": "The file states none: the 'slide µm/px if unstated' value below",
    "missing": "The file states no pixel size: it is drawn at a provisional 1 µm/px and cannot be read at "
    "a physical resolution until you enter its scanner's µm/px below ('slide µm/px if unstated')",
    "closed": "Read from the file when the slide is opened or trained on",
}
ANNOTATED_TIP = "Tiles whose centres lie in the teaching annotations of {} (Count tiles counts them)"
SPLIT_TIP = "auto: a stratified train/validation split is made when training starts"
# The columns each task shows, after Slide: what it learns from (editable), then split, regions, tiles.
TASK_COLUMNS = {"classification": ("Label",), "survival": ("Time", "Event"), "regression": ("Target",)}
EDIT_TIPS = {
    "Label": "Type the slide's class, e.g. tumor / normal",
    "Time": "Time to the event or to censoring (> 0, in the table's units)",
    "Event": "1: the event was observed; 0: censored",
    "Target": "The number the model learns to predict for this slide",
}


class SplitDelegate(QStyledItemDelegate):
    """The Split column's editor: a drop-down shown only while a cell is edited (a drop-down kept in
    every cell is a widget of its own, drawn out of place while the table is rebuilt)."""

    def createEditor(  # noqa: N802 - Qt override
        self, parent: QWidget | None, option: QStyleOptionViewItem, index: QModelIndex
    ) -> QWidget:
        box = QComboBox(parent)
        for value, words in SPLIT_WORDS.items():
            box.addItem(words, value)
        box.setToolTip(SPLIT_TIP)
        return box

    def setEditorData(self, editor: QWidget | None, index: QModelIndex) -> None:  # noqa: N802
        assert isinstance(editor, QComboBox)
        editor.setCurrentIndex(max(editor.findData(index.data(Qt.ItemDataRole.UserRole) or ""), 0))
        editor.showPopup()

    def setModelData(  # noqa: N802 - Qt override
        self, editor: QWidget | None, model: QAbstractItemModel | None, index: QModelIndex
    ) -> None:
        assert isinstance(editor, QComboBox)
        assert model is not None
        model.setData(index, editor.currentData() or "", Qt.ItemDataRole.UserRole)  # the panel shows it


class SlidesWidget(Panel):
    """Lists open slides and slides from a table; what a task learns from is typed in place."""

    def build(self, body: QWidget) -> None:
        from bigslide.napari._session import session_for

        self.session: Session = session_for(self.viewer)
        self._filling = False
        self.count_worker: Any = None
        self.count_error: str | None = None
        self.columns: list[str] = []

        self.table = QTableWidget(0, 0)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.SelectedClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
            | QAbstractItemView.EditTrigger.AnyKeyPressed
        )
        self.table.verticalHeader().hide()  # type: ignore[union-attr]
        self.table.setMinimumHeight(160)
        self.split_delegate = SplitDelegate(self.table)
        self.table.itemChanged.connect(self._on_item_changed)

        s = self.session
        self.tile_size = NumberField(
            int, s.tile_size, name="tile size", minimum=16, maximum=4096, step=16, tip="Side of a tile (px)"
        )
        self.target_mpp = NumberField(
            float,
            s.target_mpp,
            name="resolution",
            above=0,
            maximum=64,
            step=0.25,
            tip="µm per pixel the model sees tiles at, whatever the scanner (20x = 0.5, 40x = 0.25)",
        )
        self.slide_mpp = NumberField(
            float,
            s.slide_mpp,
            name="slide µm/px if unstated",
            above=0,
            maximum=64,
            step=0.25,
            blank="from file",
            tip="Level-0 µm per pixel of slides whose files state none (their scanner's); "
            "leave empty to read it from each file",
        )
        self.min_tissue = NumberField(
            float,
            s.min_tissue,
            name="min tissue",
            minimum=0,
            maximum=1,
            step=0.05,
            tip="Tiles with less tissue than this fraction (0-1) are skipped",
        )
        self.pen_marks = QCheckBox()
        self.pen_marks.setToolTip(
            "Take flat films of any colour lying on the glass for ink (data.ink_flatness "
            f"{PEN_FLATNESS:g}): violet, pink or light blue pens that colour alone keeps as tissue. "
            "Leave it off for IHC slides: their broad brown fields are flat too"
        )
        self.pen_marks.setChecked(s.tissue.ink_flatness > 0)
        self.pen_marks.toggled.connect(self._on_tiling_changed)
        for field in (self.tile_size, self.target_mpp, self.slide_mpp, self.min_tissue):
            field.valueChanged.connect(self._on_tiling_changed)
            field.problemChanged.connect(lambda _p, f=field: s.set_problem(f.name, f.refusal()))

        self.load_button = QPushButton("Load table…")
        self.save_button = QPushButton("Save table…")
        self.remove_button = QPushButton("Remove")
        self.count_button = QPushButton("Count tiles")
        self.load_button.setToolTip(
            "Add slides from a CSV: slide,label (or time,event / target)[,split][,regions][,case]"
        )
        self.count_button.setToolTip("Tiles kept after tissue and region filtering, per slide")
        self.load_button.clicked.connect(lambda: self.load_csv())
        self.save_button.clicked.connect(lambda: self.save_csv())
        self.remove_button.clicked.connect(self.remove_selected)
        self.count_button.clicked.connect(self.count_tiles)
        self.status = QLabel()
        self.status.setWordWrap(True)

        settings = QFormLayout()
        settings.addRow("tile size (px)", self.tile_size)
        settings.addRow("resolution (µm/px)", self.target_mpp)
        settings.addRow("slide µm/px if unstated", self.slide_mpp)
        settings.addRow("min tissue (0-1)", self.min_tissue)
        settings.addRow("pen marks on the glass", self.pen_marks)
        buttons = QHBoxLayout()
        for button in (self.load_button, self.save_button, self.remove_button, self.count_button):
            buttons.addWidget(button)
        layout = scrolled(body)
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
    def column(self, name: str) -> int:
        """Index of a column shown now ("Slide", "Label", "Time", "Split", ...), or -1."""
        return self.columns.index(name) if name in self.columns else -1

    def refresh(self) -> None:
        self._filling = True
        try:
            columns = ["Slide", *TASK_COLUMNS[self.session.task], "Split", "µm/px", "Regions", "Tiles"]
            columns += ["Case"] if any(r.case for r in self.session.rows) else []
            columns += ["Annotated"] if any(r.annotations for r in self.session.rows) else []
            if columns != self.columns:
                self.columns = columns
                self.table.setColumnCount(len(columns))
                self.table.setHorizontalHeaderLabels(columns)
                header = self.table.horizontalHeader()
                assert header is not None
                header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
                header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
                for index in range(len(columns)):
                    self.table.setItemDelegateForColumn(index, None)  # type: ignore[arg-type]
                self.table.setItemDelegateForColumn(columns.index("Split"), self.split_delegate)
            self.table.setRowCount(len(self.session.rows))
            for i, row in enumerate(self.session.rows):
                for name, text in self._cells(row).items():
                    editable = name in EDIT_TIPS or name == "Split"
                    tip = EDIT_TIPS.get(name, SPLIT_TIP if name == "Split" else "")
                    if name == "Slide":
                        tip = str(row.path) + (f"\ndamaged: {row.damaged}" if row.damaged else "")
                    elif name == "Regions":
                        tip = str(row.regions or "whole slide")
                    elif name == "µm/px":
                        tip = MPP_TIPS[self._mpp_state(row)[1]]
                    elif name == "Annotated":
                        tip = ANNOTATED_TIP.format(row.annotations) if row.annotations else ""
                    self._set_item(i, columns.index(name), text, editable=editable, tip=tip)
                split = self.table.item(i, columns.index("Split"))
                assert split is not None
                split.setData(Qt.ItemDataRole.UserRole, row.split or "")
        finally:
            self._filling = False
        self.status.setText(self.describe())

    def _cells(self, row: SlideRow) -> dict[str, str]:
        cells = {
            "Slide": row.path.name + (" — damaged" if row.damaged else ""),
            "Label": row.label,
            "Time": "" if row.time is None else f"{row.time:g}",
            "Event": "" if row.event is None else str(row.event),
            "Target": "" if row.target is None else f"{row.target:g}",
            "Split": SPLIT_WORDS.get(row.split, row.split),
            "µm/px": self._mpp_state(row)[0],
            "Regions": row.regions.name if row.regions else "",
            "Tiles": "" if row.tiles is None else str(row.tiles),
            "Case": row.case or "",
            "Annotated": "" if row.annotated is None or row.annotations is None else str(row.annotated),
        }
        return {name: cells[name] for name in self.columns}

    def _mpp_state(self, row: SlideRow) -> tuple[str, str]:
        """(what the µm/px cell shows, why) for a row: the file's, the fallback typed below, missing (the
        slide is drawn at a provisional size), or not known until the slide is read (not open here)."""
        from bigslide.napari._roles import slide_layers

        layer = next((s for s in slide_layers(self.viewer) if Path(s.metadata["path"]) == row.path), None)
        if layer is None:
            return "", "closed"
        stated, mpp = layer.metadata.get("stated_mpp"), layer.metadata.get("mpp")
        if stated:
            return f"{float(stated[0]):g}", "file"
        if mpp:
            return f"{float(mpp[0]):g} (typed)", "typed"
        return "missing", "missing"

    def describe(self) -> str:
        """What the table holds and what to do next, in one line."""
        rows = self.session.rows
        if not rows:
            return "Open slides (File ▸ Open) or load a slide table."
        what = {
            "classification": "type each slide's class in the Label column",
            "survival": "each slide's time and event (1 observed, 0 censored) come from the table",
            "regression": "each slide's target comes from the table",
        }[self.session.task]
        missing = [r.path.name for r in rows if self._mpp_state(r)[1] == "missing"]
        unstated = (
            f" {', '.join(missing)}: no pixel size in the file; enter its scanner's µm/px below."
            if missing
            else ""
        )
        damaged = [r.path.name for r in rows if r.damaged]
        broken = (
            f" Damaged (some tiles will not decode; training stops on them unless bad slides are left out): "
            f"{', '.join(damaged)}."
            if damaged
            else ""
        )
        return f"{self.session.describe()}: {what}.{unstated}{broken}"

    def _set_item(self, row: int, column: int, text: str, *, editable: bool, tip: str = "") -> None:
        item = QTableWidgetItem(text)
        if not editable:
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
        if tip:
            item.setToolTip(tip)
        self.table.setItem(row, column, item)

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        if self._filling:
            return
        row = self.session.rows[item.row()]
        name = self.columns[item.column()]
        text = item.text().strip()
        if name == "Label":
            row.label = text
        elif name == "Split":
            self.session.update(row.path, split=item.data(Qt.ItemDataRole.UserRole) or "")
        elif name in ("Time", "Event", "Target"):
            self._set_number(row, name, text)

    def _set_number(self, row: SlideRow, name: str, text: str) -> None:
        """A typed time, event or target, kept when allowed; else refused in the status line and the cell
        shows the kept value again."""
        if name == "Event":
            value, problem = parse_number(text, int, minimum=0, maximum=1)
        else:
            value, problem = parse_number(text, float, above=0 if name == "Time" else None)
        if problem is None:
            self.session.update(row.path, **{name.lower(): value})
            return
        refused = f"Row {self.session.rows.index(row) + 1} ({row.path.name}): {name.lower()} {problem}"
        self.refresh()  # shows the kept value
        self.status.setText(f"{refused}; kept {self._cells(row)[name] or 'empty'}.")

    def set_label(self, index: int, label: str) -> None:
        """Type a label into row `index` (what a user does by double-clicking the cell)."""
        item = self.table.item(index, self.column("Label"))
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
        from bigslide.napari._roles import ROLE

        meta = layer.metadata
        if meta.get(ROLE) == "slide" and meta.get("path"):
            self.session.add(
                meta["path"],
                label=str(meta.get("label", "")),
                split=str(meta.get("split", "")),
                from_layer=True,
            )

    def _on_layer_removed(self, event: Any) -> None:
        from bigslide.napari._roles import ROLE

        meta = event.value.metadata
        row = self.session.row(meta["path"]) if meta.get(ROLE) == "slide" and meta.get("path") else None
        if row is not None and row.from_layer:
            self.session.remove(row.path)

    # -- files ---------------------------------------------------------------------------------------
    def load_csv(self, path: str | Path | None = None) -> None:
        from bigslide.errors import BigslideError

        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Load slide table", "", "Slide table (*.csv)")
            if not path:
                return
        try:
            count = self.session.load_csv(path)
        except BigslideError as err:
            self.status.setText(f"Not loaded: {err}")
            show_error(str(err))
            return
        self.status.setText(f"Loaded {counted(count, 'slide')}. {self.describe()}")

    def save_csv(self, path: str | Path | None = None) -> Path | None:
        from bigslide.errors import BigslideError

        if path is None:
            path, _ = QFileDialog.getSaveFileName(
                self, "Save slide table", "slides.csv", "Slide table (*.csv)"
            )
            if not path:
                return None
        try:
            saved = self.session.save_csv(path)
        except BigslideError as err:
            self.status.setText(f"Not saved: {err}")
            show_error(str(err))
            return None
        self.status.setText(f"Saved {counted(len(self.session.rows), 'slide')} to {saved}.")
        return saved

    # -- tiles ---------------------------------------------------------------------------------------
    def _on_tiling_changed(self) -> None:
        s = self.session
        s.tile_size = int(self.tile_size.value() or s.tile_size)
        s.target_mpp = float(self.target_mpp.value() or s.target_mpp)
        s.slide_mpp = self.slide_mpp.value()
        s.min_tissue = float(self.min_tissue.value() or 0.0)
        s.tissue = dataclasses.replace(
            s.tissue, ink_flatness=PEN_FLATNESS if self.pen_marks.isChecked() else 0.0
        )
        for row in s.rows:
            row.tiles = None
        self.refresh()

    def count_tiles(self) -> Any:
        """Count tiles per slide in a worker thread; returns the worker (already started)."""
        from bigslide.errors import BigslideError
        from bigslide.napari._regions import slide_regions

        refused = self.session.problems()
        if refused:
            self.status.setText("Not counted: " + "; ".join(refused) + ".")
            show_error(self.status.text())
            return None
        try:
            jobs = [
                (row.path, slide_regions(self.viewer, self.session, row.path), row.annotations)
                for row in self.session.rows
            ]
        except BigslideError as err:
            show_error(str(err))
            return None
        self.count_button.setEnabled(False)
        self.status.setText("Counting tiles…")
        s = self.session
        worker = _count_tiles(s.slides(), jobs, s.tile_size, s.target_mpp, s.min_tissue, s.tissue)
        self.count_error = None
        worker.yielded.connect(
            lambda result: self.session.update(result[0], tiles=result[1], annotated=result[2])
        )
        worker.errored.connect(self._count_failed)
        worker.finished.connect(self._count_finished)
        self.count_worker = worker
        worker.start()
        return worker

    def _count_failed(self, err: Exception) -> None:
        from bigslide.napari._run import in_panel_words

        self.count_error = in_panel_words(f"Counting tiles failed: {err}")
        show_error(self.count_error)

    def _count_finished(self) -> None:
        self.count_button.setEnabled(True)
        if self.count_error is not None:
            self.status.setText(self.count_error)
            return
        total, slides = sum(r.tiles or 0 for r in self.session.rows), len(self.session.rows)
        tiles = f"{counted(total, 'tile')} in {counted(slides, 'slide')}"
        self.status.setText(f"{tiles}.")
        show_info(tiles)


@thread_worker(ignore_errors=True)
def _count_tiles(
    slides: SlideCache,
    jobs: list[tuple[Path, Any, Path | None]],
    tile_size: int,
    target_mpp: float,
    min_tissue: float,
    tissue: TissueSettings,
) -> Generator[tuple[Path, int, int | None], None, None]:
    from bigslide.data.slides import tile_slide
    from bigslide.tiling.annotations import annotated_count, read_annotations

    for path, regions, taught_by in jobs:
        what = f"{path}: a worker died tiling it"
        grid = slides.run(tile_slide, path, tile_size, target_mpp, min_tissue, regions, tissue, what=what)
        taught = None
        if taught_by is not None:
            taught = annotated_count(read_annotations(taught_by), grid.coords, grid.tile_size_level0)
        yield path, len(grid), taught
