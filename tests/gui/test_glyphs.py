"""The canvas's letters are drawn while the viewer waits after the panels open, not in the first frame of
the first slide, map or outline that shows them."""

from __future__ import annotations

from typing import Any

from bigslide.napari._glyphs import CHARACTERS, SCALE_BAR_CHARACTERS, _canvas_font
from bigslide.napari._session import scale_bar_of


def test_every_letter_of_the_canvas_is_drawn_once_the_panels_are_open(
    make_napari_viewer: Any, qtbot: Any
) -> None:
    viewer = make_napari_viewer(show=True)
    font = _canvas_font(viewer)
    assert font is not None, "napari keeps its canvas font elsewhere: the warm-up does nothing"
    assert not set(CHARACTERS) <= set(font._glyphs)  # a fresh canvas has drawn few, if any
    _, panel = viewer.window.add_plugin_dock_widget("bigslide", "Slides")
    qtbot.waitUntil(lambda: panel.ready, timeout=120_000)
    qtbot.waitUntil(lambda: set(CHARACTERS) <= set(font._glyphs), timeout=10_000)
    # the font warmed is the one the canvas's text is drawn with: a letter outside CHARACTERS shown in
    # the legend overlay lands in it
    assert "ß" not in font._glyphs
    viewer.canvas.overlays.text.text = "Maßstab"
    viewer.canvas.overlays.text.visible = True
    qtbot.waitUntil(lambda: "ß" in font._glyphs, timeout=10_000)


def test_the_scale_bar_comes_on_once_its_letters_are_drawn(make_napari_viewer: Any, qtbot: Any) -> None:
    viewer = make_napari_viewer(show=True)
    font = _canvas_font(viewer)
    bar = scale_bar_of(viewer)
    drawn_when_shown: list[set[str]] = []
    bar.events.visible.connect(lambda _e: drawn_when_shown.append(set(font._glyphs)))
    viewer.window.add_plugin_dock_widget("bigslide", "Slides")
    qtbot.waitUntil(lambda: bar.visible, timeout=120_000)
    # its first draw renders none of its letters (nor those vispy measures a line's height by) in the
    # frame that also builds its shaders
    assert set(SCALE_BAR_CHARACTERS) <= drawn_when_shown[0]
