"""Opening slides through napari's reader machinery: lazy, multiscale, in µm, fast on huge files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tifffile

from bigslide.napari._reader import get_reader
from bigslide.synthetic.pyramid import LazyLevel, downsample_pyramid, write_pyramid
from tests.gui.paint_order import PaintOrder


@pytest.mark.parametrize("flavour", ["svs_slide", "tiff_slide", "ome_slide"])
def test_open_through_napari(viewer: Any, flavour: str, request: pytest.FixtureRequest) -> None:
    written = request.getfixturevalue(flavour)
    layers = viewer.open(written.path, plugin="bigslide")
    assert len(layers) == 1
    layer = layers[0]
    assert layer.multiscale
    assert layer.rgb
    assert len(layer.data) == len(written.levels) == layer.metadata["levels"]
    for level, expected in zip(layer.data, written.levels):
        assert level.shape == expected.shape
        assert level.tile_shape == (256, 256)
    np.testing.assert_allclose(layer.scale, (written.mpp, written.mpp))
    assert [str(u) for u in layer.units] == ["micrometer", "micrometer"]
    assert layer.metadata["path"] == str(written.path)
    assert tuple(layer.metadata["mpp"]) == (written.mpp, written.mpp)
    # the pixels napari would show at the coarsest level are the file's
    np.testing.assert_array_equal(np.asarray(layer.data[-1]), written.levels[-1])


def test_rejects_what_it_cannot_read(
    viewer: Any, notifications: list[Any], tmp_path: Path, svs_slide: Any
) -> None:
    png = tmp_path / "picture.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    renamed = tmp_path / "slide.txt"
    renamed.write_bytes(svs_slide.path.read_bytes())
    for path in (png, renamed):  # not a slide's name: left to other readers
        assert get_reader(str(path)) is None, path
    fake = tmp_path / "fake.svs"
    fake.write_text("not a slide")
    truncated = tmp_path / "truncated.svs"
    truncated.write_bytes(svs_slide.path.read_bytes()[:3000])
    empty = tmp_path / "empty.ndpi"
    empty.write_bytes(b"")
    folder = tmp_path / "folder.svs"
    folder.mkdir()
    reasons = {
        fake: "not a TIFF-based slide",
        truncated: "truncated file",
        empty: "the file is empty",
        tmp_path / "missing.svs": "cannot read the file",
        folder: "it is a folder",
    }
    for path, reason in reasons.items():
        start = time.perf_counter()
        reader = get_reader(str(path))
        assert reader is not None, path
        assert time.perf_counter() - start < 0.5
        notifications.clear()
        if path.is_file():  # no layer, no exception, no dialog
            assert viewer.open(path, plugin="bigslide") == []
        else:  # napari itself refuses a missing path, and asks no file reader about a folder
            assert reader(str(path)) == [(None,)]
        messages = [str(n.message) for n in notifications]
        assert len(messages) == 1, messages
        assert messages[0].startswith(f"bigslide cannot open {path.name}: "), messages
        assert reason in messages[0], messages
        assert "\n" not in messages[0]
    assert len(viewer.layers) == 0
    assert get_reader(str(svs_slide.path)) is not None


def test_openslide_formats_open_through_openslide_and_a_broken_one_is_named(
    viewer: Any, notifications: list[Any], tmp_path: Path, svs_slide: Any
) -> None:
    """Leica (.scn), Ventana (.bif), 3DHISTECH (.mrxs) and Hamamatsu VMS files are offered to bigslide's
    reader and read through OpenSlide, which recognises a slide by its content (here an Aperio file
    renamed .scn); a 3DHISTECH index without its data folder is named in one line, not a crash."""
    scn = tmp_path / "scan.scn"
    scn.write_bytes(svs_slide.path.read_bytes())
    [layer] = viewer.open(scn, plugin="bigslide")
    assert type(layer.data[0].cache.slide._handle).__name__ == "OpenSlideHandle"
    np.testing.assert_array_equal(np.asarray(layer.data[-1]), svs_slide.levels[-1])
    mrxs = tmp_path / "case.mrxs"
    mrxs.write_text("[GENERAL]\nSLIDE_VERSION=01.03\n")  # the index alone, its Data folder missing
    notifications.clear()
    assert viewer.open(mrxs, plugin="bigslide") == []
    [message] = [str(n.message) for n in notifications]
    assert message.startswith("bigslide cannot open case.mrxs: not a slide OpenSlide can read"), message
    for name in ("a.bif", "a.VMS", "a.vmu", "a.MRXS"):
        assert get_reader(str(tmp_path / name)) is not None, name


@pytest.fixture(scope="session")
def huge_slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 16,384 x 24,576 px slide (1.2 GB of RGB at level 0), mostly empty glass, written lazily."""
    blank = np.full((1024, 1024, 3), 240, np.uint8)
    spot = blank.copy()
    spot[256:768, 256:768] = (150, 60, 140)
    levels = [
        LazyLevel(16384 // 2**i, 24576 // 2**i, lambda ty, tx: spot if (ty + tx) % 7 == 0 else blank)
        for i in range(3)
    ]
    path = tmp_path_factory.mktemp("huge") / "huge.svs"
    return write_pyramid(path, levels, mpp=0.25, tile=1024, compression="zstd")


def test_huge_slide_opens_lazily(viewer: Any, qtbot: Any, huge_slide: Path) -> None:
    start = time.perf_counter()
    [layer] = viewer.open(huge_slide, plugin="bigslide")
    opened = time.perf_counter() - start
    viewer.window._qt_window.show()
    qtbot.wait(300)  # let napari draw what is on screen
    assert opened < 2.0
    assert layer.data[0].shape == (16384, 24576, 3)
    slide = layer.data[0].cache.slide
    decoded = slide.pixels_read
    assert decoded[slide.level_count - 1] > 0  # napari did draw, from the file's coarsest level
    assert decoded[0] == 0
    # below its 4096 x 6144 coarsest level, overviews down to the screen's size: what napari shows
    assert len(layer.data) == slide.level_count + 3
    assert [d.shape[:2] for d in layer.data[-3:]] == [(2048, 3072), (1024, 1536), (512, 768)]


def test_a_tile_that_will_not_decode_is_striped_named_once_and_marked_in_the_slides_table(
    viewer: Any, dock: Any, qtbot: Any, tmp_path: Path, notifications: list[Any]
) -> None:
    rng = np.random.default_rng(4)
    image = np.clip(rng.normal(170, 40, (768, 1024, 3)), 0, 255).astype(np.uint8)
    levels = downsample_pyramid(image, 3)
    path = write_pyramid(tmp_path / "unreadable.svs", levels, mpp=0.5, tile=128, compression="jpeg")
    with tifffile.TiffFile(path) as tif:  # the coarsest level's second tile: its JPEG data overwritten
        page = tif.pages[len(tif.pages) - 1]
        offset, count = page.dataoffsets[1], page.databytecounts[1]
        assert page.shape[:2] == levels[-1].shape[:2]
    with path.open("r+b") as f:
        f.seek(offset + 2)
        f.write(bytes([0xFF, 0xC4, 0x00, 0x01]) * ((count - 4) // 4))
    slides = dock("Slides")
    [layer] = viewer.open(path, plugin="bigslide")  # no exception from napari's first draw
    viewer.window._qt_window.show()
    qtbot.wait(300)
    coarsest = np.asarray(layer.data[-1])
    damaged = coarsest[:128, 128:256].astype(int)  # grey stripes: never read as glass (255) or tissue
    assert set(np.unique(damaged)) == {96, 160}
    assert (damaged[:, :, 0] == 96).mean() == pytest.approx(0.5, abs=0.05)
    rest = np.abs(coarsest[128:].astype(float) - levels[-1][128:])  # the rest: the file's pixels (JPEG)
    assert rest.mean() < 10
    qtbot.waitUntil(lambda: any("unreadable.svs" in str(n.message) for n in notifications), timeout=5000)
    np.asarray(layer.data[-1])  # read again: told once per slide, not per read
    qtbot.wait(100)
    told = [str(n.message) for n in notifications if "unreadable.svs" in str(n.message)]
    assert len(told) == 1, told
    assert "cannot decode file tile (row 0, col 1) of level 2" in told[0]
    assert "unreadable.svs is damaged" in told[0]
    assert "grey stripes" in told[0]
    # its row in the Slides table says so, and the panel's status line names it
    qtbot.waitUntil(lambda: "damaged" in slides.table.item(0, slides.column("Slide")).text(), timeout=5000)
    assert slides.table.item(0, slides.column("Slide")).text() == "unreadable.svs — damaged"
    assert "cannot decode file tile" in slides.table.item(0, slides.column("Slide")).toolTip()
    assert "Damaged (some tiles will not decode" in slides.status.text()
    assert "unreadable.svs" in slides.status.text()


def test_bigslide_is_the_reader_napari_picks_for_slide_files(
    viewer: Any, dock: Any, qtbot: Any, svs_slide: Any, notifications: list[Any]
) -> None:
    from napari.plugins.utils import get_preferred_reader
    from napari.settings import get_settings

    get_settings().plugins.extension2reader = {"*.ndpi": "some-other-reader"}  # a user's own choice
    dock("Slides")
    assert get_preferred_reader(svs_slide.path) == "bigslide"  # File ▸ Open asks no question
    assert get_preferred_reader("scan.dcm") == "bigslide"
    assert get_preferred_reader("scan.ndpi") == "some-other-reader"  # kept
    assert get_preferred_reader("stack.tif") is None  # TIFFs are other images too: the user's call

    # a slide opened through napari's own reader (in pixels) is opened again through bigslide's
    viewer.open(svs_slide.path, plugin="napari")
    qtbot.waitUntil(lambda: any(layer.metadata.get("bigslide_role") == "slide" for layer in viewer.layers))
    [layer] = viewer.layers
    assert layer.source.reader_plugin == "bigslide"
    assert [str(u) for u in layer.units] == ["micrometer", "micrometer"]
    assert any("opened again with bigslide's reader" in str(n.message) for n in notifications)


def test_opening_a_slide_names_it_on_the_status_bar_before_napari_makes_its_layer(
    viewer: Any, qtbot: Any, svs_slide: Any
) -> None:
    """napari makes a slide's layer on the GUI thread, a freeze of a quarter to half a second on two cores
    for the first slide: the status bar names the slide, painted (on screen), before that."""
    from qtpy.QtWidgets import QLabel

    window = viewer.window._qt_window
    window.setGeometry(0, 0, 1600, 1000)
    window.show()
    qtbot.waitExposed(window)
    order = PaintOrder(viewer, window.statusBar().findChildren(QLabel))
    viewer.open(svs_slide.path, plugin="bigslide")
    order.stop()

    assert len(order.layers()) == 1, order.seen
    assert f"Opening {svs_slide.path.name}…" in order.painted_before_the_first_layer(), order.seen


def test_asking_for_a_reader_opens_nothing_until_napari_reads(svs_slide: Any, viewer: Any) -> None:
    # napari asks every plugin, and may then pick another reader or the person cancel its dialog
    def open_on_the_slide() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir() if _target(fd) == str(svs_slide.path))

    before = open_on_the_slide()
    readers = [get_reader(str(svs_slide.path)) for _ in range(20)]
    assert all(reader is not None for reader in readers)
    assert open_on_the_slide() == before
    layers = viewer.open(svs_slide.path, plugin="bigslide")  # read: the slide is opened for its layer
    assert len(layers) == 1
    assert open_on_the_slide() > before


def _target(link: Path) -> str:
    try:
        return str(link.readlink())
    except OSError:  # closed while listed
        return ""


def test_a_slide_opened_again_is_selected_not_opened_twice(
    viewer: Any, notifications: list[Any], svs_slide: Any, tmp_path: Path
) -> None:
    first = viewer.open(svs_slide.path, plugin="bigslide")
    viewer.add_points([[0, 0]])  # another layer selected meanwhile
    notifications.clear()
    again = viewer.open(svs_slide.path, plugin="bigslide")
    assert again == []
    assert [layer.name for layer in viewer.layers if layer.metadata.get("path")] == [first[0].name]
    assert viewer.layers.selection.active is first[0]
    messages = [str(n.message) for n in notifications]
    assert messages == [f"{svs_slide.path.name} is open already (layer '{first[0].name}'): selected"]
