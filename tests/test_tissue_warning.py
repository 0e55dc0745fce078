"""The tissue check's warning names a slide whose kept tiles look like glass, ink or a dark background
(nearly all kept, little cell texture) or where nothing was kept, and not a slide simply full of tissue."""

from __future__ import annotations

import numpy as np
from skimage import data as skdata

from bigslide.explain.tissue_check import warning, warnings_for
from bigslide.tiling.grid import TileGrid
from bigslide.wsi.slide import open_slide
from tests.conftest import MakeSlide


def _grid(make_slide: MakeSlide, image: np.ndarray, name: str, min_tissue: float = 0.6) -> TileGrid:
    written = make_slide(image, flavour="tiff", mpp=0.5, n_levels=4, name=name)
    with open_slide(written.path) as slide:
        return TileGrid.from_slide(slide, 64, min_tissue=min_tissue)


def test_a_slide_full_of_tissue_is_not_warned_about(make_slide: MakeSlide) -> None:
    """A region crop of an IHC slide (the benchmarks' dense slides are made of it): tissue edge to edge."""
    grid = _grid(make_slide, np.ascontiguousarray(skdata.immunohistochemistry()), "full", min_tissue=0.2)
    assert grid.check.kept >= 0.95 * grid.check.tiles >= 20
    assert grid.check.textured_fraction > 0.8
    assert warning("full.tif", grid) is None


def test_a_flat_dark_background_kept_as_tissue_is_named(make_slide: MakeSlide) -> None:
    rng = np.random.default_rng(3)
    dark = np.full((512, 512, 3), (182, 168, 176), np.uint8)  # a dim scan of empty glass, tinted
    dark = np.clip(dark + rng.integers(-2, 3, dark.shape), 0, 255).astype(np.uint8)
    grid = _grid(make_slide, dark, "dark")
    assert grid.check.kept >= 0.95 * grid.check.tiles
    assert grid.check.textured_fraction < 0.5
    text = warning("dark.tif", grid)
    assert text is not None
    assert "dark.tif" in text
    assert "cell texture" in text


def test_a_slide_with_nothing_kept_is_named(make_slide: MakeSlide) -> None:
    grid = _grid(make_slide, np.full((512, 512, 3), 245, np.uint8), "blank")
    text = warning("blank.tif", grid)
    assert text is not None
    assert "kept no tile" in text


def test_a_slide_scanned_coarser_than_the_model_reads_is_named(make_slide: MakeSlide) -> None:
    """A 10x scan (1 µm/px) read by a 20x model (0.5 µm/px) is enlarged: said, with by how much; a finer
    scan, or one within the tolerance of reading a level as stored, is not."""
    image = np.ascontiguousarray(skdata.immunohistochemistry())
    for scanned, enlarged in ((1.0, "2.0"), (0.5, None), (0.54, None), (0.25, None)):
        written = make_slide(image, flavour="tiff", mpp=scanned, n_levels=2, name=f"scan{scanned}")
        with open_slide(written.path) as slide:
            grid = TileGrid.from_slide(slide, 64, target_mpp=0.5, min_tissue=0.2)
        texts = warnings_for("scan.tif", grid)
        if enlarged is None:
            assert texts == []
        else:
            assert texts == [
                f"scan.tif: scanned at 1 µm/px, coarser than the 0.5 µm/px the model reads: its tiles are "
                f"enlarged {enlarged} times and show less detail than the model learnt from (a "
                "lower-magnification scan; predictions on it are less reliable)"
            ]
