"""A second, finer look at tiles the coarse tissue measure took for ink: a flat-looking patch at the
tissue's edge that shows cells on the finer level is kept; pen ink on the glass, which shows none, stays
out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bigslide.bench.tissue import Scan, kinds, scanned_levels, truth
from bigslide.synthetic.marks import FAMILIES, random_pen, synthesize_marked_slide
from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling import cell_check
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.pixel_classes import GREYSCALE_RULE
from bigslide.wsi.slide import open_slide

PINK, PURPLE = (226, 160, 205), (150, 95, 170)


@pytest.fixture(scope="module")
def cells_at_the_edge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 0.5 µm/px slide (levels 0.5, 2 and 8 µm) of tissue with, on the glass beside it, a patch of
    cells 4 µm across: pink and purple squares, one flat mauve on 8 µm pixels, plain on 2 µm ones."""
    rgb = synthesize_slide((2048, 2048), lesions=0, seed=3).rgb.copy()
    rows, cols = np.mgrid[0:640, 0:320]
    checker = ((rows // 8 + cols // 8) % 2).astype(bool)
    patch = np.where(checker[..., None], np.array(PURPLE, np.uint8), np.array(PINK, np.uint8))
    rgb[700:1340, 0:320] = patch  # on the glass at the slide's left edge, touching the tissue
    path = tmp_path_factory.mktemp("cells") / "cells.svs"
    return write_pyramid(path, downsample_pyramid(rgb, 3, 4), mpp=0.5)


def _patch_tiles(grid: TileGrid) -> np.ndarray:
    x, y = grid.coords[:, 0], grid.coords[:, 1]
    return (x + 128 <= 320) & (y >= 700) & (y + 128 <= 1340)


def test_a_patch_that_is_flat_on_8_um_pixels_but_shows_cells_is_kept(
    cells_at_the_edge: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_slide(cells_at_the_edge) as slide:
        grid = TileGrid.from_slide(slide, 64, target_mpp=1.0)  # 64 µm tiles: 8 pixels of 8 µm, 32 of 2 µm
        whole = TileGrid.from_slide(slide, 64, target_mpp=1.0, filter="none", tissue=GREYSCALE_RULE)
        monkeypatch.setattr(cell_check, "CELL_SHARE", 2.0)  # no second look
        coarse = TileGrid.from_slide(slide, 64, target_mpp=1.0)
    in_patch = int(_patch_tiles(whole).sum())
    assert in_patch >= 8
    assert int(_patch_tiles(coarse).sum()) <= in_patch // 2  # the coarse measure takes the patch for a film
    assert coarse.check.ink >= in_patch // 2
    assert int(_patch_tiles(grid).sum()) == in_patch  # the finer look keeps every tile of it
    assert grid.check.ink < coarse.check.ink


def test_pens_on_the_glass_stay_out_after_the_second_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(48)
    pens = tuple(random_pen(family, rng) for family in FAMILIES)
    marked = synthesize_marked_slide((1024, 1024), seed=11, mpp=2.0, lab="B", inks=pens, aggregates=2)
    path = write_pyramid(tmp_path / "pens.tif", scanned_levels(marked.rgb, Scan(75, 0.5)), mpp=2.0)
    with open_slide(path) as slide:
        whole = TileGrid.from_slide(slide, 64, target_mpp=0.5, filter="none", tissue=GREYSCALE_RULE)
        grid = TileGrid.from_slide(slide, 64, target_mpp=0.5)
        monkeypatch.setattr(cell_check, "CELL_SHARE", 2.0)
        coarse = TileGrid.from_slide(slide, 64, target_mpp=0.5)
    found = kinds(truth(marked, whole.coords, whole.tile_size_level0))
    on_glass = np.zeros(len(whole), bool)
    for family in FAMILIES:
        on_glass |= found[f"ink_{family}"]
    index = {tuple(c): i for i, c in enumerate(whole.coords.tolist())}

    def kept(g: TileGrid) -> np.ndarray:
        out = np.zeros(len(whole), bool)
        out[[index[tuple(c)] for c in g.coords.tolist()]] = True
        return out

    assert on_glass.sum() >= 100
    assert (kept(grid) & on_glass).sum() == (kept(coarse) & on_glass).sum()
    assert kept(grid)[on_glass].mean() <= 0.05
