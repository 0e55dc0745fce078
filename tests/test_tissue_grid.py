from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from shapely.geometry import Polygon, box

from bigslide.errors import ConfigError, RegionError
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.pixel_classes import TissueSettings
from bigslide.tiling.regions import Region, load_regions, save_regions
from bigslide.tiling.tissue import tile_tissue_fraction, tissue_mask
from bigslide.wsi.slide import open_slide
from tests.conftest import MakeSlide, WrittenSlide

PINK = (200, 100, 150)
T = 256
FLAT_TISSUE = TissueSettings(ink_flatness=0.0)
"""The planted slide's tissue is flat pink squares on white glass, films a pen could leave: these tests of
the grid's geometry judge it by colour alone."""


@pytest.mark.parametrize(
    ("value", "fraction"), [(255, 0.0), (231, 0.0), (230, 1.0), (128, 1.0), (3, 1.0), (2, 0.0), (0, 0.0)]
)
def test_rule_bounds_are_inclusive(value: int, fraction: float) -> None:
    assert tile_tissue_fraction(np.full((8, 8, 3), value, np.uint8)) == fraction


def test_rule_fraction_counts_pixels() -> None:
    tile = np.full((10, 10, 3), 255, np.uint8)
    tile[:3] = PINK  # greyscale 135.6
    tile[3, :5] = 0
    assert tile_tissue_fraction(tile) == pytest.approx(0.30)


@pytest.fixture(scope="session")
def planted(make_slide: MakeSlide) -> WrittenSlide:
    """1536 x 1000 white slide (6 x 3 whole tiles of 256; the last 232 rows are a partial row).

    Tissue: tile (col 2, row 1) full, tile (0, 2) full, tile (5, 0) top 176 rows (0.6875),
    tile (3, 2) top 128 rows (0.5), and pink in the partial bottom row that no tile covers.
    """
    image = np.full((1000, 1536, 3), 255, np.uint8)
    image[256:512, 512:768] = PINK
    image[512:768, 0:256] = PINK
    image[0:176, 1280:1536] = PINK
    image[512:640, 768:1024] = PINK
    image[800:1000, 0:600] = PINK
    return make_slide(image, flavour="svs", n_levels=4, name="planted")


def _truth(written: WrittenSlide, coords: np.ndarray, size: int = T) -> np.ndarray:
    image = written.levels[0]
    return np.array([tile_tissue_fraction(image[y : y + size, x : x + size]) for x, y in coords])


def test_grid_keeps_exactly_the_tissue_tiles(planted: WrittenSlide) -> None:
    with open_slide(planted.path) as slide:
        grid = TileGrid.from_slide(slide, T, tissue=FLAT_TISSUE)
        assert set(slide.pixels_read) == {3}  # measured on the 192 x 125 level, never level 0
    np.testing.assert_array_equal(grid.coords, [[1280, 0], [512, 256], [0, 512]])
    np.testing.assert_allclose(grid.tissue, [0.6875, 1.0, 1.0])
    assert grid.coords.dtype == np.int64
    assert (grid.tile_size, grid.tile_size_level0, grid.level, len(grid)) == (T, T, 0, 3)
    assert grid.slide_mpp == pytest.approx((0.5, 0.5))
    assert grid.slide_path == str(planted.path)


def test_all_tiles_row_major_inside_slide_and_fractions_match_level0(planted: WrittenSlide) -> None:
    with open_slide(planted.path) as slide:
        grid = TileGrid.from_slide(slide, T, filter="none", tissue=FLAT_TISSUE)
    xs, ys = np.meshgrid(np.arange(6) * T, np.arange(3) * T)
    np.testing.assert_array_equal(grid.coords, np.stack([xs.ravel(), ys.ravel()], 1))
    np.testing.assert_allclose(grid.tissue, _truth(planted, grid.coords), atol=1e-6)


@pytest.mark.parametrize(
    ("min_tissue", "kept"),
    [
        (0.0, 18),
        (0.4, 4),
        (0.6, 3),
        (0.6875, 3),
        (0.7, 2),
        (1.0, 2),
    ],
)
def test_min_tissue_threshold(planted: WrittenSlide, min_tissue: float, kept: int) -> None:
    with open_slide(planted.path) as slide:
        assert len(TileGrid.from_slide(slide, T, min_tissue=min_tissue, tissue=FLAT_TISSUE)) == kept


def test_level1_grid_has_same_footprint(planted: WrittenSlide) -> None:
    with open_slide(planted.path) as slide:
        grid = TileGrid.from_slide(slide, 128, target_mpp=1.0, tissue=FLAT_TISSUE)
    assert (grid.tile_size, grid.tile_size_level0, grid.downsample) == (128, 256, 2.0)
    np.testing.assert_array_equal(grid.coords, [[1280, 0], [512, 256], [0, 512]])


def test_small_tiles_are_measured_on_a_finer_level(planted: WrittenSlide) -> None:
    with open_slide(planted.path) as slide:
        grid = TileGrid.from_slide(slide, 16, filter="none", tissue=FLAT_TISSUE)
        # tissue: a 16 px tile is 4 px on level 2 (downsample 4); focus: no level where it spans 32 px
        assert set(slide.pixels_read) == {0, 2}
    assert len(grid) == 96 * 62
    np.testing.assert_allclose(grid.tissue, _truth(planted, grid.coords, 16), atol=1e-6)


def test_tissue_mask_is_the_pink_area(planted: WrittenSlide) -> None:
    with open_slide(planted.path) as slide:
        full = tissue_mask(slide, settings=FLAT_TISSUE)
        small = tissue_mask(slide, max_size=200, settings=FLAT_TISSUE)
        assert set(slide.pixels_read) == {0, 3}
    assert full.downsample == 1.0
    np.testing.assert_array_equal(full.mask, (planted.levels[0] != 255).any(axis=2))
    assert small.downsample == 8.0
    assert small.mask.shape == (125, 192)
    np.testing.assert_array_equal(small.mask, (planted.levels[3] != 255).any(axis=2))


def test_otsu_filter_keeps_same_tiles(planted: WrittenSlide) -> None:
    with open_slide(planted.path) as slide:
        grid = TileGrid.from_slide(slide, T, filter="otsu", tissue=FLAT_TISSUE)
    np.testing.assert_array_equal(grid.coords, [[1280, 0], [512, 256], [0, 512]])
    np.testing.assert_allclose(grid.tissue, [0.6875, 1.0, 1.0])


def test_region_with_hole_keeps_expected_tiles(planted: WrittenSlide) -> None:
    frame = Polygon(
        [(0, 0), (1024, 0), (1024, 768), (0, 768)], [[(256, 256), (512, 256), (512, 512), (256, 512)]]
    )
    with open_slide(planted.path) as slide:
        grid = TileGrid.from_slide(slide, T, filter="none", regions=[Region(frame, "tumour")])
    expected = [(x, y) for y in (0, 256, 512) for x in (0, 256, 512, 768) if (x, y) != (256, 256)]
    np.testing.assert_array_equal(grid.coords, expected)


def test_region_outside_slide_raises(planted: WrittenSlide) -> None:
    regions = [Region(box(0, 0, 300, 300), "ok"), Region(box(2000, 0, 2100, 100), "stray")]
    with open_slide(planted.path) as slide, pytest.raises(RegionError) as info:
        TileGrid.from_slide(slide, T, regions=regions)
    assert "region 1 ('stray')" in str(info.value)
    assert str(planted.path) in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "word"), [({"tile_size": 0}, "tile_size"), ({"tile_size": T, "min_tissue": 1.5}, "min_tissue")]
)
def test_bad_parameters_raise_config_error(planted: WrittenSlide, kwargs: dict, word: str) -> None:
    with open_slide(planted.path) as slide, pytest.raises(ConfigError, match=word):
        TileGrid.from_slide(slide, **kwargs)


def test_save_load_round_trip(planted: WrittenSlide, tmp_path: Path) -> None:
    with open_slide(planted.path) as slide:
        grid = TileGrid.from_slide(slide, 128, target_mpp=1.0, min_tissue=0.5, tissue=FLAT_TISSUE)
    path = grid.save(tmp_path / "planted_grid")
    assert path.name == "planted_grid.npz"
    loaded = TileGrid.load(path)
    np.testing.assert_array_equal(loaded.coords, grid.coords)
    np.testing.assert_array_equal(loaded.tissue, grid.tissue)
    assert loaded.attributes() == grid.attributes()
    assert loaded.attributes()["patch_size_level0"] == 256
    assert loaded.attributes()["level_dim"] == [1536, 1000]


def test_an_ignored_area_is_left_out_and_the_rest_of_the_tissue_is_sampled(
    planted: WrittenSlide, tmp_path: Path
) -> None:
    """A QuPath file holding only an `Ignore*` annotation over one tissue tile: all tissue but that."""
    path = save_regions([Region(box(500, 250, 780, 520), "Ignore*")], tmp_path / "qupath.geojson")
    with open_slide(planted.path) as slide:
        grid = TileGrid.from_slide(slide, T, regions=load_regions(path), tissue=FLAT_TISSUE)
        named = TileGrid.from_slide(
            slide,
            T,
            regions=[Region(box(500, 250, 780, 520), "Pen")],
            tissue=TissueSettings(ink_flatness=0.0, exclude_classes=("Pen",)),
        )
    np.testing.assert_array_equal(grid.coords, [[1280, 0], [0, 512]])
    np.testing.assert_array_equal(named.coords, grid.coords)
