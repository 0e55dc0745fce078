"""napari's notifications, one at a time: a new one closes those still up, so two never stack and cut
each other off; `withdraw` closes one whose cause the person has since fixed.

napari keeps a toast up while its window is not the active one (its timer starts only then), and stacks
each new one above the last. Closing reaches napari's toast widget; where a napari version lacks it, the
toasts are shown as napari shows them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from napari.utils import notifications


def shown() -> list[tuple[Any, str]]:
    """The toasts up now, with their messages."""
    try:
        from napari._qt.dialogs.qt_notification import NapariQtNotification
    except ImportError:  # another napari layout: leave its toasts as they are
        return []
    out = []
    for toast in list(getattr(NapariQtNotification, "_instances", [])):
        try:
            if toast.isVisible():
                message = getattr(toast, "message", None)
                out.append((toast, message.text() if message is not None else ""))
        except RuntimeError:  # a toast of a window already closed: napari still lists it
            continue
    return out


def _close(match: str | None = None) -> None:
    from qtpy.QtCore import QThread
    from qtpy.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None or QThread.currentThread() is not app.thread():
        return  # widgets are touched on the GUI thread only; napari moves the new toast there itself
    for toast, text in shown():
        if match is None or text.startswith(match):
            toast.close()


def saved_in(checkpoint: Any) -> str:
    """Where a run's checkpoint went, short enough for a toast (the panel's status line has the whole
    path): the run's folder, as the panels name it."""
    if checkpoint is None:
        return "no checkpoint was saved"
    path = Path(checkpoint)
    if path.parent.name == "checkpoints":
        return f"checkpoint {path.name} in run {path.parent.parent.name}"
    return f"checkpoint {path.name} in folder {path.parent.name}"


def show_info(message: str) -> None:
    _close()
    notifications.show_info(message)


def show_warning(message: str) -> None:
    _close()
    notifications.show_warning(message)


def show_error(message: str) -> None:
    _close()
    notifications.show_error(message)


def withdraw(start: str) -> None:
    """Close the toasts whose message starts with `start` (their cause is gone)."""
    _close(start)
