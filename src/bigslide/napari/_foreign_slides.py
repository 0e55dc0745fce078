"""Slides opened through another reader (napari's built-in one draws them in pixels, out of place, and the
panels would not know them): a slide-only file is opened again through bigslide's reader, any other
image file that bigslide could read as a slide is flagged once."""

from __future__ import annotations

import weakref
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qtpy.QtCore import QTimer

from bigslide.napari._formats import SLIDE_ONLY_PATTERNS, SUFFIXES
from bigslide.napari._roles import ROLE

if TYPE_CHECKING:
    import napari


def foreign_slide(layer: Any) -> Path | None:
    """The slide file a layer was read from by another reader, or None."""
    source = getattr(layer, "source", None)
    path = getattr(source, "path", None)
    if layer.metadata.get(ROLE) or not path or getattr(source, "reader_plugin", None) in (None, "bigslide"):
        return None
    return Path(path) if Path(path).name.lower().endswith(SUFFIXES) else None


def watch(viewer: napari.Viewer) -> None:
    """From now on, handle every layer another reader makes of a slide file (see the module's docstring)."""
    ref = weakref.ref(viewer)

    def on_inserted(event: Any) -> None:
        path = foreign_slide(event.value)
        if path is not None:
            QTimer.singleShot(0, lambda: _handle(ref, event.value, path))  # not inside napari's insert

    viewer.layers.events.inserted.connect(on_inserted)


def _handle(ref: weakref.ref[Any], layer: Any, path: Path) -> None:
    from bigslide.napari._toasts import show_info, show_warning

    viewer = ref()
    if viewer is None or layer not in viewer.layers:
        return
    plugin = layer.source.reader_plugin
    if any(fnmatch(path.name, pattern) for pattern in SLIDE_ONLY_PATTERNS):
        viewer.layers.remove(layer)
        viewer.open(path, plugin="bigslide")
        show_info(
            f"{path.name} was opened by {plugin}, in pixels and on top of the other slides: it is opened "
            "again with bigslide's reader, at its µm/px beside them"
        )
        return
    show_warning(
        f"{path.name} was opened by {plugin}: the bigslide panels do not train on it or draw over it; if it "
        "is a slide, open it again and choose bigslide as the reader"
    )
