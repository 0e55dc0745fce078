"""DICOM slides dropped onto napari: a .dcm file or its series' folder becomes one lazy multiscale layer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("openslide")
pytest.importorskip("pydicom")

import openslide

from bigslide.napari._reader import get_reader
from bigslide.synthetic.dicom import write_dicom_pyramid
from bigslide.synthetic.pyramid import downsample_pyramid
from tests.conftest import textured_image

MPP = 0.5


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("napari-dicom") / "case-7"
    write_dicom_pyramid(folder, downsample_pyramid(textured_image(600, 900, seed=9), 3), mpp=MPP, tile=256)
    return folder


@pytest.mark.parametrize("given", ["folder", "level_1.dcm"])
def test_a_dicom_slide_opens_through_napari(viewer: Any, series: Path, given: str) -> None:
    from npe2 import PluginManager

    path = series if given == "folder" else series / given
    assert "bigslide" in {r.plugin_name for r in PluginManager.instance().iter_compatible_readers([path])}
    layers = viewer.open(path, plugin="bigslide")
    assert len(layers) == 1
    layer = layers[0]
    assert layer.multiscale
    assert layer.rgb
    reference = openslide.OpenSlide(str(series / "level_0.dcm"))
    assert [level.shape[:2] for level in layer.data] == [(h, w) for w, h in reference.level_dimensions]
    np.testing.assert_allclose(layer.scale, (MPP, MPP))
    assert [str(u) for u in layer.units] == ["micrometer", "micrometer"]
    assert layer.metadata["path"] == str(path)
    # what napari draws at the coarsest level is what OpenSlide reads there
    w, h = reference.level_dimensions[-1]
    expected = np.asarray(reference.read_region((0, 0), len(layer.data) - 1, (w, h)))[..., :3]
    np.testing.assert_array_equal(np.asarray(layer.data[-1]), expected)


def test_folders_without_dicom_are_left_to_other_readers(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    assert get_reader(str(tmp_path / "photos")) is None


def test_without_openslide_the_reader_says_how_to_get_it(
    viewer: Any, notifications: list[Any], series: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openslide", None)
    path = series / "level_0.dcm"
    assert viewer.open(path, plugin="bigslide") == []
    messages = [str(n.message) for n in notifications]
    assert len(messages) == 1, messages
    assert messages[0].startswith("bigslide cannot open level_0.dcm: a DICOM slide")
    assert 'pip install "bigslide[openslide]"' in messages[0]
    assert len(viewer.layers) == 0
