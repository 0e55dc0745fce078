"""Tiles' tissue and ink are measured on pixels no coarser than about 8 µm whatever steps the slide's
pyramid takes: where the level a tile would be measured on is coarser (a 40x scan's levels are 0.25, 1, 4
and 16 µm), a finer level is read and judged in blocks, which stand exactly for the level the pyramid
lacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from bigslide.synthetic.marks import random_pen, synthesize_marked_slide
from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling import tissue_measure
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.pixel_classes import GREYSCALE_RULE, TissueSettings, gaussian_planes
from bigslide.tiling.tissue import block_mean
from bigslide.tiling.tissue_measure import MEASURE_UM, measure_raster, measure_tiles
from bigslide.wsi.slide import open_slide


def _pixel_um(slide, level: int, block: int) -> float:  # type: ignore[no-untyped-def]
    return float(slide.mpp[0] * slide.level_downsamples[level] * block)


def test_blocks_of_a_finer_level_stand_for_a_missing_8_um_level(tmp_path: Path) -> None:
    rng = np.random.default_rng(47)
    pens = (random_pen("blue", rng), random_pen("violet", rng))
    marked = synthesize_marked_slide((1024, 1024), seed=3, mpp=2.0, inks=pens, aggregates=2)
    levels = downsample_pyramid(marked.rgb, 4)  # 2, 4, 8 and 16 µm
    full = write_pyramid(tmp_path / "full.svs", levels, mpp=2.0)
    gap = write_pyramid(tmp_path / "gap.svs", [levels[0], levels[1], levels[3]], mpp=2.0)
    size0 = 64  # tiles of 32 px at 4 µm/px: 16 px on 8 µm pixels, 8 on 16 µm ones
    with open_slide(full) as whole, open_slide(gap) as lacking:
        assert _pixel_um(whole, *measure_raster(whole, size0)) == 8.0
        level, block = measure_raster(lacking, size0)
        assert (lacking.level_downsamples[level], block) == (2.0, 2)  # the 4 µm level, in blocks of 2 x 2
        coords = TileGrid.from_slide(whole, size0, filter="none", tissue=GREYSCALE_RULE).coords
        native = measure_tiles(whole, coords, size0, TissueSettings())
        blocked = measure_tiles(lacking, coords, size0, TissueSettings())
    assert native.ink.max() > 0.5
    assert native.tissue.max() > 0.9
    np.testing.assert_array_equal(blocked.tissue, native.tissue)
    np.testing.assert_array_equal(blocked.ink, native.ink)


@pytest.mark.parametrize(
    ("mpp", "tile", "target_mpp", "expected_um"),
    [
        (0.2527, 224, 0.5, 2 * 16 * 0.2527),  # 40x: the 4.04 µm level in blocks of 2, not the 16 µm one
        (0.5, 224, 0.5, 8.0),  # 20x: its own 8 µm level
        (0.2527, 64, 0.5, 16 * 0.2527),  # 32 µm tiles span 8 pixels of 4 µm and 2 of 16: 4 µm, whole
        (0.2527, 16, 0.5, 4 * 0.2527),  # 8 µm tiles span 8 pixels of 1 µm
    ],
)
def test_the_measured_pixels_are_about_8_um_while_a_tile_spans_4(
    tmp_path: Path, mpp: float, tile: int, target_mpp: float, expected_um: float
) -> None:
    image = np.full((2048, 2048, 3), 240, np.uint8)
    path = write_pyramid(tmp_path / "s.svs", downsample_pyramid(image, 4, factor=4), mpp=mpp)
    with open_slide(path) as slide:
        size0 = round(tile * target_mpp / mpp)
        measured = _pixel_um(slide, *measure_raster(slide, size0))
        assert measured == pytest.approx(expected_um, rel=1e-3)
        assert measured <= MEASURE_UM * 1.15
        assert size0 * mpp / measured >= 4 * 0.99


def test_a_slide_without_a_pixel_size_is_measured_on_whole_pixels(tmp_path: Path) -> None:
    image = np.full((2048, 2048, 3), 240, np.uint8)
    path = write_pyramid(tmp_path / "s.svs", downsample_pyramid(image, 4, factor=4), mpp=None)
    with open_slide(path) as slide:
        assert slide.mpp is None
        level, block = measure_raster(slide, 443)
        assert (slide.level_downsamples[level], block) == (64, 1)  # the coarsest where a tile spans 4 px


@pytest.mark.parametrize("factor", [1, 2, 3, 6, 16, 17])
def test_block_means_are_the_rounded_means_of_whole_blocks(factor: int) -> None:
    rgb = np.random.default_rng(factor).integers(0, 256, (101, 77, 3), dtype=np.uint8)
    h, w = 101 // factor * factor, 77 // factor * factor
    truth = rgb[:h, :w].reshape(h // factor, factor, w // factor, factor, 3).mean(axis=(1, 3))
    np.testing.assert_array_equal(block_mean(rgb, factor), np.rint(truth).astype(np.uint8))


def test_a_slide_read_in_strips_skips_bare_glass_and_keeps_the_same_tiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tissue in one corner of a wide slide read in strips: tiles whose footprint on the coarsest level
    shows only glass are not read, and the grid keeps the tiles and shares it keeps reading them all."""
    rgb = np.full((2048, 4096, 3), 243, np.uint8)
    rgb[:1024, :1024] = synthesize_slide((1024, 1024), lesions=1, seed=5).rgb
    path = write_pyramid(tmp_path / "corner.svs", downsample_pyramid(rgb, 4, 4), mpp=0.5)  # to 32 µm
    monkeypatch.setattr(tissue_measure, "STRIP_PIXELS", 1 << 14)  # this small level is read in strips too
    with open_slide(path) as slide:
        skipping = TileGrid.from_slide(slide, 64, target_mpp=1.0)
        read_skipping = slide.pixels_read[2]  # the 8 µm level
        slide.pixels_read.clear()
        monkeypatch.setattr(
            tissue_measure, "_not_bare", lambda _s, coords, _z, _l: np.ones(len(coords), bool)
        )
        reading_all = TileGrid.from_slide(slide, 64, target_mpp=1.0)
        read_all = slide.pixels_read[2]
    assert len(skipping) > 10
    np.testing.assert_array_equal(skipping.coords, reading_all.coords)
    np.testing.assert_array_equal(skipping.tissue, reading_all.tissue)
    assert read_skipping < read_all / 2


@pytest.mark.parametrize("dtype", [bool, np.uint8, np.float32])
def test_box_means_are_each_boxs_own_mean(dtype: type) -> None:
    rng = np.random.default_rng(48)
    values = (rng.random((97, 131)) * (2 if dtype is bool else 255)).astype(dtype)
    # footprints of a grid with rounding, boxes clipped at the edges, one-pixel boxes and overlaps
    starts = rng.integers(0, [97, 131], size=(300, 2))
    sizes = rng.integers(1, 40, size=(300, 2))
    boxes = np.stack(
        [
            starts[:, 0],
            np.minimum(starts[:, 0] + sizes[:, 0], 97),
            starts[:, 1],
            np.minimum(starts[:, 1] + sizes[:, 1], 131),
        ],
        axis=1,
    )
    truth = np.array([values[r0:r1, c0:c1].astype(np.float64).mean() for r0, r1, c0, c1 in boxes])
    got = tissue_measure.box_means(values, boxes)
    if dtype is np.float32:
        np.testing.assert_allclose(got, truth, rtol=1e-9, atol=1e-9)
    else:
        np.testing.assert_array_equal(got, truth)  # integer sums: exact


@pytest.mark.parametrize("sigma", [0.7, 1.0, 2.5])
@pytest.mark.parametrize("mode", ["nearest", "reflect"])
@pytest.mark.parametrize("shape", [(4, 37, 53), (2, 250, 300), (1, 3, 6000)])
def test_planes_smoothed_together_equal_each_plane_smoothed_alone(
    sigma: float, mode: str, shape: tuple[int, int, int]
) -> None:
    # the ink and film rules smooth their channels and products in one call; their thresholds were chosen
    # on scipy's own filter, so the stack must give its values: on small areas (two filter calls), on large
    # ones filtered down the columns in several bands of rows, and on areas shorter than the Gaussian
    rng = np.random.default_rng(5)
    planes = rng.random(shape, dtype=np.float32) * 3
    together = gaussian_planes(planes, sigma, mode=mode)
    for plane, smoothed in zip(planes, together, strict=True):
        alone = ndimage.gaussian_filter(plane, sigma, mode=mode)
        np.testing.assert_allclose(smoothed, alone, rtol=1e-6, atol=1e-7)
