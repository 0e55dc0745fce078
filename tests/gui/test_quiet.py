"""Opening the panels the way napari's Plugins menu does (through its proxy of the viewer, which warns when
a plugin reaches into napari's private parts) prints no warning from bigslide's own code."""

from __future__ import annotations

import warnings
from typing import Any

from bigslide.napari._session import scale_bar_of


def test_the_panels_open_without_a_warning_from_bigslide(make_napari_viewer: Any, qtbot: Any) -> None:
    viewer = make_napari_viewer(show=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
        qtbot.waitUntil(lambda: panels.ready, timeout=120_000)
        qtbot.waitUntil(lambda: scale_bar_of(viewer).visible, timeout=10_000)  # the bar comes later
        qtbot.wait(200)
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "bigslide" in w.filename]
    assert not ours
