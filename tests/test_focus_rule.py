"""Which tiles are out of focus: those far softer than the rest of their slide. A scanner's focus and JPEG
set how sharp a whole slide is, and a slide scanned a little soft throughout is not flagged tile by tile;
a patch out of the focal plane on it is. Small tiles are judged on 32-pixel windows and on their own
footprints, and a slide that mostly measures out of focus is named in the tissue check's warning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from bigslide.explain.tissue_check import warning
from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling.blur import (
    GREY_NOISE,
    OWN_SPAN,
    OWN_WEIGHT,
    RELATIVE_FOCUS,
    SHARPNESS_SPAN,
    out_of_focus,
    sharpness,
    tile_sharpness,
    widened,
)
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.pixel_classes import TissueSettings, greyscale
from bigslide.tiling.tissue_measure import apply_in_runs, footprints
from bigslide.wsi.slide import open_slide

PATCH = (512, 768)  # columns of the patch out of focus, in level-0 pixels (0.5 µm/px)


def _blurred(rgb: np.ndarray, sigma: float) -> np.ndarray:
    f = rgb.astype(np.float32)
    return np.rint(np.stack([ndimage.gaussian_filter(f[..., c], sigma) for c in range(3)], -1)).astype(
        np.uint8
    )


@pytest.fixture(scope="module")
def tissue() -> np.ndarray:
    return synthesize_slide((1280, 1280), lesions=1, seed=21).rgb  # the tissue the slides below scan


def _scan(path: Path, rgb: np.ndarray) -> Path:
    return write_pyramid(
        path, downsample_pyramid(rgb, 4), mpp=0.5, tile=64, flavour="svs", compression="jpeg"
    )


def soft_scan_with_a_blurred_patch(path: Path, tissue: np.ndarray | None = None) -> Path:
    """A slide scanned a little soft throughout (σ 2.5 px at 0.5 µm/px: 1.25 µm) with a patch out of focus
    (σ 6 px) over the level-0 columns PATCH, written to `path`."""
    if tissue is None:
        tissue = synthesize_slide((1280, 1280), lesions=1, seed=21).rgb
    soft = _blurred(tissue, 2.5)
    soft[:, PATCH[0] : PATCH[1]] = _blurred(tissue, 6.0)[:, PATCH[0] : PATCH[1]]
    return _scan(path, soft)


def test_a_patch_far_softer_than_its_slide_is_out_of_focus_and_a_soft_scan_is_not(
    tissue: np.ndarray, tmp_path: Path
) -> None:
    with open_slide(soft_scan_with_a_blurred_patch(tmp_path / "soft.svs", tissue)) as slide:
        grid = TileGrid.from_slide(slide, 64, target_mpp=0.5)
    x = grid.coords[:, 0]
    patch = (x >= PATCH[0] + 16) & (x + 64 <= PATCH[1] - 16)
    rest = (x + 32 < PATCH[0] - 48) | (x + 32 > PATCH[1] + 48)
    assert patch.sum() >= 20
    assert rest.sum() >= 40
    least = TissueSettings().min_sharpness
    assert (grid.sharpness[rest] < least).mean() > 0.1  # what `min_sharpness` alone would flag
    assert grid.out_of_focus[rest].mean() <= 0.05
    assert grid.out_of_focus[patch].mean() >= 0.9
    assert grid.check.blurred == grid.out_of_focus.sum()
    assert warning(slide.path, grid) is None


def test_left_out_blurred_tiles_leave_the_kept_ones_in_focus(tissue: np.ndarray, tmp_path: Path) -> None:
    rgb = tissue.copy()
    rgb[:, PATCH[0] : PATCH[1]] = _blurred(tissue, 6.0)[:, PATCH[0] : PATCH[1]]
    with open_slide(_scan(tmp_path / "patch.svs", rgb)) as slide:
        flagged = TileGrid.from_slide(slide, 64, target_mpp=0.5)
        left_out = TileGrid.from_slide(slide, 64, target_mpp=0.5, tissue=TissueSettings(exclude_blurred=True))
    assert flagged.check.blurred >= 20
    assert left_out.check.blurred == flagged.check.blurred
    assert len(left_out) == len(flagged) - flagged.check.blurred
    assert not left_out.out_of_focus.any()  # judged against the slide's reference, not the kept tiles'


def test_a_slide_mostly_out_of_focus_is_named_and_judged_by_the_setting_alone(
    tissue: np.ndarray, tmp_path: Path
) -> None:
    with open_slide(_scan(tmp_path / "blurred.svs", _blurred(tissue, 6.0))) as slide:
        grid = TileGrid.from_slide(slide, 64, target_mpp=0.5)
    least = TissueSettings().min_sharpness
    reference = grid.check.focus_reference
    assert reference is not None
    assert reference < least
    text = warning(slide.path, grid)
    assert text is not None
    assert "out of focus" in text
    assert str(slide.path) in text
    assert reference < RELATIVE_FOCUS * least  # far below the setting: the setting alone decides
    np.testing.assert_array_equal(grid.out_of_focus, grid.sharpness < least)
    assert grid.out_of_focus.mean() > 0.9


def test_the_reference_travels_with_a_saved_grid(tissue: np.ndarray, tmp_path: Path) -> None:
    rgb = tissue.copy()
    rgb[:, PATCH[0] : PATCH[1]] = _blurred(tissue, 6.0)[:, PATCH[0] : PATCH[1]]
    with open_slide(_scan(tmp_path / "patch.svs", rgb)) as slide:
        grid = TileGrid.from_slide(slide, 64, target_mpp=0.5)
    loaded = TileGrid.load(grid.save(tmp_path / "grid.npz"))
    assert loaded.check.focus_reference == grid.check.focus_reference
    np.testing.assert_array_equal(loaded.out_of_focus, grid.out_of_focus)
    # a grid saved before the reference was kept is judged by `min_sharpness` alone
    arrays = grid.arrays()
    attrs = json.loads(str(arrays["attrs"]))
    del attrs["tissue_check"]["focus_reference"]
    arrays["attrs"] = np.array(json.dumps(attrs))
    np.savez(tmp_path / "old.npz", **arrays)  # type: ignore[arg-type]
    old = TileGrid.load(tmp_path / "old.npz")
    np.testing.assert_array_equal(old.out_of_focus, grid.sharpness < grid.tissue_settings.min_sharpness)


def test_out_of_focus_is_below_the_setting_and_far_below_the_slide() -> None:
    values = np.array([0.01, 0.05, 0.09, 0.2, np.nan])
    np.testing.assert_array_equal(out_of_focus(values, 0.1, 0.1), [True, False, False, False, False])
    np.testing.assert_array_equal(out_of_focus(values, 0.1, 1.0), [True, True, True, False, False])
    np.testing.assert_array_equal(out_of_focus(values, 0.1, 0.03), [True, True, True, False, False])
    np.testing.assert_array_equal(out_of_focus(values, 0.1, None), [True, True, True, False, False])


def test_short_boxes_grow_to_the_span_about_their_centre_within_the_image() -> None:
    boxes = np.array([[40, 56, 100, 116], [0, 16, 0, 16], [90, 100, 190, 200], [0, 40, 10, 50]])
    got = widened(boxes, (100, 200))
    np.testing.assert_array_equal(
        got, [[32, 64, 92, 124], [0, 32, 0, 32], [68, 100, 168, 200], [0, 40, 10, 50]]
    )
    np.testing.assert_array_equal(widened(np.array([[0, 10, 0, 10]]), (20, 20)), [[0, 20, 0, 20]])


EDGE_PATCH = (496, 784)
"""Columns (0.5 µm/px) of a patch out of focus on the 2 µm/px scans below: 124-196 there, 4 px past the
16 px tiles at 128 and 176, whose 32 px windows reach 8 px beyond their footprints."""


def _coarse_patch_scan(path: Path, tissue: np.ndarray) -> Path:
    """`tissue` (drawn at 0.5 µm/px) with EDGE_PATCH out of focus (σ 12 px: 6 µm) scanned at 2 µm/px: 64 px
    tiles at 0.5 µm/px span 16 px of its finest level, half the focus window."""
    rgb = tissue.copy()
    rgb[:, EDGE_PATCH[0] : EDGE_PATCH[1]] = _blurred(tissue, 12.0)[:, EDGE_PATCH[0] : EDGE_PATCH[1]]
    return write_pyramid(path, downsample_pyramid(rgb[::4, ::4].copy(), 2), mpp=2.0, tile=64, flavour="svs")


def _edge_tiles(grid: TileGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tiles inside the patch, those of them whose windows reach past it, and tiles well outside it."""
    x0, x1 = EDGE_PATCH[0] // 4, EDGE_PATCH[1] // 4
    x = grid.coords[:, 0]  # level-0 pixels of the 2 µm/px scan
    inside = (x >= x0) & (x + OWN_SPAN <= x1)
    reach = (SHARPNESS_SPAN - OWN_SPAN) // 2
    edge = inside & ((x - reach < x0) | (x + OWN_SPAN + reach > x1))
    outside = (x + OWN_SPAN + reach <= x0) | (x - reach >= x1)
    return inside, edge, outside


def _measure(grey: np.ndarray, lap: np.ndarray, box: np.ndarray) -> float:
    r0, r1, c0, c1 = box
    return float(lap[r0:r1, c0:c1].var() / (grey[r0:r1, c0:c1].var() + GREY_NOISE))


def test_small_tiles_are_judged_on_a_window_of_the_span_and_on_their_own_footprint(
    tissue: np.ndarray, tmp_path: Path
) -> None:
    with open_slide(_coarse_patch_scan(tmp_path / "coarse.svs", tissue)) as slide:
        grid = TileGrid.from_slide(slide, 64, target_mpp=0.5, min_tissue=0.0)
        values = tile_sharpness(slide, grid.coords, grid.tile_size_level0, grid.level)
        whole = greyscale(slide.read_level(0)).astype(np.float64)
    boxes = footprints(grid.coords, grid.tile_size_level0, 1.0, whole.shape)
    assert (boxes[:, 1] - boxes[:, 0] == OWN_SPAN).all()
    lap = ndimage.laplace(whole, mode="nearest")
    windows = widened(boxes, whole.shape)
    assert (windows[:, 1] - windows[:, 0] == SHARPNESS_SPAN).all()
    assert (windows[:, 3] - windows[:, 2] == SHARPNESS_SPAN).all()
    window = np.array([_measure(whole, lap, b) for b in windows])
    own = np.array([_measure(whole, lap, b) for b in boxes])
    np.testing.assert_allclose(values, np.minimum(window, OWN_WEIGHT * own), rtol=1e-3, atol=1e-6)
    _inside, edge, outside = _edge_tiles(grid)
    assert (OWN_WEIGHT * own[edge] < window[edge]).all()  # the footprint decides at the patch's edge
    assert np.isclose(values[outside], window[outside], rtol=1e-3).mean() > 0.9  # the window, on sharp tissue


def test_small_tiles_inside_a_blurred_patchs_edge_are_out_of_focus(
    tissue: np.ndarray, tmp_path: Path
) -> None:
    with open_slide(_coarse_patch_scan(tmp_path / "patch.svs", tissue)) as slide:
        grid = TileGrid.from_slide(slide, 64, target_mpp=0.5)
        shape = (slide.dimensions[1], slide.dimensions[0])
        boxes = widened(footprints(grid.coords, OWN_SPAN, 1.0, shape), shape)
        window = apply_in_runs(slide, 0, boxes, sharpness, margin=1, luma=True)
    inside, edge, outside = _edge_tiles(grid)
    assert edge.sum() >= 20
    assert outside.sum() >= 40
    # judged on their windows alone, the edge tiles would pass as sharp ...
    least, reference = TissueSettings().min_sharpness, grid.check.focus_reference
    assert out_of_focus(window, least, reference)[edge].mean() < 0.2
    # ... their own pixels tell
    assert grid.out_of_focus[inside].mean() >= 0.95
    assert grid.out_of_focus[outside].mean() <= 0.02
