"""Focus is measured in one pass over its level: each file tile decoded once per grid, the same values as
the measure taken tile by tile on the whole level, and NaN only over a file tile that will not decode."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tifffile
from scipy import ndimage

from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling.blur import GREY_NOISE, sharpness_level, tile_sharpness
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.pixel_classes import TissueSettings, greyscale
from bigslide.tiling.tissue_measure import footprints, measure_raster
from bigslide.wsi.slide import Slide, open_slide

TILE = 64  # grid tiles at 0.5 µm/px, the slide's own pixel size
FILE_TILE = 64  # the file's tiles: on the focus level (32 px per grid tile) each holds 2 x 2 grid tiles


def _half_blurred(path: Path, compression: str = "zlib") -> Path:
    """A 768² slide at 0.5 µm/px in 64 px file tiles, 4 levels; its right half out of focus (2 µm)."""
    image = synthesize_slide((768, 768), lesions=1, seed=21)
    rgb = image.rgb.copy()
    right = rgb[:, 384:].astype(np.float32)
    rgb[:, 384:] = np.rint(np.stack([ndimage.gaussian_filter(right[..., c], 4.0) for c in range(3)], -1))
    levels = downsample_pyramid(rgb, 4)
    return write_pyramid(path, levels, mpp=0.5, tile=FILE_TILE, flavour="svs", compression=compression)


@pytest.fixture(scope="module")
def slide_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _half_blurred(tmp_path_factory.mktemp("focus") / "half-blurred.svs")


def _count_decodes(slide: Slide) -> tuple[Counter[tuple[int, int, int]], list[int]]:
    """Count each file tile `slide` decodes one by one, and note the levels it reads as rectangles."""
    tiles: Counter[tuple[int, int, int]] = Counter()
    rectangles: list[int] = []
    read_level = slide._read_level

    def counted_level(level: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        rectangles.append(level)
        return read_level(level, y0, y1, x0, x1)

    def counted(read: Callable[[int, int, int], np.ndarray]) -> Callable[[int, int, int], np.ndarray]:
        def counted_tile(level: int, row: int, col: int) -> np.ndarray:
            tiles[(level, row, col)] += 1
            return read(level, row, col)

        return counted_tile

    # one file tile decoded, as RGB or as luma
    slide.read_file_tile = counted(slide.read_file_tile)  # type: ignore[method-assign]
    slide.read_file_tile_luma = counted(slide.read_file_tile_luma)  # type: ignore[method-assign]
    slide._read_level = counted_level  # type: ignore[method-assign]
    return tiles, rectangles


def test_each_file_tile_of_the_focus_level_is_decoded_once_per_grid(slide_path: Path) -> None:
    with open_slide(slide_path) as slide:
        level = sharpness_level(slide, TILE)
        assert level == 1  # 32 px per grid tile; tissue is measured on another level
        assert measure_raster(slide, TILE)[0] != level
        tiles, rectangles = _count_decodes(slide)
        grid = TileGrid.from_slide(slide, TILE, target_mpp=0.5)
    decoded = {key: n for key, n in tiles.items() if key[0] == level}
    # grid tiles of two rows share each file tile: reading each row of tiles for itself decodes it twice
    assert len(grid) >= 40
    assert len(decoded) >= 16
    assert max(decoded.values()) == 1
    assert level not in rectangles  # nothing read the focus level around the file tiles
    assert np.isfinite(grid.sharpness).all()


def test_focus_read_in_runs_equals_the_measure_on_the_whole_level(slide_path: Path) -> None:
    with open_slide(slide_path) as slide:
        grid = TileGrid.from_slide(slide, TILE, target_mpp=0.5, min_tissue=0.0)
        level = sharpness_level(slide, TILE)
        values = tile_sharpness(slide, grid.coords, TILE)
        whole = greyscale(slide.read_level(level)).astype(np.float64)
        boxes = footprints(grid.coords, TILE, slide.level_downsamples[level], whole.shape)
    lap = ndimage.laplace(whole, mode="nearest")
    expected = [
        lap[r0:r1, c0:c1].var() / (whole[r0:r1, c0:c1].var() + GREY_NOISE) for r0, r1, c0, c1 in boxes
    ]
    np.testing.assert_allclose(values, expected, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(grid.sharpness, values)
    # and the measure tells the halves apart
    blurred, sharp = grid.coords[:, 0] >= 384 + 32, grid.coords[:, 0] + TILE <= 384 - 32
    assert grid.tissue[sharp].max() >= 0.6
    flagged = values < TissueSettings().min_sharpness
    tissue = grid.tissue >= 0.6
    assert flagged[blurred & tissue].mean() > 0.9
    assert flagged[sharp & tissue].mean() < 0.05


def test_only_tiles_over_a_broken_file_tile_of_the_focus_level_get_nan(tmp_path: Path) -> None:
    path = _half_blurred(tmp_path / "broken.svs", compression="jpeg")
    row, col = 2, 2  # level 1, inside the tissue of the sharp half
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[2]  # level 0, thumbnail, level 1
        offset = page.dataoffsets[row * -(-page.imagewidth // FILE_TILE) + col]
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(bytes(64))
    with open_slide(path) as slide:
        grid = TileGrid.from_slide(slide, TILE, target_mpp=0.5, min_tissue=0.0)
    # a tile's focus reads its footprint on level 1 and one pixel around it: 2 x 2 tiles lie on the
    # broken file tile, and a row and a column of tiles on each side reach it by that pixel
    x, y = grid.coords[:, 0] // 2, grid.coords[:, 1] // 2
    lo_y, hi_y, lo_x, hi_x = row * FILE_TILE, (row + 1) * FILE_TILE, col * FILE_TILE, (col + 1) * FILE_TILE
    over = (y - 1 < hi_y) & (lo_y < y + TILE // 2 + 1) & (x - 1 < hi_x) & (lo_x < x + TILE // 2 + 1)
    assert over.sum() == 16
    np.testing.assert_array_equal(np.isnan(grid.sharpness), over)
