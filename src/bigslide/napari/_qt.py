"""Small constructors for Qt inputs (PyQt's typing does not know its property keyword arguments)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from qtpy.QtCore import QEventLoop, Qt, QTimer
from qtpy.QtWidgets import (
    QApplication,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSlider,
    QVBoxLayout,
    QWidget,
)


def window_part(viewer: Any, name: str) -> Any:
    """A private part of napari's window (`_qt_window`, `_qt_viewer`), or None where this napari has none.
    A plugin reaching it is warned against from napari 0.9 and refused from 0.10: the warning is kept off
    the user's console, and the callers do without the part where it is refused."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            return getattr(viewer.window, name, None)
        except Exception:  # refused, or a closed window
            return None


def paint_now() -> None:
    """Paint what has changed now, before napari holds the GUI thread to make a layer (a quarter second or
    more on two cores, which no worker can take): posted events and timers run, a person's input waits. As
    napari's own progress bars do it. A widget's `repaint` alone is skipped in a window that composes the
    canvas's OpenGL, until the event loop has turned once."""
    QApplication.processEvents(QEventLoop.ProcessEventsFlag.ExcludeUserInputEvents)


def later(widget: QWidget, ms: int, slot: Callable[[], None]) -> None:
    """`slot` once, `ms` from now, unless `widget` is gone by then (the timer is the widget's child)."""
    timer = QTimer(widget)
    timer.setSingleShot(True)
    timer.timeout.connect(slot)
    timer.timeout.connect(timer.deleteLater)
    timer.start(ms)


def connect_while_alive(signal: Any, widget: QWidget, slot: Callable[..., Any]) -> None:
    """Connect `slot` to a psygnal `signal` of an object that outlives `widget` (the viewer's session),
    until the widget's Qt object is destroyed: a late emit (a worker's result after the panel closed)
    then reaches no deleted widget."""
    signal.connect(slot)
    widget.destroyed.connect(lambda *_: signal.disconnect(slot))


def combo_box(items: list[str] | tuple[str, ...], *, editable: bool = False, tip: str = "") -> QComboBox:
    box = QComboBox()
    box.setEditable(editable)
    box.addItems(list(items))
    box.setToolTip(tip)
    return box


def path_row(field: QLineEdit, browse: Callable[[], None]) -> QHBoxLayout:
    """`field` with a narrow "…" button after it that calls `browse` (a file or folder dialog)."""
    button = QPushButton("…")
    button.setMaximumWidth(30)
    button.clicked.connect(browse)
    row = QHBoxLayout()
    row.addWidget(field)
    row.addWidget(button)
    return row


def percent_slider(value: int) -> QSlider:
    slider = QSlider(Qt.Orientation.Horizontal)
    slider.setRange(0, 100)
    slider.setValue(value)
    return slider


def scrolled(panel: QWidget) -> QVBoxLayout:
    """Give `panel` a vertical scroll area and return the layout of its content: a tall panel scrolls
    inside its dock instead of stretching the window past the screen."""
    content = QWidget()
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidget(content)
    outer = QVBoxLayout(panel)
    outer.setContentsMargins(0, 0, 0, 0)
    outer.addWidget(area)
    return QVBoxLayout(content)


def set_items(box: QComboBox, names: list[str]) -> None:
    """Replace a drop-down's items, keeping the current one when it is still there; each item's
    tooltip is its full name (long slide and layer names are cut off in a narrow panel)."""
    current = box.currentText()
    box.blockSignals(True)
    box.clear()
    for index, name in enumerate(names):
        box.addItem(name)
        box.setItemData(index, name, Qt.ItemDataRole.ToolTipRole)
    if current in names:
        box.setCurrentText(current)
    box.setToolTip(box.currentText())
    box.blockSignals(False)
