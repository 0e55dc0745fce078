"""Tiles at a physical resolution: the same tissue scanned at different µm/px gives the same tiles,
the same prediction, and a checkpoint reads every slide at the resolution it was trained at."""

from __future__ import annotations

import dataclasses
import itertools
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from skimage.transform import rescale

from bigslide import open_slide
from bigslide.data.bags import BagDataset
from bigslide.data.decode import read_squares
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.engine import TrainConfig, predict_slides, run_to_end, train
from bigslide.engine.config import DataConfig
from bigslide.errors import ConfigError
from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slides import synthesize_slide
from bigslide.wsi.resolution import plan_read, resize_square

BASE_MPP = 0.25


@pytest.fixture(scope="module")
def scans(tmp_path_factory: pytest.TempPathFactory) -> dict[float, Path]:
    """One tissue written at 0.25 µm/px (one level: 0.5 must be resampled), 0.4 and 0.5 µm/px."""
    folder = tmp_path_factory.mktemp("scans")
    fine = synthesize_slide((1024, 1024), lesions=1, seed=11).rgb
    out = {
        0.25: write_pyramid(folder / "scan_025.svs", [fine], mpp=0.25),
        0.5: write_pyramid(folder / "scan_05.svs", downsample_pyramid(fine, 3)[1:], mpp=0.5),
    }
    coarse = rescale(fine, BASE_MPP / 0.4, channel_axis=-1, anti_aliasing=True, preserve_range=True)
    out[0.4] = write_pyramid(
        folder / "scan_04.tif",
        downsample_pyramid(np.round(coarse).astype(np.uint8), 2),
        mpp=0.4,
        flavour="tiff",
    )
    return out


def table_of(*paths: Path) -> SlideTable:
    return SlideTable([SlideEntry(p, "tumor", "train") for p in paths], ["normal", "tumor"])


def tiles_by_micron(path: Path, mpp: float, tile: int = 32) -> dict[tuple[int, int], np.ndarray]:
    """Every tissue tile at `mpp`, keyed by its top-left corner in µm."""
    bags = BagDataset(table_of(path), tile_size=tile, target_mpp=mpp, bag_size=0, min_tissue=0.3)
    sample = bags[0]
    slide_mpp = bags.slides.mpp(path)
    assert slide_mpp is not None
    bags.slides.close()
    keys = [(round(x * slide_mpp[0]), round(y * slide_mpp[0])) for x, y in sample.coords]
    return {k: t.permute(1, 2, 0).numpy().astype(np.float64) for k, t in zip(keys, sample.x)}


def test_plan_reads_the_coarsest_level_at_least_as_fine_and_skips_resampling_within_10_percent(
    scans: dict[float, Path],
) -> None:
    with open_slide(scans[0.5]) as slide:  # levels at 0.5, 1, 2 µm/px
        assert (plan_read(slide, 64, 0.5).level, plan_read(slide, 64, 0.5).resamples) == (0, False)
        as_stored = plan_read(slide, 64, 1.08)  # within 10 % of level 1: read as is
        assert (as_stored.level, as_stored.read_size, as_stored.size_level0) == (1, 64, 128)
        between = plan_read(slide, 64, 1.5)  # between levels 1 and 2: level 1, resized 96 -> 64
        assert (between.level, between.read_size, between.size_level0) == (1, 96, 192)
        finer = plan_read(slide, 64, 0.25)  # finer than level 0: level 0 upsampled 32 -> 64
        assert (finer.level, finer.read_size, finer.size_level0) == (0, 32, 32)


def test_two_scans_at_different_mpp_give_the_same_tiles(scans: dict[float, Path]) -> None:
    reference = tiles_by_micron(scans[0.5], 0.5)  # stored at 0.5: no resampling
    for mpp in (0.25, 0.4):
        other = tiles_by_micron(scans[mpp], 0.5)
        shared = sorted(set(reference) & set(other))
        assert len(shared) >= 0.9 * len(reference), (mpp, len(shared), len(reference))
        errors = [np.abs(reference[k] - other[k]).mean() for k in shared]
        # resampling error only: a few grey levels per pixel, against ~60 between neighbouring tiles
        assert np.mean(errors) < 4.0, (mpp, np.mean(errors))
        neighbours = [np.abs(reference[a] - reference[b]).mean() for a, b in itertools.pairwise(shared)]
        assert np.mean(neighbours) > 5 * np.mean(errors)


def test_read_squares_matches_read_region_and_resize(scans: dict[float, Path]) -> None:
    rng = np.random.default_rng(0)
    with open_slide(scans[0.25]) as slide:
        plan = plan_read(slide, 48, 0.55)  # level 0, 106 px resized to 48
        coords = rng.integers(-80, 1040, (40, 2))
        expected = np.stack(
            [
                resize_square(slide.read_region((int(x), int(y)), plan.level, (plan.read_size,) * 2), 48)
                for x, y in coords
            ]
        ).transpose(0, 3, 1, 2)  # read_squares gives channels first
        np.testing.assert_array_equal(read_squares(slide, plan, coords), expected)
        read_before = slide.pixels_read[0]
        with ThreadPoolExecutor(2) as pool:
            np.testing.assert_array_equal(read_squares(slide, plan, coords, pool), expected)
        th, tw = slide.tile_shape(0)
        files = {
            (r, c)
            for x, y in coords
            for r in range(max(y, 0) // th, (min(y + plan.read_size, 1024) - 1) // th + 1)
            for c in range(max(x, 0) // tw, (min(x + plan.read_size, 1024) - 1) // tw + 1)
            if x < 1024 and y < 1024 and x + plan.read_size > 0 and y + plan.read_size > 0
        }
        # each touched file tile decoded exactly once (all tiles here are full 256 x 256)
        assert slide.pixels_read[0] - read_before == len(files) * th * tw


def test_magnification_is_an_alias_of_target_mpp() -> None:
    assert DataConfig(magnification=40).target_mpp == 0.25
    assert DataConfig(magnification=20, target_mpp=0.5).target_mpp == 0.5
    assert DataConfig().target_mpp == 0.5
    with pytest.raises(ConfigError, match="disagree"):
        DataConfig(magnification=40, target_mpp=0.5)
    round_trip = TrainConfig.from_dict(TrainConfig(data=DataConfig(magnification=10)).to_dict())
    assert round_trip.data.target_mpp == 1.0


def test_an_old_config_with_data_mpp_reads_as_target_mpp(tmp_path: Path) -> None:
    old = tmp_path / "config.yaml"
    old.write_text("data:\n  mpp: 1.0\n  slide_mpp: 0.25\n")
    with pytest.warns(FutureWarning, match=r"data\.mpp is now data\.target_mpp"):
        config = TrainConfig.from_yaml(old)
    assert (config.data.target_mpp, config.data.slide_mpp) == (1.0, 0.25)
    old.write_text("data:\n  mpp: 1.0\n  target_mpp: 0.5\n")
    with pytest.raises(ConfigError, match=r"drop data\.mpp"):
        TrainConfig.from_yaml(old)


def test_predict_reads_every_scan_at_the_checkpoints_mpp(scans: dict[float, Path], tmp_path: Path) -> None:
    config = TrainConfig()
    twin = tmp_path / "twin.svs"  # a second class to train on (the model's use here is its reading)
    shutil.copy(scans[0.5], twin)
    csv = SlideTable(
        [SlideEntry(scans[0.5], "tumor", "train"), SlideEntry(twin, "normal", "train")], ["normal", "tumor"]
    ).to_csv(tmp_path / "slides.csv")
    config.data.csv = str(csv)
    config.data.tile_size, config.data.bag_size, config.data.min_tissue = 32, 8, 0.3
    config.data.mpp, config.data.workers = 0.5, 0
    config.method.name = "frozen_abmil"
    config.model.backbone = "resnet18"
    config.optim.epochs, config.optim.lr = 1, 1e-2
    config.run.out_dir, config.run.device = str(tmp_path / "run"), "cpu"
    result = run_to_end(train(config))
    assert result.checkpoint is not None

    table = table_of(scans[0.5], scans[0.25], scans[0.4])
    preds, _ = predict_slides(result.checkpoint, table, device="cpu", repeats=0)
    sizes = [p.grids["attention"].cell_size_level0 for p in preds]
    # 32 px at the checkpoint's 0.5 µm/px = 16 µm on each scanner (level 0 as stored would give 32 each)
    assert sizes == [32, 64, 40]
    p05, p025, p04 = (p.probs for p in preds)
    np.testing.assert_allclose(p025, p05, atol=0.02)
    np.testing.assert_allclose(p04, p05, atol=0.02)


def test_a_slide_without_mpp_predicts_with_a_given_pixel_size(
    scans: dict[float, Path], tmp_path: Path
) -> None:
    with open_slide(scans[0.5]) as slide:
        level = slide.read_level(0)
    path = write_pyramid(tmp_path / "nompp.tif", downsample_pyramid(level, 2), mpp=None, flavour="tiff")
    cache = SlideCache(slide_mpp=0.5)
    grid = cache.grid(SlideEntry(path, "tumor"), 32, 0.5, 0.3)
    cache.close()
    reference = BagDataset(table_of(scans[0.5]), tile_size=32, target_mpp=0.5, min_tissue=0.3)
    np.testing.assert_array_equal(grid.coords, reference.grids[0].coords)
    reference.slides.close()


@pytest.mark.parametrize("workers", [0, 1], ids=["this_process", "decode_worker"])
def test_a_tables_mpp_column_reads_each_file_stating_none_at_its_rows_pixel_size(
    scans: dict[float, Path], tmp_path: Path, workers: int
) -> None:
    """A cohort of files that state no pixel size, scanned at two magnifications: one data.slide_mpp
    cannot serve both, each row's mpp does, in this process and in the decode workers alike."""
    from bigslide.data.processes import DecodeProcesses

    unstated = {}
    for mpp in (0.25, 0.5):
        with open_slide(scans[mpp]) as slide:
            level = slide.read_level(0)
        unstated[mpp] = write_pyramid(tmp_path / f"scan_{mpp}.tif", [level], mpp=None, flavour="tiff")
    csv = tmp_path / "slides.csv"
    csv.write_text(f"slide;label;µm/px\n{unstated[0.25].name};tumor;0,25\n{unstated[0.5].name};tumor;0.5\n")
    table = SlideTable.from_csv(csv)
    assert [e.mpp for e in table.entries] == [0.25, 0.5]
    processes = DecodeProcesses(workers) if workers else None
    try:
        slides = SlideCache(slide_mpp=1.0, workers=processes)  # the fallback: right for neither
        bags = BagDataset(table, tile_size=32, target_mpp=0.5, bag_size=0, min_tissue=0.3, slides=slides)
        sizes = [grid.plan.size_level0 for grid in bags.grids]
        assert sizes == [64, 32]  # 16 µm tiles on each scan
        read = [bags[i].x.numpy().astype(np.float64) for i in range(2)]
        slides.close()
        # the same workers, the table's mpp taken away: the fallback again, not the earlier table's
        unset = table.like([dataclasses.replace(e, mpp=None) for e in table.entries])
        again = SlideCache(slide_mpp=1.0, workers=processes)
        bags = BagDataset(unset, tile_size=32, target_mpp=0.5, bag_size=0, min_tissue=0.3, slides=again)
        assert [grid.plan.size_level0 for grid in bags.grids] == [16, 16]
        again.close()
    finally:
        if processes is not None:
            processes.close()
    reference = BagDataset(table_of(scans[0.5]), tile_size=32, target_mpp=0.5, bag_size=0, min_tissue=0.3)
    truth = reference[0].x.numpy().astype(np.float64)
    reference.slides.close()
    np.testing.assert_array_equal(read[1], truth)  # read as stated, the same tiles
    assert read[0].shape == truth.shape
    assert np.abs(read[0] - truth).mean() < 6  # resampled from the finer scan: the same tissue


def test_a_tables_mpp_at_odds_with_the_files_is_refused_naming_both(
    scans: dict[float, Path], tmp_path: Path
) -> None:
    from bigslide.errors import SlideError

    slides = SlideCache()
    link = tmp_path / "linked.svs"  # a table may name the file by another path than the one read
    link.symlink_to(scans[0.5])
    slides.state({link: 0.5})
    assert slides.table_mpp(scans[0.5]) == 0.5
    slides.state({scans[0.25]: 0.252})  # a calibration rounded otherwise: the file's is read
    assert slides.mpp(scans[0.25]) == (0.25, 0.25)
    slides.state({scans[0.25]: 0.5})  # a 40x scan listed as 20x
    with pytest.raises(
        SlideError, match=r"scan_025\.svs: the slide table gives 0\.5 µm/px, but the file states 0\.25;"
    ):
        slides.mpp(scans[0.25])
    slides.close()


def test_a_slide_of_pixels_that_are_not_square_is_refused_by_name(tmp_path: Path) -> None:
    """Read at its x pixel size alone, a 0.5 x 0.25 µm slide's tiles covered twice as much width as height."""
    import tifffile

    from bigslide.errors import SlideError
    from bigslide.wsi.resolution import slide_mpp

    image = np.full((512, 512, 3), 200, np.uint8)
    for name, (x, y) in (("oblong.tif", (0.5, 0.25)), ("rounded.tif", (0.5, 0.5015))):
        path = tmp_path / name
        tifffile.imwrite(
            path, image, tile=(256, 256), resolution=(1e4 / x, 1e4 / y), resolutionunit="CENTIMETER"
        )
        with open_slide(path) as slide:
            if name == "rounded.tif":  # a calibration rounded differently on each axis is square
                assert slide_mpp(slide) == pytest.approx(0.5)
                continue
            with pytest.raises(
                SlideError, match=r"oblong\.tif: the file states pixels of 0\.5 x 0\.25 µm, not"
            ):
                slide_mpp(slide)
