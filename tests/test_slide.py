from __future__ import annotations

import struct
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import tifffile
import tiffslide

from bigslide.errors import SlideError
from bigslide.wsi.slide import open_slide
from tests.conftest import MakeSlide, WrittenSlide, textured_image

FLAVOURS = ["svs_slide", "tiff_slide", "ome_slide"]


@pytest.fixture(params=FLAVOURS)
def written(request: pytest.FixtureRequest) -> WrittenSlide:
    return request.getfixturevalue(request.param)


def test_geometry_matches_written_pyramid(written: WrittenSlide) -> None:
    with open_slide(written.path) as slide:
        assert slide.dimensions == (1300, 1000)
        assert slide.level_count == 3
        assert slide.level_dimensions == ((1300, 1000), (650, 500), (325, 250))
        assert slide.level_downsamples == (1.0, 2.0, 4.0)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_whole_level_pixels_equal_written(written: WrittenSlide, level: int) -> None:
    with open_slide(written.path) as slide:
        w, h = slide.level_dimensions[level]
        region = slide.read_region((0, 0), level, (w, h))
    assert region.dtype == np.uint8
    np.testing.assert_array_equal(region, written.levels[level])


@pytest.mark.parametrize(
    ("location", "level", "size"),
    [((300, 200), 0, (257, 130)), ((300, 200), 1, (100, 60)), ((1000, 600), 2, (70, 40))],
)
def test_region_location_is_level0(
    written: WrittenSlide, location: tuple[int, int], level: int, size: tuple[int, int]
) -> None:
    ds = 2**level
    x, y = location[0] // ds, location[1] // ds
    expected = written.levels[level][y : y + size[1], x : x + size[0]]
    with open_slide(written.path) as slide:
        np.testing.assert_array_equal(slide.read_region(location, level, size), expected)


@pytest.mark.parametrize(
    ("fixture", "mpp"), [("svs_slide", (0.5, 0.5)), ("tiff_slide", (0.25, 0.25)), ("ome_slide", (0.25, 0.25))]
)
def test_mpp_parsed(request: pytest.FixtureRequest, fixture: str, mpp: tuple[float, float]) -> None:
    with open_slide(request.getfixturevalue(fixture).path) as slide:
        assert slide.mpp == pytest.approx(mpp, rel=1e-6)


@pytest.mark.parametrize("flavour", ["svs", "tiff", "ome"])
def test_mpp_absent_is_none(make_slide: MakeSlide, flavour: str) -> None:
    written = make_slide(textured_image(300, 300), flavour=flavour, n_levels=1, mpp=None)
    with open_slide(written.path) as slide:
        assert slide.mpp is None
        assert slide.level_count == 1


@pytest.mark.parametrize(
    ("size", "unit", "mpp"),
    [(250.0, "nm", 0.25), (0.5, None, 0.5), (4.4e-4, "mm", 0.44), (1.0e-5, "in", 0.254)],
)
def test_ome_tiff_pixel_size_stated_only_in_its_xml_is_read(
    tmp_path: Path, size: float, unit: str | None, mpp: float
) -> None:
    """Bio-Formats and QuPath state an OME-TIFF's pixel size in its XML only (no TIFF resolution tags)."""
    path = tmp_path / "export.ome.tif"
    image = textured_image(512, 512)
    metadata: dict[str, object] = {"axes": "YXS", "PhysicalSizeX": size, "PhysicalSizeY": size}
    if unit is not None:
        metadata.update(PhysicalSizeXUnit=unit, PhysicalSizeYUnit=unit)
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(image, tile=(256, 256), photometric="rgb", subifds=1, metadata=metadata)
        tif.write(image[::2, ::2], tile=(256, 256), photometric="rgb", subfiletype=1)
    assert tiffslide.TiffSlide(path).properties["tiffslide.mpp-x"] is None  # tiffslide leaves it unread
    with open_slide(path) as slide:
        assert slide.mpp == pytest.approx((mpp, mpp), rel=1e-6)
        assert slide.level_count == 2


def test_a_tiff_whose_first_image_is_a_small_photograph_is_refused_naming_both(tmp_path: Path) -> None:
    """A converter may write a slide's macro photograph first: read as the slide, it would train on it."""
    path = tmp_path / "converted.ome.tif"
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(
            np.full((300, 800, 3), 200, np.uint8),
            photometric="rgb",
            metadata={"axes": "YXS", "Name": "macro"},
        )
        tif.write(
            textured_image(1024, 1024),
            tile=(256, 256),
            photometric="rgb",
            metadata={"axes": "YXS", "Name": "scan"},
        )
    with pytest.raises(
        SlideError,
        match=r"converted\.ome\.tif: its first image \(800 x 300 px 'macro'\) is not its "
        r"largest \(1024 x 1024 px 'scan', image 1 of 2\).*bfconvert -series",
    ):
        open_slide(path)


def test_a_tiff_whose_levels_are_written_coarse_first_is_refused_not_read_coarse(tmp_path: Path) -> None:
    """Pages level 1, level 0, level 2: the first was read as the slide, at half its resolution, without a
    word (level 0 has four times its pixels, not more)."""
    path = tmp_path / "coarse_first.tif"
    image = textured_image(1202, 1802)
    with tifffile.TiffWriter(path) as tif:
        for level, mpp in ((1, 0.5), (0, 0.25), (2, 1.0)):
            step = 2**level
            tif.write(
                image[::step, ::step],
                tile=(128, 128),
                photometric="rgb",
                resolution=(1e4 / mpp, 1e4 / mpp),
                resolutionunit="CENTIMETER",
                metadata=None,
            )
    with pytest.raises(
        SlideError,
        match=r"coarse_first\.tif: its first image \(901 x 601 px\) is not its largest \(1802 x 1202 px, "
        r"image 1 of \d\); .* read at a coarser resolution",
    ):
        open_slide(path)


def test_an_ome_tiff_whose_levels_are_out_of_size_order_is_refused(tmp_path: Path) -> None:
    """Sub-resolutions written 4x then 2x: the code takes a lower level number for a finer level."""
    path = tmp_path / "unordered.ome.tif"
    image = textured_image(1024, 1024)
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(image, tile=(128, 128), photometric="rgb", subifds=2, metadata={"axes": "YXS"})
        for step in (4, 2):
            tif.write(image[::step, ::step], tile=(128, 128), photometric="rgb", subfiletype=1)
    with pytest.raises(
        SlideError,
        match=r"unordered\.ome\.tif: its pyramid levels are not in size order "
        r"\(1024 x 1024, 256 x 256, 512 x 512 px\)",
    ):
        open_slide(path)


def test_an_svs_of_a_small_region_is_read_though_its_macro_photograph_is_larger(tmp_path: Path) -> None:
    path = tmp_path / "region.svs"
    scan = textured_image(256, 256)
    with tifffile.TiffWriter(path) as tif:
        head = "Aperio Image Library v12.0.0\r\n256x256 [0,0 256x256] (256x256) RGB|AppMag = 20|MPP = 0.5"
        tif.write(scan, tile=(256, 256), photometric="rgb", description=head, metadata=None)
        tif.write(scan[::4, ::4], photometric="rgb", description="256x256 -> 64x64", metadata=None)
        macro = np.full((600, 1500, 3), 200, np.uint8)
        tif.write(
            macro,
            photometric="rgb",
            subfiletype=9,
            description="Aperio Image Library v12.0.0\r\nmacro 1500x600",
            metadata=None,
        )
    with open_slide(path) as slide:
        assert slide.dimensions == (256, 256)
        np.testing.assert_array_equal(slide.read_region((0, 0), 0, (256, 256)), scan)


@pytest.mark.parametrize("channels", [3, 4])
def test_an_image_stored_plane_by_plane_is_said_to_be_so(tmp_path: Path, channels: int) -> None:
    """RGB saved plane by plane, or a fluorescence image of several channels: no brightfield slide."""
    path = tmp_path / "planes.tif"
    planes = np.stack([textured_image(256, 256, seed=c)[..., 0] for c in range(channels)])
    tifffile.imwrite(
        path,
        planes,
        tile=(128, 128),
        photometric="rgb" if channels == 3 else "minisblack",
        planarconfig="separate",
    )
    with pytest.raises(
        SlideError, match=r"planes\.tif: unsupported slide layout \(its image is stored as separate planes"
    ):
        open_slide(path)


@pytest.mark.parametrize("dpi", [72.0, 300.0])
def test_a_print_resolution_is_no_pixel_size(tmp_path: Path, dpi: float) -> None:
    """72 dpi (353 µm per pixel) is an image editor's default, not a scanner's: the slide states none."""
    path = tmp_path / "edited.tif"
    tifffile.imwrite(
        path,
        textured_image(512, 512),
        tile=(256, 256),
        photometric="rgb",
        resolution=(dpi, dpi),
        resolutionunit="INCH",
    )
    with open_slide(path) as slide:
        assert slide.mpp is None


@pytest.mark.parametrize("mpp", [1e-9, 0.001])
def test_a_pixel_size_finer_than_light_resolves_is_no_pixel_size(tmp_path: Path, mpp: float) -> None:
    """An Aperio MPP of 1e-9 µm (a garbage or mis-scaled value) was taken as stated: tiles of 224 px at
    0.5 µm/px then covered 10^8 level-0 pixels. Like a print resolution, it states no pixel size."""
    path = tmp_path / "garbage.tif"
    description = (
        f"Aperio Image Library v12.0.0\r\n512x512 [0,0 512x512] (256x256) RGB|AppMag = 40|MPP = {mpp}"
    )
    tifffile.imwrite(
        path,
        textured_image(512, 512),
        tile=(256, 256),
        photometric="rgb",
        description=description,
        metadata=None,
    )
    with open_slide(path) as slide:
        assert slide.mpp is None


def test_region_across_border_is_padded_white(svs_slide: WrittenSlide) -> None:
    image = svs_slide.levels[0]
    with open_slide(svs_slide.path) as slide:
        corner = slide.read_region((1290, 995), 0, (20, 10))
        before = slide.read_region((-3, -2), 1, (6, 5))
        outside = slide.read_region((5000, 5000), 0, (4, 4))
    assert corner.shape == (10, 20, 3)
    np.testing.assert_array_equal(corner[:5, :10], image[995:, 1290:])
    assert (corner[5:] == 255).all()
    assert (corner[:, 10:] == 255).all()
    # level 1: (-3, -2) level-0 is (-2, -1) at level 1 (floor), so 2 white columns and 1 white row
    assert (before[:1] == 255).all()
    assert (before[:, :2] == 255).all()
    np.testing.assert_array_equal(before[1:, 2:], svs_slide.levels[1][:4, :4])
    assert (outside == 255).all()


def test_multipage_pyramid_and_single_level(tmp_path: Path) -> None:
    image = textured_image(600, 520, seed=3)
    levels = [image, image[::2, ::2].copy()]
    path = tmp_path / "pages.tif"
    with tifffile.TiffWriter(path) as tif:
        for index, level in enumerate(levels):
            tif.write(
                level,
                tile=(128, 128),
                photometric="rgb",
                subfiletype=1 if index else 0,
                resolution=(1e4 / 0.5, 1e4 / 0.5),
                resolutionunit="CENTIMETER",
            )
    with open_slide(path) as slide:
        assert slide.level_dimensions == ((520, 600), (260, 300))
        assert slide.mpp == pytest.approx((0.5, 0.5))
        np.testing.assert_array_equal(slide.read_region((0, 0), 1, (260, 300)), levels[1])
    flat = tmp_path / "flat.tif"
    tifffile.imwrite(flat, image, photometric="rgb")
    with open_slide(flat) as slide:
        assert slide.level_count == 1
        np.testing.assert_array_equal(slide.read_region((10, 20), 0, (30, 40)), image[20:60, 10:40])


def test_pyramid_is_lazy_and_decodes_only_the_tiles_a_slice_covers(make_slide: MakeSlide) -> None:
    written = make_slide(textured_image(700, 900, seed=1), flavour="tiff", tile=128)
    with open_slide(written.path) as slide:
        pyramid = slide.pyramid()
        assert slide.pixels_read[0] == 0  # nothing decoded yet
        assert [p.shape for p in pyramid] == [(700, 900, 3), (350, 450, 3), (175, 225, 3)]
        assert all(p.dtype == np.uint8 for p in pyramid)
        np.testing.assert_array_equal(pyramid[0][130:250, 10:120], written.levels[0][130:250, 10:120])
        assert slide.pixels_read[0] == 128 * 128  # one file tile
        np.testing.assert_array_equal(pyramid[0][130:250:3, 10:120:2], written.levels[0][130:250:3, 10:120:2])
        assert slide.pixels_read[0] == 128 * 128  # decoded once, kept
        np.testing.assert_array_equal(pyramid[0][699, 5:9, 1], written.levels[0][699, 5:9, 1])
        for level, lazy in enumerate(pyramid):
            np.testing.assert_array_equal(np.asarray(lazy), written.levels[level])


def test_the_coarsest_level_is_decoded_ahead_of_the_viewer_and_only_once(make_slide: MakeSlide) -> None:
    # the whole-slide view's level: 4 x 4 file tiles, decoded on a thread while the viewer builds its layer
    written = make_slide(textured_image(1024, 1024, seed=3), flavour="tiff", tile=64, n_levels=3)
    coarsest = written.levels[-1].shape[0] * written.levels[-1].shape[1]
    with open_slide(written.path) as slide:
        pyramid = slide.pyramid()
        deadline = time.monotonic() + 30
        while slide.pixels_read[2] < coarsest and time.monotonic() < deadline:
            time.sleep(0.01)
        assert slide.pixels_read[2] == coarsest  # nothing asked for it yet
        seen = np.asarray(pyramid[2])
        np.testing.assert_array_equal(seen, written.levels[2])
        assert dict(slide.pixels_read) == {2: coarsest}  # the view read what was decoded ahead
        # each read is a view of the level kept whole: no fresh array filled on the viewer's thread
        part = pyramid[2][10:20, 30:50]
        assert np.shares_memory(part, seen)
        assert not part.flags.writeable
        np.testing.assert_array_equal(part, written.levels[2][10:20, 30:50])
    with open_slide(written.path) as slide:  # read at once: it waits for the decode under way
        np.testing.assert_array_equal(np.asarray(slide.pyramid()[2]), written.levels[2])
        assert dict(slide.pixels_read) == {2: coarsest}


def test_closing_a_slide_stops_the_decode_ahead_and_waits_for_it(
    make_slide: MakeSlide, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slide closed while its coarsest level is still being decoded ahead (a layer deleted as it opens)
    stops that decode and waits for it: no thread reads the closed file, none lingers."""
    import threading

    from bigslide.wsi.slide import Slide

    written = make_slide(textured_image(1024, 1024, seed=3), flavour="tiff", tile=64, n_levels=3)
    reads: list[tuple[float, int]] = []
    read = Slide.read_file_tile

    def slow(self: Slide, level: int, row: int, col: int) -> np.ndarray:
        time.sleep(0.1)  # 16 tiles on at most MAX_TILE_THREADS (4) threads: 0.4 s at the least
        tile = read(self, level, row, col)
        reads.append((time.monotonic(), level))
        return tile

    monkeypatch.setattr(Slide, "read_file_tile", slow)
    with open_slide(written.path) as slide:
        slide.pyramid()  # the coarsest level's 16 file tiles start decoding on their threads
        time.sleep(0.08)
    closed = time.monotonic()
    assert len(reads) < 16  # stopped part way
    assert all(when <= closed for when, _level in reads)
    assert not [
        t for t in threading.enumerate() if t.name.startswith(("bigslide-tiles", "bigslide-prefetch"))
    ]


def test_thumbnail_reads_smallest_sufficient_level(svs_slide: WrittenSlide) -> None:
    with open_slide(svs_slide.path) as slide:
        thumb = slide.thumbnail(400)
        assert thumb.shape == (308, 400, 3)
        assert set(slide.pixels_read) == {1}
        small = slide.thumbnail(325)
        np.testing.assert_array_equal(small, svs_slide.levels[2])
        assert slide.level_dimensions[0] == (1300, 1000)
        assert 0 not in slide.pixels_read


@pytest.mark.parametrize(
    ("downsample", "level"), [(0.5, 0), (1.0, 0), (1.9, 0), (2.0, 1), (3.5, 1), (4.0, 2), (64.0, 2)]
)
def test_best_level_for_downsample(svs_slide: WrittenSlide, downsample: float, level: int) -> None:
    with open_slide(svs_slide.path) as slide:
        assert slide.best_level_for_downsample(downsample) == level


def _bad_file(kind: str, folder: Path, good: Path) -> Path:
    data = good.read_bytes()
    path = folder / f"{kind}.svs"
    if kind == "missing":
        return path
    if kind == "directory":
        path.mkdir()
    elif kind == "text":
        path.write_text("this is not a slide\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated_header":
        path.write_bytes(data[:100])
    elif kind == "truncated_half":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "cut_before_its_pyramid":  # level 0 whole, the pages of the other levels gone
        with tifffile.TiffFile(good) as tif:
            level0 = tif.pages[0]
            ends = max(o + n for o, n in zip(level0.dataoffsets, level0.databytecounts))
            following = min(page.offset for page in tif.pages[1:] if page.offset > ends)
        path.write_bytes(data[:following])
    elif kind == "header_only":  # a TIFF header whose first page offset is 0: no image at all
        path.write_bytes(b"II*\x00" + bytes(2000))
    elif kind == "grey16":
        tifffile.imwrite(path, np.zeros((64, 64), np.uint16), tile=(16, 16))
    return path


@pytest.mark.parametrize(
    "kind",
    [
        "missing",
        "directory",
        "text",
        "empty",
        "truncated_header",
        "truncated_half",
        "cut_before_its_pyramid",
        "header_only",
        "grey16",
    ],
)
def test_bad_files_raise_slide_error_naming_path(tmp_path: Path, svs_slide: WrittenSlide, kind: str) -> None:
    path = _bad_file(kind, tmp_path, svs_slide.path)
    with pytest.raises(SlideError) as info:
        open_slide(path)
    assert str(path) in str(info.value)
    assert "this environment has" not in str(info.value)  # the readers' versions fit: the file is at fault
    if kind == "cut_before_its_pyramid":
        assert "the file is cut short" in str(info.value)
    if kind == "header_only":
        assert "holds no image" in str(info.value)


def test_a_cut_file_is_said_once_without_tifffiles_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """tifffile logs each layout it tries on a damaged file ("<TiffFile …> shaped series raised …") to
    stderr, noise before the error that names the file and says what is wrong."""
    whole = tmp_path / "whole.tif"
    with tifffile.TiffWriter(whole) as tif:
        tif.write(
            textured_image(1024, 1024), tile=(256, 256), compression="zlib", photometric="rgb", subifds=1
        )
        tif.write(
            textured_image(512, 512), tile=(256, 256), compression="zlib", photometric="rgb", subfiletype=1
        )
    cut = tmp_path / "cut.tif"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 10])
    with pytest.raises(SlideError, match=r"cut\.tif: "):
        open_slide(cut)
    assert not [r.getMessage() for r in caplog.records if "series raised" in r.getMessage()]


def test_a_tifffile_tiffslide_does_not_support_is_named(
    svs_slide: WrittenSlide, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a newer tifffile than tiffslide declares does to every file: an error about zarr groups
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "2099.1.1" if name == "tifffile" else real(name))

    def misread(path: object) -> None:
        raise ValueError("No group found in store ZarrTiffStore at path ''")

    monkeypatch.setattr(tiffslide, "TiffSlide", misread)
    with pytest.raises(SlideError) as info:
        open_slide(svs_slide.path)
    message = str(info.value)
    assert str(svs_slide.path) in message
    assert f"tiffslide {real('tiffslide')} needs tifffile<" in message
    assert "this environment has tifffile 2099.1.1" in message


def test_missing_level_raises_slide_error(svs_slide: WrittenSlide) -> None:
    with open_slide(svs_slide.path) as slide, pytest.raises(SlideError, match="level 3"):
        slide.read_region((0, 0), 3, (10, 10))


def test_reads_from_several_threads_agree(svs_slide: WrittenSlide) -> None:
    starts = [(x, y) for y in range(0, 900, 150) for x in range(0, 1200, 150)]
    with open_slide(svs_slide.path) as slide, ThreadPoolExecutor(4) as pool:
        regions = list(pool.map(lambda xy: slide.read_region(xy, 0, (100, 100)), starts))
    for (x, y), region in zip(starts, regions):
        np.testing.assert_array_equal(region, svs_slide.levels[0][y : y + 100, x : x + 100])


@pytest.mark.parametrize("flavour", ["svs", "tiff", "ome"])
def test_file_tiles_decoded_from_the_file_are_the_written_pixels(
    flavour: str, svs_slide: WrittenSlide, tiff_slide: WrittenSlide, ome_slide: WrittenSlide
) -> None:
    written = {"svs": svs_slide, "tiff": tiff_slide, "ome": ome_slide}[flavour]
    with open_slide(written.path) as slide:
        for level, pixels in enumerate(written.levels):
            th, tw = slide.tile_shape(level)
            h, w = pixels.shape[:2]
            for row in range(-(-h // th)):
                for col in range(-(-w // tw)):
                    expected = pixels[row * th : (row + 1) * th, col * tw : (col + 1) * tw]
                    np.testing.assert_array_equal(slide.read_file_tile(level, row, col), expected)


def test_openslide_and_tiffslide_give_the_same_pixels(svs_slide: WrittenSlide) -> None:
    with (
        open_slide(svs_slide.path, backend="tiffslide") as tiff,
        open_slide(svs_slide.path, backend="openslide") as osr,
    ):
        assert osr.level_dimensions == tiff.level_dimensions
        for level in range(tiff.level_count):
            for location in [(0, 0), (-7, 5), (900, 700)]:
                np.testing.assert_array_equal(
                    osr.read_region(location, level, (300, 200)),
                    tiff.read_region(location, level, (300, 200)),
                )
        np.testing.assert_array_equal(np.asarray(osr.pyramid()[1]), np.asarray(tiff.pyramid()[1]))


def test_openslide_formats_are_opened_with_openslide_when_it_is_installed(tmp_path: Path) -> None:
    from bigslide.wsi.openslide_backend import openslide_available

    fake = tmp_path / "case.mrxs"
    fake.write_bytes(b"not a slide")
    expected = "not a slide OpenSlide can read" if openslide_available() else "not a readable TIFF slide"
    with pytest.raises(SlideError, match=rf"case\.mrxs: {expected}"):
        open_slide(fake)


def test_a_viewer_slice_of_many_tiles_decodes_them_on_the_tile_threads(
    make_slide: MakeSlide, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice that needs many tiles not yet decoded (a slide's coarsest level, as napari first draws it)
    decodes them on the viewer's tile threads, and gives the written pixels, damaged tiles striped."""
    import threading

    from bigslide.wsi.slide import Slide
    from bigslide.wsi.slide_view import DAMAGED, PARALLEL_TILES

    written = make_slide(textured_image(600, 1000, seed=9), flavour="svs", mpp=0.5, tile=64, name="many")
    decoded_on: list[str] = []
    read = Slide.read_file_tile

    def recording(self: Slide, level: int, row: int, col: int) -> np.ndarray:
        if level == 0:  # (the coarsest level is decoded ahead, on a thread of its own)
            decoded_on.append(threading.current_thread().name)
        if (level, row, col) == (0, 2, 3):
            raise SlideError(f"{self.path}: cannot decode file tile (row 2, col 3) of level 0 (test)")
        return read(self, level, row, col)

    monkeypatch.setattr(Slide, "read_file_tile", recording)
    errors: list[SlideError] = []
    with open_slide(written.path) as slide:
        level = slide.pyramid(on_error=errors.append)[0]
        pixels = np.asarray(level)
        again = np.asarray(level)  # kept: nothing decoded twice
    tiles = -(-600 // 64) * -(-1000 // 64)
    assert len(decoded_on) == tiles >= PARALLEL_TILES
    assert all(name.startswith("bigslide-tiles") for name in decoded_on)
    assert len(errors) == 1
    expected = written.levels[0].copy()
    damaged = pixels[128:192, 192:256]
    assert set(np.unique(damaged)) == set(DAMAGED)
    expected[128:192, 192:256] = damaged
    np.testing.assert_array_equal(pixels, expected)
    np.testing.assert_array_equal(again, pixels)
    assert not [t for t in threading.enumerate() if t.name.startswith("bigslide-tiles")]  # none lingers


def _halved(image: np.ndarray) -> np.ndarray:
    """2 x 2 block means, rounded half up; a last odd row or column dropped."""
    h, w = image.shape[0] // 2 * 2, image.shape[1] // 2 * 2
    blocks = image[:h, :w].astype(np.uint16)
    sums = blocks[0::2, 0::2] + blocks[1::2, 0::2] + blocks[0::2, 1::2] + blocks[1::2, 1::2]
    return ((sums + 2) // 4).astype(np.uint8)


def test_a_slide_without_small_levels_gets_overviews_for_a_viewer(tmp_path: Path) -> None:
    """A single-level slide larger than OVERVIEW_FROM: the viewer's pyramid halves it until it fits
    OVERVIEW_SIDE, each overview the block means of the level above, every file tile decoded once."""
    from bigslide.wsi.slide_view import OVERVIEW_FROM, OVERVIEW_SIDE, TileCache, TileLevel

    image = np.random.default_rng(5).integers(0, 256, (4400, 4201, 3), np.uint8)
    flat = tmp_path / "flat.tif"
    tifffile.imwrite(flat, image, photometric="rgb", tile=(256, 256))
    assert max(image.shape[:2]) > OVERVIEW_FROM
    with open_slide(flat) as slide:
        pyramid = slide.pyramid()
        assert slide.level_count == 1
        assert [p.shape for p in pyramid] == [
            (4400, 4201, 3),
            (2200, 2100, 3),
            (1100, 1050, 3),
            (550, 525, 3),
        ]
        assert max(pyramid[-1].shape[:2]) <= OVERVIEW_SIDE < max(pyramid[-2].shape[:2])
        smallest = np.asarray(pyramid[-1])
        assert slide.pixels_read[0] == 4400 * 4201  # every file tile, once
        np.testing.assert_array_equal(np.asarray(pyramid[1]), _halved(image))
        np.testing.assert_array_equal(smallest, _halved(_halved(_halved(image))))
        np.testing.assert_array_equal(pyramid[1][2100:2200:3, 2007:2100], _halved(image)[2100:2200:3, 2007:])
        assert slide.pixels_read[0] == 4400 * 4201  # kept: nothing decoded again
    with open_slide(flat) as slide:  # a level larger than the cache: still each file tile decoded once
        cache = TileCache(slide, max_bytes=4 << 20)
        small = np.asarray(TileLevel(cache, len(cache.shapes) - 1))
        np.testing.assert_array_equal(small, _halved(_halved(_halved(image))))
        assert slide.pixels_read[0] == 4400 * 4201


def test_a_pyramid_that_reaches_the_screen_gets_no_overview(svs_slide: WrittenSlide) -> None:
    with open_slide(svs_slide.path) as slide:
        assert len(slide.pyramid()) == slide.level_count


def test_an_aperio_pixel_size_with_a_decimal_comma_is_read(tmp_path: Path) -> None:
    """`MPP = 0,2500`, as written where a comma is the decimal mark, was read as no pixel size."""
    path = tmp_path / "comma.svs"
    description = (
        "Aperio Image Library v12.0.0\r\n512x512 [0,0 512x512] (256x256) RGB|AppMag = 40|MPP = 0,2500"
    )
    tifffile.imwrite(
        path,
        textured_image(512, 512),
        tile=(256, 256),
        photometric="rgb",
        description=description,
        metadata=None,
    )
    with open_slide(path) as slide:
        assert slide.mpp == pytest.approx((0.25, 0.25))


@pytest.mark.parametrize("stored", ["jpeg-ycbcr", "jpeg-rgb", "zlib"])
def test_a_file_tile_read_as_luma_is_its_colour_read_weighted(tmp_path: Path, stored: str) -> None:
    """The focus measure reads luma: from a JPEG tile (YCbCr as most scanners write it, RGB as Aperio does)
    straight off the decoder, within rounding of the RGB read's luma; from other codecs, exactly it. (On
    saturated noise the RGB read clips where Y does not: H&E-like tissue.)"""
    from bigslide.synthetic.slides import synthesize_slide
    from bigslide.wsi.tiff_tiles import LUMA

    image = synthesize_slide((600, 520), lesions=1, seed=4).rgb
    path = tmp_path / f"{stored}.tif"
    if stored == "zlib":
        args: dict[str, object] = {"compression": "zlib"}
    else:
        space = "YCBCR" if stored == "jpeg-ycbcr" else "RGB"
        args = {"compression": "jpeg", "compressionargs": {"level": 85, "outcolorspace": space}}
    tifffile.imwrite(path, image, tile=(256, 256), photometric="rgb", **args)
    with open_slide(path) as slide:
        assert slide.tile_shape(0) == (256, 256)
        for row, col in [(0, 0), (1, 2), (2, 2)]:  # (2, 2): the corner tile, cut by the image's edges
            colour = slide.read_file_tile(0, row, col)
            luma = slide.read_file_tile_luma(0, row, col)
            assert luma.dtype == np.float32
            assert luma.shape == colour.shape[:2]
            expected = colour @ LUMA
            if stored == "zlib":
                np.testing.assert_array_equal(luma, expected)
            else:
                assert np.abs(luma - expected).max() <= 2.5
                assert np.abs(luma - expected).mean() < 0.5
                assert luma.std() > 1  # the image, not a flat decode


def test_a_damaged_jpeg_tile_read_as_luma_names_the_file_and_tile(tmp_path: Path) -> None:
    path = tmp_path / "damaged.tif"
    tifffile.imwrite(
        path, textured_image(512, 512, seed=5), tile=(256, 256), photometric="rgb", compression="jpeg"
    )
    with tifffile.TiffFile(path) as tif:
        offset = tif.pages[0].dataoffsets[3]
    with path.open("r+b") as f:  # the last tile's scan data overwritten
        f.seek(offset + 2)
        f.write(b"\xff\xd9" * 64)
    with open_slide(path) as slide:
        assert slide.read_file_tile_luma(0, 0, 0).shape == (256, 256)
        damaged = r"damaged\.tif: cannot decode file tile \(row 1, col 1\) of level 0"
        with pytest.raises(SlideError, match=damaged):
            slide.read_file_tile_luma(0, 1, 1)


@pytest.mark.parametrize("compression", ["zlib", "jpeg"])
def test_a_greyscale_slide_reads_as_grey_rgb_file_tile_by_file_tile(tmp_path: Path, compression: str) -> None:
    # a brightfield slide saved in one channel: file tiles come as RGB like every other read, and their luma
    # is the grey itself (the focus measure reads it)
    grey = textured_image(600, 520, seed=6)[..., 0]
    path = tmp_path / f"grey-{compression}.tif"
    tifffile.imwrite(path, grey, tile=(256, 256), compression=compression)
    with open_slide(path) as slide:
        tile = slide.read_file_tile(0, 1, 1)
        assert tile.shape == (256, 256, 3)
        np.testing.assert_array_equal(tile, slide.read_region((256, 256), 0, (256, 256)))
        np.testing.assert_allclose(slide.read_file_tile_luma(0, 1, 1), tile[..., 0], atol=1e-3)


@pytest.mark.parametrize(("unit", "per_unit"), [("micron", 2.0), ("\\u00B5m", 2.0), ("nm", 0.002)])
def test_an_imagej_tiffs_pixel_size_in_its_own_unit_is_read(
    tmp_path: Path, unit: str, per_unit: float
) -> None:
    """ImageJ / Fiji write the resolution in pixels per the description's `unit` (µm escaped as
    `\\u00B5m`), and the tags' unit as none: read as no pixel size before."""
    path = tmp_path / "fiji.tif"
    tifffile.imwrite(
        path,
        textured_image(512, 512),
        tile=(256, 256),
        photometric="rgb",
        resolution=(per_unit, per_unit),
        resolutionunit="NONE",
        description=f"ImageJ=1.54f\nunit={unit}\nspacing=1\n",
        metadata=None,
    )
    with open_slide(path) as slide:
        assert slide.mpp == pytest.approx((0.5, 0.5))


@pytest.mark.parametrize("stored", ["tiles", "strips"])
def test_file_tiles_without_data_read_as_glass_as_openslide_reads_them(tmp_path: Path, stored: str) -> None:
    # a sparse TIFF leaves tiles outside the scanned area out (byte count 0); tifffile reads them as
    # zeros: black squares the tissue rule took for pen ink (half a slide's tiles left out) or, read at
    # level 0 beside a coarser level that holds them, kept as tissue and fed to the model
    image = textured_image(512, 512, seed=8)
    path = tmp_path / f"sparse-{stored}.tif"
    layout = {"tile": (128, 128)} if stored == "tiles" else {"rowsperstrip": 128}
    tifffile.imwrite(path, image, photometric="rgb", compression="zlib", **layout)  # type: ignore[arg-type]
    with tifffile.TiffFile(path) as tif:
        tag = tif.pages[0].tags["TileByteCounts" if stored == "tiles" else "StripByteCounts"]
        form = tif.byteorder + {3: "H", 4: "I", 16: "Q"}[int(tag.dtype)]
    empty = [1, 2] if stored == "tiles" else [1]  # (row 0, cols 1-2) / the second strip of rows
    with path.open("r+b") as f:
        for index in empty:
            f.seek(tag.valueoffset + index * struct.calcsize(form))
            f.write(struct.pack(form, 0))
    expected = image.copy()
    if stored == "tiles":
        expected[:128, 128:384] = 255
    else:
        expected[128:256] = 255
    with open_slide(path) as slide:
        np.testing.assert_array_equal(slide.read_region((0, 0), 0, (512, 512)), expected)
        np.testing.assert_array_equal(
            slide.read_region((100, 100), 0, (200, 200)), expected[100:300, 100:300]
        )
        row, col = (0, 1) if stored == "tiles" else (1, 0)  # a file tile without data
        assert (slide.read_file_tile(0, row, col) == 255).all()
        assert (slide.read_file_tile_luma(0, row, col) == 255).all()
        np.testing.assert_array_equal(slide.read_file_tile(0, 2, 0)[:, :128], expected[256:384, :128])
        if stored == "tiles":
            with open_slide(path, backend="openslide") as osr:
                np.testing.assert_array_equal(osr.read_region((0, 0), 0, (512, 512)), expected)


@pytest.mark.parametrize(
    ("photometric", "said"),
    [
        ("palette", "palette"),
        ("miniswhite", "MinIsWhite"),
        ("separated", "CMYK"),
        ("minisblack", "an image of 4 channels"),
    ],
)
def test_pixels_that_are_no_grey_or_rgb_colours_are_refused_by_name(
    tmp_path: Path, photometric: str, said: str
) -> None:
    # read before as grey or RGB: a palette image's indices passed for a greyscale scan, MinIsWhite's
    # tissue for glass, CMYK's inks and a 4-channel image's first three channels for red, green and blue
    image = textured_image(256, 256, seed=9)
    pixels = image[..., 0] if photometric in ("palette", "miniswhite") else np.dstack([image, image[..., :1]])
    kwargs: dict[str, object] = {"planarconfig": "contig"} if photometric == "minisblack" else {}
    if photometric == "palette":
        kwargs["colormap"] = np.tile(np.arange(256, dtype=np.uint16) * 257, (3, 1))
    path = tmp_path / f"{photometric}.tif"
    tifffile.imwrite(path, pixels, tile=(128, 128), photometric=photometric, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(SlideError, match=said) as info:
        open_slide(path)
    assert str(path) in str(info.value)


def test_a_path_starting_with_a_tilde_opens_from_the_home_folder(
    svs_slide: WrittenSlide, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables read ~/... as the home folder; open_slide (and so predict_slide) said no such slide file."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "scan.svs").symlink_to(svs_slide.path)
    with open_slide("~/scan.svs") as slide:
        assert slide.dimensions == svs_slide.levels[0].shape[1::-1]
