"""Bags and slide images: the tiles and pixels a method gets are the ones the coordinates say."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from skimage.transform import resize

from bigslide import open_slide
from bigslide.data.bags import BagDataset
from bigslide.data.colour import SampleView, row_colour
from bigslide.data.images import SlideImageDataset
from bigslide.data.sample import Sample, as_float
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.errors import DataError
from bigslide.synthetic.slides import make_synthetic_slide


@pytest.fixture(scope="module")
def tissue_slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ds") / "s.svs"
    make_synthetic_slide(path, size=(1024, 768), lesions=1, seed=5)
    return path


def table_of(path: Path, regions: Path | None = None) -> SlideTable:
    return SlideTable([SlideEntry(path, "tumor", "train", regions)], ["normal", "tumor"])


def test_bag_tiles_are_the_pixels_at_their_level0_coordinates(tissue_slide: Path) -> None:
    ds = BagDataset(table_of(tissue_slide), tile_size=32, target_mpp=1.0, bag_size=5, seed=1)  # level 1 as is
    bag = ds[0]
    assert bag.x.shape == (5, 3, 32, 32)
    assert bag.tile_size_level0 == 64
    assert bag.y == 1
    with open_slide(tissue_slide) as slide:
        for tile, (x, y) in zip(bag.x, bag.coords):
            expected = slide.read_region((int(x), int(y)), 1, (32, 32))
            assert torch.equal(tile, torch.from_numpy(expected).permute(2, 0, 1))  # uint8, as read


def test_bag_sampling_depends_on_seed_epoch_and_slide_only(tissue_slide: Path) -> None:
    ds = BagDataset(table_of(tissue_slide), tile_size=32, bag_size=8, seed=1)
    first = ds.tile_indices(0)
    np.testing.assert_array_equal(first, ds.tile_indices(0))
    assert len(set(first.tolist())) == 8
    ds.set_epoch(1)
    assert not np.array_equal(first, ds.tile_indices(0))
    everything = BagDataset(table_of(tissue_slide), tile_size=32, bag_size=0)
    np.testing.assert_array_equal(everything.tile_indices(0), np.arange(len(everything.grids[0])))


def test_augmentation_is_one_transform_for_the_whole_bag(tissue_slide: Path) -> None:
    plain = BagDataset(table_of(tissue_slide), tile_size=32, bag_size=12, seed=4)
    aug = BagDataset(table_of(tissue_slide), tile_size=32, bag_size=12, seed=4, augment=True)
    sample = aug[0]
    # the host keeps the pixels as read; the view is applied where they become floats
    assert torch.equal(sample.x, plain[0].x)
    assert sample.view is not None
    colour = row_colour([sample], None)
    assert colour is not None
    raw, out = as_float(plain[0].x), as_float(sample.x, colour)
    halves = torch.cat([as_float(sample.x[:5], colour[:5]), as_float(sample.x[5:], colour[5:])])
    torch.testing.assert_close(halves, out)  # chunk by chunk, as methods move bags: the same view
    dihedral = [(k, f) for k in range(4) for f in (False, True)]

    def apply(t: torch.Tensor, k: int, flip: bool) -> torch.Tensor:
        t = torch.rot90(t, k, dims=(-2, -1))
        return torch.flip(t, dims=(-1,)) if flip else t

    # the transform that best explains each tile (after a per-bag affine colour change)
    chosen = []
    for r, o in zip(raw, out):
        errors = []
        for k, f in dihedral:
            a = apply(r, k, f).flatten()
            coef = np.polyfit(a.numpy(), o.flatten().numpy(), 1)
            errors.append((np.abs(np.polyval(coef, a.numpy()) - o.flatten().numpy()).mean(), coef))
        best = int(np.argmin([e for e, _ in errors]))
        chosen.append((best, errors[best][1]))
    assert len({c[0] for c in chosen}) == 1, "tiles of one bag were transformed differently"
    assert chosen[0][0] == sample.view.turns * 2 + sample.view.mirror
    slopes = [c[1][0] for c in chosen]
    assert np.ptp(slopes) < 0.02, "contrast differs between tiles of one bag"
    assert abs(slopes[0] - sample.view.contrast) < 0.02


def test_bags_of_one_batch_each_keep_their_own_view() -> None:
    rng = np.random.default_rng(0)
    views = [SampleView(1, False, 1.1, -0.02), SampleView(0, True), None]
    samples = [
        Sample(
            x=torch.from_numpy(rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8)),
            y=0,
            slide=str(k),
            coords=np.zeros((n, 2), np.int64),
            view=v,
        )
        for k, (n, v) in enumerate(zip((3, 2, 4), views))
    ]
    colour = row_colour(samples, None)
    assert colour is not None
    got = as_float(torch.cat([s.x for s in samples]), colour).split([3, 2, 4])
    first = as_float(samples[0].x)
    torch.testing.assert_close(got[0], (torch.rot90(first, 1, dims=(-2, -1)) * 1.1 - 0.02).clamp(0, 1))
    torch.testing.assert_close(got[1], torch.flip(as_float(samples[1].x), dims=(-1,)))
    torch.testing.assert_close(got[2], as_float(samples[2].x))


def test_empty_tissue_is_a_clear_error(tmp_path: Path) -> None:
    from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid

    blank = np.full((512, 512, 3), 245, np.uint8)
    path = write_pyramid(tmp_path / "blank.svs", downsample_pyramid(blank, 2))
    with pytest.raises(DataError, match=r"blank\.svs: no tile of 32 px at 0\.5 µm/px has tissue >= 0\.6"):
        BagDataset(table_of(path), tile_size=32)


def test_slide_image_covers_the_regions_square_and_maps_back_to_level0(
    tissue_slide: Path, tmp_path: Path
) -> None:
    regions = tmp_path / "r.geojson"
    ring = [[200, 100], [600, 100], [600, 400], [200, 400], [200, 100]]  # 400 x 300 box
    regions.write_text(
        json.dumps(
            {
                "type": "FeatureCollection",
                "features": [
                    {
                        "type": "Feature",
                        "geometry": {"type": "Polygon", "coordinates": [ring]},
                        "properties": {},
                    }
                ],
            }
        )
    )
    # 100 px at 2 µm/px = 400 level-0 px of this 0.5 µm/px slide
    sample = SlideImageDataset(table_of(tissue_slide, regions), image_size=100, target_mpp=2.0)[0]
    assert sample.x.shape == (3, 100, 100)
    # square of side 400 centred on the box: x 200..600, y 50..450; 4 level-0 px per image px
    assert sample.origin == (200, 50)
    assert sample.downsample == pytest.approx(4.0)
    with open_slide(tissue_slide) as slide:
        crop = slide.read_region((200, 50), 0, (400, 400))
    expected = resize(crop, (100, 100), order=1, anti_aliasing=True, preserve_range=True) / 255
    got = as_float(sample.x).permute(1, 2, 0).numpy()
    assert np.abs(got - expected).mean() < 0.03
