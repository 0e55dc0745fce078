"""PNG and JPEG images read as slides (a region exported from a viewer, a TMA core), and output files
named apart for slides of one name in different folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bigslide.errors import SlideError
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling.grid import TileGrid
from bigslide.wsi import plain_image
from bigslide.wsi.names import output_names
from bigslide.wsi.slide import open_slide
from tests.conftest import MakeSlide, textured_image

MICROSCOPE_DPI = 25_400 / 0.5  # 0.5 µm per pixel


def test_a_png_reads_its_pixels_and_stated_microscope_resolution(tmp_path: Path) -> None:
    image = textured_image(300, 500)
    Image.fromarray(image).save(tmp_path / "core.png", dpi=(MICROSCOPE_DPI, MICROSCOPE_DPI))
    with open_slide(tmp_path / "core.png") as slide:
        assert slide.dimensions == (500, 300)
        assert slide.mpp == pytest.approx((0.5, 0.5), rel=1e-4)
        np.testing.assert_array_equal(slide.read_level(0), image)
        # level-0 coordinates, glass beyond the edge, as for a scanned slide
        region = slide.read_region((450, 280), 0, (100, 40))
        np.testing.assert_array_equal(region[:20, :50], image[280:, 450:])
        assert (region[20:] == 255).all()
        assert (region[:, 50:] == 255).all()


def test_a_screen_or_printer_resolution_is_no_pixel_size(tmp_path: Path) -> None:
    image = textured_image(64, 64)
    for dpi in (72, 300):
        Image.fromarray(image).save(tmp_path / f"{dpi}.jpg", dpi=(dpi, dpi))
        with open_slide(tmp_path / f"{dpi}.jpg") as slide:
            assert slide.mpp is None  # data.slide_mpp / --slide-mpp must say it
    Image.fromarray(image).save(tmp_path / "none.png")
    with open_slide(tmp_path / "none.png") as slide:
        assert slide.mpp is None


def test_a_jpeg_tiles_as_the_same_pixels_in_a_tiff_do(tmp_path: Path, make_slide: MakeSlide) -> None:
    rgb = synthesize_slide((1024, 1024), lesions=1, seed=4).rgb
    Image.fromarray(rgb).save(tmp_path / "field.jpg", quality=95, dpi=(MICROSCOPE_DPI, MICROSCOPE_DPI))
    with Image.open(tmp_path / "field.jpg") as decoded:
        pixels = np.asarray(decoded.convert("RGB"))
    tiff = make_slide(pixels, flavour="tiff", n_levels=1, mpp=0.5)
    with open_slide(tmp_path / "field.jpg") as jpeg, open_slide(tiff.path) as same:
        from_jpeg = TileGrid.from_slide(jpeg, 64, target_mpp=1.0)
        from_tiff = TileGrid.from_slide(same, 64, target_mpp=1.0)
    assert len(from_jpeg.coords) > 0
    np.testing.assert_array_equal(from_jpeg.coords, from_tiff.coords)


def test_a_large_image_gets_a_pyramid_of_box_means(tmp_path: Path) -> None:
    image = textured_image(100, 4200)
    Image.fromarray(image).save(tmp_path / "wide.png")
    with open_slide(tmp_path / "wide.png") as slide:
        assert slide.level_dimensions == ((4200, 100), (1050, 25))
        assert slide.level_downsamples[1] == pytest.approx(4.0)
        means = image.reshape(25, 4, 1050, 4, 3).mean(axis=(1, 3))
        assert np.abs(slide.read_level(1).astype(float) - means).max() <= 1


def test_transparent_pixels_are_glass(tmp_path: Path) -> None:
    rgba = np.zeros((32, 32, 4), np.uint8)
    rgba[:16, :, :3] = (120, 40, 150)
    rgba[:16, :, 3] = 255  # the top half opaque purple, the bottom half transparent black
    Image.fromarray(rgba, "RGBA").save(tmp_path / "cut.png")
    with open_slide(tmp_path / "cut.png") as slide:
        pixels = slide.read_level(0)
    assert (pixels[:16] == (120, 40, 150)).all()
    assert (pixels[16:] == 255).all()


def test_images_bigslide_cannot_read_are_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / "sixteen.png"
    Image.fromarray(np.full((8, 8), 4000, np.uint16)).save(deep)
    with pytest.raises(SlideError, match=r"sixteen\.png: pixels are I;16, only 8-bit RGB"):
        open_slide(deep)

    cut = tmp_path / "cut.jpg"
    Image.fromarray(textured_image(256, 256)).save(cut)
    cut.write_bytes(cut.read_bytes()[:600])
    with pytest.raises(SlideError, match=r"cut\.jpg: the JPEG image will not decode"):
        open_slide(cut)

    big = tmp_path / "big.png"
    Image.fromarray(textured_image(40, 40)).save(big)
    monkeypatch.setattr(plain_image, "MAX_PIXELS", 1000)
    with pytest.raises(
        SlideError, match=r"big\.png: a PNG image of 40 x 40 px is too large .* pyramidal TIFF"
    ):
        open_slide(big)


def test_output_names_set_apart_slides_of_one_name() -> None:
    names = output_names(
        [
            "/data/case1/HE.svs",
            "/data/case2/HE.svs",
            "/data/case2/IHC.svs",
            "/other/case1/HE.svs",
            "/cores/a.png",
            "/cores/a.jpg",
            "/scans/lab/site/cores/b.png",
            "/scans/lab/site/cores/b.jpg",
            "/data/case2/IHC.svs",  # listed twice: one name
        ]
    )
    assert names == {
        Path("/data/case1/HE.svs"): "data-case1-HE",
        Path("/data/case2/HE.svs"): "case2-HE",
        Path("/data/case2/IHC.svs"): "IHC",
        Path("/other/case1/HE.svs"): "other-case1-HE",
        Path("/cores/a.png"): "a.png",  # one folder: set apart by their file names, not their folders
        Path("/cores/a.jpg"): "a.jpg",
        Path("/scans/lab/site/cores/b.png"): "b.png",
        Path("/scans/lab/site/cores/b.jpg"): "b.jpg",
    }
    # apart only in letter case (one file on some file systems, two on others): still two names
    apart = output_names(["/s/A/x.svs", "/s/a/x.svs"])
    assert len({n.lower() for n in apart.values()}) == 2
