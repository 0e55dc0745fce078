"""The base of every dock panel: shown at once, its content built once PyTorch and the engine are loaded
(at once when they already are), so opening a panel never freezes the viewer while they import; a panel
docked beside another of bigslide's becomes a tab of that dock (`tab_beside_panels`)."""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING

from qtpy.QtCore import Qt, QTimer, Signal
from qtpy.QtWidgets import QDockWidget, QLabel, QMainWindow, QSizePolicy, QVBoxLayout, QWidget

from bigslide.napari._warm import import_error, when_ready

if TYPE_CHECKING:
    import napari

LOADING = "Loading PyTorch and the training methods…"
PANEL_WIDTH = 440
"""Every panel's least width: napari docks a panel at its least width, and narrower ones cut off their
rows of buttons and their status lines."""


class Panel(QWidget):
    """Subclasses build their widgets in `build(body)`; `ready` says whether they are there yet and
    `built` fires once they are."""

    built = Signal()
    bigslide_dock = True  # what `tab_beside_panels` tabs with

    def __init__(self, napari_viewer: napari.Viewer) -> None:
        super().__init__()
        self.viewer = napari_viewer
        self.ready = False
        self.setMinimumWidth(PANEL_WIDTH)
        # it takes its dock's height (its content scrolls): napari would otherwise add a stretch below the
        # loading line, and the content, built after it, sat below the stretch, half the dock down
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self._outer = QVBoxLayout(self)
        self._outer.setContentsMargins(0, 0, 0, 0)
        self._loading = QLabel(LOADING)
        self._loading.setWordWrap(True)
        self._loading.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self._outer.addWidget(self._loading)
        ref = weakref.ref(self)
        when_ready(lambda: _build(ref))
        QTimer.singleShot(0, lambda: tab_beside_panels(ref()))  # napari docks it once this returns

    def build(self, body: QWidget) -> None:
        raise NotImplementedError

    def _build_now(self) -> None:
        error = import_error()
        if error is not None:
            self._loading.setText(f"bigslide could not load its training modules: {error}")
            return
        body = QWidget()
        self.build(body)
        self._outer.removeWidget(self._loading)
        self._loading.deleteLater()
        self._outer.addWidget(body)
        self.ready = True
        self.built.emit()


def tab_beside_panels(panel: QWidget | None) -> None:
    """Make `panel`'s dock a tab of the last dock of bigslide's in the same area of the window, and show it.

    Panels opened one by one were stacked in one column, each given what the others' least heights left
    (the Results panel two rows high at 1000 px); as tabs, like 'All panels (tabbed)', each gets the whole
    column, and a tab can still be dragged out to dock it apart."""
    try:
        dock = panel.parent() if panel is not None else None
    except RuntimeError:  # closed before its dock was made
        return
    window = dock.parent() if isinstance(dock, QDockWidget) else None
    if not isinstance(dock, QDockWidget) or not isinstance(window, QMainWindow) or dock.isFloating():
        return
    area = window.dockWidgetArea(dock)
    others = [
        d
        for d in window.findChildren(QDockWidget)
        if d is not dock
        and not d.isHidden()
        and not d.isFloating()
        and window.dockWidgetArea(d) == area
        and getattr(d.widget(), "bigslide_dock", False)
    ]
    if others:
        window.tabifyDockWidget(others[-1], dock)
        QTimer.singleShot(0, lambda: _raise(dock))  # the tab just opened shows, once Qt made the tab bar


def _raise(dock: QDockWidget) -> None:
    with contextlib.suppress(RuntimeError):  # closed meanwhile
        dock.raise_()


def _build(ref: weakref.ref[Panel]) -> None:
    panel = ref()
    if panel is None:
        return
    try:
        panel.objectName()  # a panel closed before it was built is gone on the C++ side
    except RuntimeError:
        return
    panel._build_now()
