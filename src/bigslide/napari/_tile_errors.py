"""Tiles of an open slide that will not decode, told once per slide as a notification on the GUI thread,
whichever thread napari read them on (the slide is drawn; those tiles are blank)."""

from __future__ import annotations

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
        from napari.utils.notifications import show_warning

        if path not in self.told:
            self.told.add(path)
            show_warning(f"{message}. Such tiles are shown blank; the rest of {Path(path).name} is drawn.")


_reporter: _Reporter | None = None


def tile_error_reporter(path: str | Path) -> Callable[[SlideError], None]:
    """What a slide's viewer levels call when a tile will not decode (make it on the GUI thread)."""
    global _reporter
    if _reporter is None:
        _reporter = _Reporter()
    reporter = _reporter
    return lambda err: reporter.failed.emit(str(path), str(err))
