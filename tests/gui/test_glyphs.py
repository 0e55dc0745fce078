"""The canvas's letters are drawn while the viewer waits after the panels open, not in the first frame of
the first slide, map or outline that shows them."""

from __future__ import annotations

from typing import Any

from bigslide.napari._glyphs import CHARACTERS, _canvas_font


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
