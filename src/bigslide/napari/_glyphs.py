"""The canvas's letters drawn once while the viewer waits, a few per event-loop turn.

napari draws text on the canvas (the scale bar, a map's legend, the class names on outlines) from a font
atlas that renders each character the first time it is shown, on the GUI thread, in 3-6 ms on a
2-core machine without a GPU. The first slide, the first map and the first outlines each showed a
dozen new characters in their first frame: tens of milliseconds added to a freeze a person notices.
Drawn ahead here, in turns of CHUNK characters after the panels open, they cost no action anything.
"""

from __future__ import annotations

import string
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import napari

CHARACTERS = "".join(
    dict.fromkeys(
        string.digits
        + " µmn.,"
        + string.ascii_lowercase
        + string.ascii_uppercase
        + ":;!?()[]-–—/%'+=×·≥≤<>_#"
    )
)
"""The scale bar's characters first: it is redrawn with the first slide."""
CHUNK = 4
"""Characters drawn per event-loop turn (a turn stays well under the 50 ms a person would notice)."""


def warm_glyphs(viewer: napari.Viewer, delay_ms: int) -> None:
    """Draw every character of CHARACTERS into `viewer`'s canvas font, CHUNK per turn, from `delay_ms`
    on. Does nothing where napari keeps its font elsewhere: the letters are then drawn when shown."""
    from qtpy.QtCore import QTimer

    ref = weakref.ref(viewer)
    left = list(CHARACTERS)

    def turn() -> None:
        view = ref()
        font = _canvas_font(view) if view is not None else None
        if font is None:
            return
        for char in left[:CHUNK]:
            font[char]  # renders and stores the glyph
        del left[:CHUNK]
        if left:
            QTimer.singleShot(0, turn)

    QTimer.singleShot(delay_ms, turn)


def _canvas_font(viewer: napari.Viewer) -> Any:
    """The font napari's canvas draws its text with (None where this napari keeps it elsewhere)."""
    try:
        info = viewer.window._qt_viewer.canvas.font_info()  # napari 0.9's canvas
        return info.font_manager.get_font(info.face)
    except Exception:  # another napari, a closed window: nothing to warm
        return None
