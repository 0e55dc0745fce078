import numpy as np
import pytest

from bigslide.explain.heatmap import ScoreGrid


def test_from_tiles_places_each_tile_in_its_cell_and_averages_repeats() -> None:
    coords = np.array([[128, 64], [192, 64], [128, 128], [128, 64]])
    grid = ScoreGrid.from_tiles(coords, np.array([1.0, 2.0, 3.0, 5.0]), 64, mpp=(0.5, 0.25))
    assert grid.origin == (128.0, 64.0)
    np.testing.assert_array_equal(grid.scores, [[3.0, 2.0], [3.0, np.nan]])
    assert grid.cell_of(200, 130) == (1, 1)


def test_layer_transform_puts_cell_centres_on_tile_centres() -> None:
    # napari: data index i sits at world translate + i * scale; a cell's centre must be the centre of
    # its level-0 tile, whose pixel centres run from x0 to x0 + P - 1 (in µm: times mpp).
    grid = ScoreGrid(np.zeros((3, 4)), 64, origin=(1000.0, 200.0), mpp=(0.5, 0.25))
    (sy, sx), (ty, tx) = grid.layer_transform()
    assert (sy, sx) == (64 * 0.25, 64 * 0.5)
    row, col = 2, 3
    centre_x_px = 1000 + col * 64 + (64 - 1) / 2
    centre_y_px = 200 + row * 64 + (64 - 1) / 2
    assert tx + col * sx == pytest.approx(centre_x_px * 0.5)
    assert ty + row * sy == pytest.approx(centre_y_px * 0.25)


@pytest.mark.parametrize("mode", ["rank", "percentile", "minmax"])
def test_normalisations_map_to_unit_range_and_keep_order_and_gaps(mode: str) -> None:
    scores = np.array([[0.1, 5.0], [np.nan, 0.3]], np.float32)
    out = ScoreGrid(scores, 32).normalized(mode)  # type: ignore[arg-type]
    assert np.isnan(out[1, 0])
    v = out[np.isfinite(out)]
    assert v.min() >= 0
    assert v.max() <= 1
    assert out[0, 0] <= out[1, 1] <= out[0, 1]


def test_npz_round_trip(tmp_path) -> None:
    grid = ScoreGrid(np.arange(6, dtype=np.float32).reshape(2, 3), 48.0, (10.0, 20.0), (0.5, 0.5), "norm")
    again = ScoreGrid.load_npz(grid.save_npz(tmp_path / "g.npz"))
    np.testing.assert_array_equal(again.scores, grid.scores)
    assert (again.cell_size_level0, again.origin, again.mpp, again.name) == (
        48.0,
        (10.0, 20.0),
        (0.5, 0.5),
        "norm",
    )


@pytest.mark.parametrize("mpp", [(0.5, 0.5), (0.25, 0.26), None])
@pytest.mark.parametrize("offset", [(0.0, 0.0), (120.5, -3000.0)])
def test_one_placement_puts_cells_vertices_and_pixels_on_the_same_level0_points(
    mpp: tuple[float, float] | None, offset: tuple[float, float]
) -> None:
    from bigslide.explain.placement import Placement

    place = Placement(mpp, offset)
    (py, px), (oy, ox) = place.raster()  # the slide layer itself
    sy, sx = place.pixel_scale
    assert (py, px) == (sy, sx)
    assert (oy, ox) == offset
    # a cell of P = 48 level-0 px whose grid starts at (x0, y0): its data index (i, j) is its centre
    p, x0, y0 = 48, 1003.0, 57.0
    (cy, cx), (ty, tx) = place.raster(p, (x0, y0))
    i, j = 3, 5
    centre = (ty + i * cy, tx + j * cx)
    assert place.to_level0(centre) == pytest.approx((x0 + (j + 0.5) * p, y0 + (i + 0.5) * p))
    # the cell's edges (data index ± 1/2) are the tile's level-0 edges
    assert place.to_level0((ty + (i - 0.5) * cy, tx + (j - 0.5) * cx)) == pytest.approx(
        (x0 + j * p, y0 + i * p)
    )
    # a shape vertex at level-0 position (x, y) lands where the same level-0 point of the raster is
    (vy, vx), (vty, vtx) = place.vertices()
    x, y = x0 + j * p, y0 + i * p
    assert place.to_level0((vty + y * vy, vtx + x * vx)) == pytest.approx((x, y))
    assert place.units == ("um" if mpp else "pixel")


def test_average_ranks_are_scipys_rankdata() -> None:
    from scipy.stats import rankdata

    from bigslide.explain.heatmap import average_ranks

    rng = np.random.default_rng(0)
    for i in range(300):
        n = int(rng.integers(1, 300))
        values = rng.integers(0, int(rng.integers(1, 20)), n) if i % 2 else rng.normal(size=n)
        assert np.array_equal(average_ranks(values.astype(np.float32)), rankdata(values.astype(np.float32)))
