"""Notifications one at a time: a new one replaces the one still up (they never stack and cut each other
off), and a warning goes once the person has done what it asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gui.test_typed_numbers import type_into


def _open_toasts() -> list[str]:
    from bigslide.napari._toasts import shown

    return [text for _toast, text in shown()]


@pytest.fixture
def shown_viewer(make_napari_viewer: Any) -> Any:
    viewer = make_napari_viewer(show=True)  # napari shows toasts only over a visible window
    viewer.window._qt_window.resize(1600, 1000)
    return viewer


def unstated_slide_open(viewer: Any, qtbot: Any, folder: Path) -> Any:
    """The Slides panel of `viewer` with a slide that states no pixel size opened; the panel."""
    from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
    from bigslide.synthetic.slides import synthesize_slide

    pixels = synthesize_slide((640, 512), lesions=0, seed=3).rgb
    path = write_pyramid(folder / "unstated.tif", downsample_pyramid(pixels, 2), flavour="tiff", mpp=None)
    _, slides = viewer.window.add_plugin_dock_widget("bigslide", "Slides")
    qtbot.waitUntil(lambda: slides.ready, timeout=120_000)
    viewer.open(path, plugin="bigslide")
    return slides


def test_a_new_notification_replaces_the_one_still_up(shown_viewer: Any, qtbot: Any) -> None:
    from bigslide.napari._toasts import show_error, show_warning, withdraw

    show_warning("slide-a: the file states no pixel size")
    qtbot.waitUntil(lambda: len(_open_toasts()) == 1)
    show_error("slide-b: cannot decode file tile (row 1, col 2)")
    qtbot.wait(100)
    assert _open_toasts() == ["slide-b: cannot decode file tile (row 1, col 2)"]
    withdraw("slide-a")  # another toast's cause: nothing closes
    assert len(_open_toasts()) == 1
    withdraw("slide-b:")
    qtbot.waitUntil(lambda: _open_toasts() == [])


def test_the_missing_pixel_size_warning_goes_when_it_is_typed(
    shown_viewer: Any, qtbot: Any, tmp_path: Path
) -> None:
    slides = unstated_slide_open(shown_viewer, qtbot, tmp_path)
    qtbot.waitUntil(lambda: any("no pixel size" in t for t in _open_toasts()), timeout=10_000)
    type_into(qtbot, slides.slide_mpp, "0.5")
    qtbot.waitUntil(lambda: not any("no pixel size" in t for t in _open_toasts()), timeout=5_000)
    assert shown_viewer.layers[0].metadata["mpp"] == (0.5, 0.5)


def test_a_failed_count_goes_when_the_pixel_size_it_asked_for_is_typed(
    shown_viewer: Any, qtbot: Any, tmp_path: Path
) -> None:
    slides = unstated_slide_open(shown_viewer, qtbot, tmp_path)
    slides.set_label(0, "tumor")
    slides.count_tiles()
    failed = "Counting tiles failed on 1 slide: unstated.tif: the file states no pixel size"
    qtbot.waitUntil(lambda: any(t.startswith(failed) for t in _open_toasts()), timeout=30_000)
    type_into(qtbot, slides.slide_mpp, "0.5")
    qtbot.waitUntil(
        lambda: not any(t.startswith("Counting tiles failed") for t in _open_toasts()), timeout=5_000
    )
    slides.count_tiles()
    qtbot.waitUntil(slides.count_button.isEnabled, timeout=30_000)
    assert slides.session.rows[0].tiles


def test_a_finished_run_names_its_folder_not_the_whole_path() -> None:
    """The toast of a finished run stays one short line (napari cuts a long one off); the panel's status
    line keeps the whole path."""
    from bigslide.napari._toasts import saved_in

    checkpoint = Path("/data/studies/lung/runs/abmil_acc-20261129-085152/checkpoints/last.pt")
    assert saved_in(checkpoint) == "checkpoint last.pt in run abmil_acc-20261129-085152"
    assert saved_in(Path("/data/models/best.pt")) == "checkpoint best.pt in folder models"
    assert saved_in(None) == "no checkpoint was saved"
