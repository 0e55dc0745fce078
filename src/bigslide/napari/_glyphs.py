"""The canvas's letters drawn once while the viewer waits, one per event-loop turn.

napari draws text on the canvas (the scale bar, a map's legend, the class names on outlines) from a font
atlas that renders each character the first time it is shown, on the GUI thread, in 3-9 ms on a
2-core machine without a GPU. The first slide, the first map and the first outlines each showed a
dozen new characters in their first frame: tens of milliseconds added to a freeze a person notices.
Drawn ahead here, one per turn after the panels open, TURN_MS apart: a turn that falls beside other
work on the GUI thread adds one character's time to that freeze, not several (four per turn took 13-36
ms, and lengthened a prediction's longest gap past 100 ms).
"""

from __future__ import annotations

import string
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import napari

TEXT_METRICS = "ÅÉÑŐjgpqy"
"""What vispy renders to measure a text's line height, the first time any text is drawn."""
SCALE_BAR_CHARACTERS = TEXT_METRICS + string.digits + " µmnx.,"
"""What the scale bar's first draw shows or measures (its length and unit)."""
CHARACTERS = "".join(
    dict.fromkeys(
        SCALE_BAR_CHARACTERS + string.ascii_lowercase + string.ascii_uppercase + ":;!?()[]-–—/%'+=×·≥≤<>_#"
    )
)
"""The scale bar's characters first: it is switched on once they are drawn."""
TURN_MS = 20
"""Time between two characters' turns (the whole set takes about two seconds)."""


def warm_glyphs(
    viewer: napari.Viewer, delay_ms: int, scale_bar_ready: Callable[[], None] | None = None
) -> None:
    """Draw every character of CHARACTERS into `viewer`'s canvas font, one per turn, from `delay_ms`
    on, and call `scale_bar_ready` once those of SCALE_BAR_CHARACTERS are drawn. Draws nothing where
    napari keeps its font elsewhere (the letters are then drawn when shown; `scale_bar_ready` is called
    at once)."""
    from qtpy.QtCore import QTimer

    ref = weakref.ref(viewer)
    left = list(CHARACTERS)
    waiting = [scale_bar_ready] if scale_bar_ready is not None else []

    def turn() -> None:
        view = ref()
        font = _canvas_font(view) if view is not None else None
        if font is None:
            left.clear()
        else:
            font[left.pop(0)]  # renders and stores the glyph
        if waiting and not set(SCALE_BAR_CHARACTERS).intersection(left):
            waiting.pop()()
        if left:
            QTimer.singleShot(TURN_MS, turn)

    QTimer.singleShot(delay_ms, turn)


def _canvas_font(viewer: napari.Viewer) -> Any:
    """The font napari's canvas draws its text with (None where this napari keeps it elsewhere)."""
    from bigslide.napari._qt import window_part

    try:
        info = window_part(viewer, "_qt_viewer").canvas.font_info()  # napari 0.9's canvas
        return info.font_manager.get_font(info.face)
    except Exception:  # another napari, a closed window: nothing to warm
        return None
