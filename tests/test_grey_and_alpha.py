"""Slides whose file is not plain RGB: a greyscale scan keeps its tissue (no colour: no ink rule, said in a
warning), and an RGBA file's transparent pixels are glass, whichever way its alpha is stored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from bigslide.explain.tissue_check import warnings_for
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide

MPP = 0.5
SIZE = (1536, 2048)  # rows, columns


@pytest.fixture(scope="module")
def tissue() -> np.ndarray:
    rgb = synthesize_slide(SIZE[::-1], lesions=1, seed=21).rgb
    assert rgb.shape[:2] == SIZE
    return rgb


def write_tiff(path: Path, pixels: np.ndarray, compression: str = "zlib", **kwargs: object) -> Path:
    tifffile.imwrite(
        path,
        pixels,
        tile=(256, 256),
        resolution=(1e4 / MPP, 1e4 / MPP),
        resolutionunit="CENTIMETER",
        compression=compression,
        **kwargs,  # type: ignore[arg-type]
    )
    return path


def grid_of(path: Path) -> tuple[TileGrid, list[str]]:
    with open_slide(path) as slide:
        grid = TileGrid.from_slide(slide, 224, target_mpp=MPP)
    return grid, warnings_for(path, grid)


@pytest.mark.parametrize("kind", ["tiff", "jpeg tiff", "png"])
def test_a_greyscale_slide_keeps_its_tissue_and_says_ink_was_not_looked_for(
    tmp_path: Path, tissue: np.ndarray, kind: str
) -> None:
    grey = np.asarray(Image.fromarray(tissue).convert("L"))
    colour, _ = grid_of(write_tiff(tmp_path / "colour.tif", tissue, photometric="rgb"))
    if kind == "png":
        path = tmp_path / "grey.png"
        Image.fromarray(grey).save(path, dpi=(25_400 / MPP, 25_400 / MPP))
    elif kind == "jpeg tiff":
        path = write_tiff(tmp_path / "grey_jpeg.tif", grey, "jpeg", photometric="minisblack")
    else:
        path = write_tiff(tmp_path / "grey.tif", grey, photometric="minisblack")
    with open_slide(path) as slide:
        assert slide.greyscale
    grid, warnings = grid_of(path)
    assert colour.check.kept > 10
    assert colour.check.ink == 0
    # its tissue is kept, not taken for black ink (before: 4 of the colour slide's tiles kept)
    assert grid.check.ink == 0
    assert grid.check.kept >= 0.8 * colour.check.kept
    assert grid.check.greyscale
    assert not grid.tissue_settings.reject_ink
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{path}: a greyscale slide: without colour")
    with open_slide(tmp_path / "colour.tif") as slide:
        assert not slide.greyscale


@pytest.mark.parametrize("extrasamples", ["unassalpha", "assocalpha"])
def test_transparent_pixels_of_an_rgba_tiff_are_glass(
    tmp_path: Path, tissue: np.ndarray, extrasamples: str
) -> None:
    alpha = np.full(SIZE, 255, np.uint8)
    alpha[:, : SIZE[1] // 2] = 0  # the left half holds no scan data
    alpha[:64, SIZE[1] // 2 :] = 128  # a half-transparent band
    colour = tissue.astype(np.uint16)
    if extrasamples == "assocalpha":  # the colour already scaled by alpha
        colour = (colour * alpha[..., None] + 127) // 255
    rgba = np.dstack([colour.astype(np.uint8), alpha])
    path = write_tiff(tmp_path / "rgba.tif", rgba, photometric="rgb", extrasamples=[extrasamples])
    with open_slide(path) as slide:
        whole = slide.read_region((0, 0), 0, SIZE[::-1])
        assert np.array_equal(slide.read_file_tile(0, 5, 7), whole[1280:1536, 1792:2048])
    assert (whole[:, : SIZE[1] // 2] == 255).all()  # glass, not black
    opaque = whole[64:, SIZE[1] // 2 :].astype(int)
    assert np.abs(opaque - tissue[64:, SIZE[1] // 2 :]).max() <= 1
    half = whole[:64, SIZE[1] // 2 :].astype(float)
    expected = tissue[:64, SIZE[1] // 2 :] * (128 / 255) + 255 * (127 / 255)
    assert np.abs(half - expected).max() <= 1.5
    grid, _ = grid_of(path)
    # the transparent half is glass: no tile there kept, nor taken for black ink (before: 120 such tiles)
    ink = grid.rejected[grid.rejected_reason == 1]
    assert len(grid)
    assert (grid.coords[:, 0] + 224 > SIZE[1] // 2).all()
    assert (ink[:, 0] + 224 > SIZE[1] // 2).all()
