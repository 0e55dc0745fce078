"""Fixtures for the napari plugin tests: a real viewer (run under `xvfb-run -a`), tiny synthetic slides."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

GUI_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(GUI_DIR):
            item.add_marker(pytest.mark.gui)


@pytest.fixture(scope="session", autouse=True)
def _sample_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Sample data goes to a temporary cache, never the user's."""
    folder = tmp_path_factory.mktemp("bigslide-cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("BIGSLIDE_CACHE", str(folder))
    yield folder
    patch.undo()


@pytest.fixture(scope="session")
def tiny_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four 512 x 512 slides (two with lesions), `slides.csv` with labels and splits."""
    from bigslide.synthetic.slide_set import make_slide_set

    return make_slide_set(tmp_path_factory.mktemp("tiny-set"), n_slides=4, size=(512, 512), seed=1)


@pytest.fixture
def viewer(make_napari_viewer: Any) -> Any:
    return make_napari_viewer()


@pytest.fixture
def notifications() -> Iterator[list[Any]]:
    """Every napari notification shown during the test (errors included)."""
    from napari.utils.notifications import notification_manager

    seen: list[Any] = []
    notification_manager.notification_ready.connect(seen.append)
    yield seen
    notification_manager.notification_ready.disconnect(seen.append)


@pytest.fixture
def dock(viewer: Any, qtbot: Any) -> Any:
    """Opens one of our dock widgets through napari's plugin machinery (as the Plugins menu does), once
    its content is built (at once when PyTorch is loaded, else when the panels' warm-up has loaded it)."""

    def open_dock(name: str) -> Any:
        _, widget = viewer.window.add_plugin_dock_widget("bigslide", name)
        qtbot.waitUntil(lambda: widget.ready, timeout=120_000)
        return widget

    return open_dock
