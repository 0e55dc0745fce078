"""Tiles of an open slide that will not decode, told once per slide as a notification on the GUI thread,
whichever thread napari read them on (the slide is drawn; those tiles are striped grey), and marked on the
slide's row in the Slides table."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path

from qtpy.QtCore import QObject, Qt, Signal

from bigslide.errors import SlideError


class _Reporter(QObject):
    failed = Signal(str, str)  # slide path, what failed

    def __init__(self) -> None:
        super().__init__()
        self.told: set[str] = set()
        self.failed.connect(self._tell, Qt.ConnectionType.QueuedConnection)

    def _tell(self, path: str, message: str) -> None:
        from bigslide.napari._toasts import show_warning

        for listener in list(_listeners):
            mark = listener()
            if mark is None:
                _listeners.remove(listener)
            else:
                mark(path, message)
        if path not in self.told:
            self.told.add(path)
            show_warning(
                f"{Path(path).name} is damaged: {message}. Such tiles are drawn as grey stripes; the rest "
                "of the slide is drawn."
            )


_reporter: _Reporter | None = None
_listeners: list[weakref.WeakMethod[Callable[[str, str], None]]] = []


def on_damaged(mark: Callable[[str, str], None]) -> None:
    """Call the bound method `mark(path, what failed)` (on the GUI thread) whenever a slide shows a tile
    that will not decode; held weakly, so its owner (a viewer's session) may go."""
    _listeners.append(weakref.WeakMethod(mark))  # type: ignore[arg-type]


def tile_error_reporter(path: str | Path) -> Callable[[SlideError], None]:
    """What a slide's viewer levels call when a tile will not decode (make it on the GUI thread)."""
    global _reporter
    if _reporter is None:
        _reporter = _Reporter()
    reporter = _reporter
    return lambda err: reporter.failed.emit(str(path), str(err))
