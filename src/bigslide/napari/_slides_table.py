"""The Slides panel's table of the training set: its columns follow the task (a label per slide; a time
and event for survival; a target for regression), then split, µm/px, regions and tiles; what a task
learns from and the split are typed in place.

`SlidesTable` fills the table from the session and takes the typed values back; `SlidesWidget`
(`_slides_widget.py`) adds the buttons, the tiling settings and the status line around it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qtpy.QtCore import QAbstractItemModel, QModelIndex, Qt
from qtpy.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHeaderView,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from bigslide.napari._number import parse_number
from bigslide.napari._panel import Panel
from bigslide.words import counted
from bigslide.wsi.resolution import mpp_at_odds
from bigslide.wsi.tiff_levels import COARSEST_MPP, FINEST_MPP

if TYPE_CHECKING:
    from qtpy.QtWidgets import QLabel

    from bigslide.napari._session import Session, SlideRow

SPLIT_WORDS = {"": "auto", "train": "train", "val": "val", "test": "test"}
MPP_TIPS = {
    "file": "Level-0 µm per pixel stated by the file",
    "typed": "The file states none: the 'slide µm/px if unstated' value below (type this slide's own here)",
    "table": "The file states none: this row's µm/px (its table's mpp, or typed here; clear it for the "
    "value below)",
    "at odds": "The file states this µm/px and its slide table row's mpp another: counting, training and "
    "prediction stop on it until the table is corrected or its mpp left empty",
    "missing": "The file states no pixel size: it is drawn at a provisional 1 µm/px and cannot be read at "
    "a physical resolution until you type its scanner's µm/px here, or below for every such slide "
    "('slide µm/px if unstated')",
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
    "Case": "The patient or case the slide belongs to: a case's slides are one bag, one prediction (type "
    "a name; empty: the slide is its own case)",
}


SLIDE_MIN_PX = 140
SLIDE_MAX_PX = 320
"""The Slide column's width: its names' own, within these bounds (a name longer is cut, its tip whole)."""


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


class SlidesTable(Panel):
    """The table of slides; the panel built on it sets `session` and the `status` line (where the table
    says what it holds and why a typed value was refused) before the table is filled."""

    session: Session
    status: QLabel

    def build_table(self) -> QTableWidget:
        """Make the (empty) table, kept as `table`: `refresh` fills it once the panel is laid out."""
        self._filling = False  # set while `refresh` writes the cells: those are not the user's edits
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
        return self.table

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
                # the slide's name keeps a readable width: long labels and cases scroll sideways instead
                # of squeezing it to a letter
                header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
                for index in range(len(columns)):
                    self.table.setItemDelegateForColumn(index, None)  # type: ignore[arg-type]
                self.table.setItemDelegateForColumn(columns.index("Split"), self.split_delegate)
            self.table.setRowCount(len(self.session.rows))
            for i, row in enumerate(self.session.rows):
                for name, text in self._cells(row).items():
                    # a slide's µm/px is typed where its file states none (or the row's is at odds with it)
                    editable = name in EDIT_TIPS or name == "Split"
                    editable |= name == "µm/px" and self._mpp_state(row)[1] != "file"
                    tip = EDIT_TIPS.get(name, SPLIT_TIP if name == "Split" else "")
                    if name == "Slide":
                        tip = str(row.path) + (f"\ndamaged: {row.damaged}" if row.damaged else "")
                        tip += f"\ncannot be tiled: {row.untiled}" if row.untiled else ""
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
        self.table.resizeColumnToContents(0)
        self.table.setColumnWidth(0, min(max(self.table.columnWidth(0), SLIDE_MIN_PX), SLIDE_MAX_PX))
        self.status.setText(self.describe())

    def _cells(self, row: SlideRow) -> dict[str, str]:
        cells = {
            "Slide": row.path.name
            + (" — damaged" if row.damaged else "")
            + (" — not tiled" if row.untiled else ""),
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
        """(what the µm/px cell shows, why) for a row: the file's, its table row's, the fallback typed below,
        missing (the slide is drawn at a provisional size), or not known until the slide is read (not open
        here)."""
        from bigslide.napari._roles import slide_layers

        layer = next((s for s in slide_layers(self.viewer) if Path(s.metadata["path"]) == row.path), None)
        if layer is None:
            return "", "closed"
        stated, mpp = layer.metadata.get("stated_mpp"), layer.metadata.get("mpp")
        if stated and row.mpp is not None and mpp_at_odds(float(stated[0]), row.mpp):
            return f"{float(stated[0]):g} (table {row.mpp:g}!)", "at odds"
        if stated:
            return f"{float(stated[0]):g}", "file"
        if mpp and row.mpp is not None:
            return f"{float(mpp[0]):g} (table)", "table"
        if mpp:
            return f"{float(mpp[0]):g} (typed)", "typed"
        return "missing", "missing"

    def describe(self) -> str:
        """What the table holds and what to do next, in one line."""
        rows = self.session.rows
        if not rows:
            return "Open slides (File ▸ Open) or load a slide table."
        what = {
            "classification": labels_to_type(rows),
            "survival": "each slide's time and event (1 observed, 0 censored) come from the table",
            "regression": "each slide's target comes from the table",
        }[self.session.task]
        states = [(r.path.name, self._mpp_state(r)[1]) for r in rows]
        missing = [name for name, state in states if state == "missing"]
        unstated = (
            f" {', '.join(missing)}: no pixel size in the file; enter its scanner's µm/px below."
            if missing
            else ""
        )
        odds = [name for name, state in states if state == "at odds"]
        if odds:
            unstated += (
                f" {', '.join(odds)}: the table's mpp is at odds with the file's µm/px; correct the table."
            )
        stops = "training stops on them unless bad slides are left out"
        broken = _listed(f"Damaged (some tiles will not decode; {stops})", [r for r in rows if r.damaged])
        unread = _listed(f"Not tiled (unreadable; {stops})", [r for r in rows if r.untiled])
        return f"{self.session.describe()}: {what}.{unstated}{broken}{unread}"

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
            self.session.update(row.path, label=text)  # the panels' next-step lines follow
        elif name == "Split":
            self.session.update(row.path, split=item.data(Qt.ItemDataRole.UserRole) or "")
        elif name in ("Time", "Event", "Target"):
            self._set_number(row, name, text)
        elif name == "Case":
            self.session.update(row.path, case=text or None)
        elif name == "µm/px":
            self._set_number(row, name, text.split(" (")[0].strip())  # typed over "0.5 (typed)" or after it

    def _set_number(self, row: SlideRow, name: str, text: str) -> None:
        """A typed time, event, target or the slide's own level-0 µm/px (empty: none, the fallback below
        again), kept when allowed; else refused in the status line and the cell shows the kept value
        again."""
        if name == "Event":
            value, problem = parse_number(text, int, minimum=0, maximum=1)
        elif name == "µm/px":  # a scanner's, not a magnification
            value, problem = (
                parse_number(text, float, minimum=FINEST_MPP, maximum=COARSEST_MPP) if text else (None, None)
            )
        else:
            value, problem = parse_number(text, float, above=0 if name == "Time" else None)
        if problem is None:
            # a typed µm/px moves its slide to its size on the canvas
            self.session.update(row.path, **{"mpp" if name == "µm/px" else name.lower(): value})
            return
        refused = f"Row {self.session.rows.index(row) + 1} ({row.path.name}): {name.lower()} {problem}"
        self.refresh()  # shows the kept value
        self.status.setText(f"{refused}; kept {self._cells(row)[name] or 'empty'}.")

    def set_label(self, index: int, label: str) -> None:
        """Type a label into row `index` (what a user does by double-clicking the cell)."""
        item = self.table.item(index, self.column("Label"))
        if item is not None:
            item.setText(label)

    def selected_rows(self) -> list[int]:
        """The rows selected in the table, top to bottom."""
        return sorted({index.row() for index in self.table.selectedIndexes()})

    def one_case(self) -> str | None:
        """Make the selected slides one case (a patient's slides, one bag and one prediction): the case one
        of them is in already, else one named after the first; the name can be typed over in the Case
        column. Returns the case, or None (and says why) with fewer than two slides selected."""
        rows = [self.session.rows[i] for i in self.selected_rows()]
        if len(rows) < 2:
            self.status.setText(
                "Select two or more slides (Ctrl- or Shift-click their rows), then press One case."
            )
            return None
        case = next((r.case for r in rows if r.case), None) or rows[0].path.stem
        for row in rows:
            row.case = case
        self.session.changed.emit()
        self.status.setText(f"{', '.join(r.path.name for r in rows)}: case '{case}'. {self.describe()}")
        return case

    def remove_selected(self) -> None:
        for i in reversed(self.selected_rows()):
            self.session.remove(self.session.rows[i].path)


def labels_to_type(rows: list[SlideRow]) -> str:
    """What the Label column still needs, in words."""
    unlabelled = sum(1 for r in rows if not r.label.strip())
    if unlabelled == len(rows):
        return "type each slide's class in the Label column"
    if unlabelled:
        return f"type a class in the Label column for the {counted(unlabelled, 'slide')} without one"
    return "each slide's class is in the Label column (type over one to change it)"


def _listed(title: str, rows: list[SlideRow]) -> str:
    """ " Title: a.svs, b.svs." naming `rows`' slides; nothing when there are none."""
    return f" {title}: {', '.join(r.path.name for r in rows)}." if rows else ""
