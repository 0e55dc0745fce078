"""The base of every dock panel: shown at once, its content built once PyTorch and the engine are loaded
(at once when they already are), so opening a panel never freezes the viewer while they import."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import QLabel, QVBoxLayout, QWidget

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

    def __init__(self, napari_viewer: napari.Viewer) -> None:
        super().__init__()
        self.viewer = napari_viewer
        self.ready = False
        self.setMinimumWidth(PANEL_WIDTH)
        self._outer = QVBoxLayout(self)
        self._outer.setContentsMargins(0, 0, 0, 0)
        self._loading = QLabel(LOADING)
        self._loading.setWordWrap(True)
        self._loading.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self._outer.addWidget(self._loading)
        ref = weakref.ref(self)
        when_ready(lambda: _build(ref))

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


def _build(ref: weakref.ref[Panel]) -> None:
    panel = ref()
    if panel is None:
        return
    try:
        panel.objectName()  # a panel closed before it was built is gone on the C++ side
    except RuntimeError:
        return
    panel._build_now()
