"""Tile once: grids and tissue masks kept per slide between runs (made again when the slide or a tiling
setting changes), and a bounded number of slides open in the training process whatever the table's length."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shapely

from bigslide.cli import main as main_module
from bigslide.cli.main import main
from bigslide.data import processes as processes_module
from bigslide.data import slides as slides_module
from bigslide.data.bags import BagDataset
from bigslide.data.images import SlideImageDataset
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.data.tile_cache import TileCache, tile_cache_for
from bigslide.engine import Message, TrainConfig, train
from bigslide.engine.cv import prepare_folds
from bigslide.files import too_many_open_files
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.regions import Region, save_regions


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("cached-slides"), n_slides=4, size=(512, 512), seed=11)


class Opens:
    """Counts the slides `SlideCache` opens."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[Path] = []
        real = slides_module.open_with_mpp

        def counting(path: Any, *args: Any) -> Any:
            self.paths.append(Path(path))
            return real(path, *args)

        monkeypatch.setattr(slides_module, "open_with_mpp", counting)


def bags(table: SlideTable, cache: TileCache | None, **kwargs: Any) -> BagDataset:
    settings: dict[str, Any] = {"tile_size": 32, "target_mpp": 1.0, "min_tissue": 0.6, **kwargs}
    return BagDataset(table, bag_size=0, slides=SlideCache(tiles=cache), **settings)


def same_grids(a: list[TileGrid], b: list[TileGrid]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.coords, y.coords)
        np.testing.assert_array_equal(x.tissue, y.tissue)
        assert x.attributes() == y.attributes()


def test_a_second_dataset_takes_its_grids_from_the_cache_without_opening_a_slide(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = SlideTable.from_csv(slide_csv)
    uncached = bags(table, None)
    first = bags(table, TileCache(tmp_path / "tiles"))
    assert first.slides.tiles is not None
    assert first.slides.tiles.misses == len(table)
    opens = Opens(monkeypatch)
    second = bags(table, TileCache(tmp_path / "tiles"))
    assert second.slides.tiles is not None
    assert second.slides.tiles.hits == len(table)
    assert opens.paths == []  # nothing opened: the run starts at once
    same_grids(uncached.grids, second.grids)
    # what a read needs comes with the grid, without opening the slide either
    assert second.slides.mpp(table.entries[0].path) == uncached.slides.mpp(table.entries[0].path)
    assert opens.paths == []
    assert not [p for p in (tmp_path / "tiles").iterdir() if not p.name.endswith(".grid.npz")]  # no temp
    for dataset in (uncached, first, second):
        dataset.slides.close()


@pytest.mark.parametrize(
    "change",
    ["tile_size", "min_tissue", "target_mpp", "slide rewritten", "slide touched", "regions", "corrupt entry"],
)
def test_an_entry_is_made_again_when_its_slide_or_a_setting_changes(
    slide_csv: Path, tmp_path: Path, change: str
) -> None:
    slide = tmp_path / "slide.svs"
    shutil.copy(SlideTable.from_csv(slide_csv).entries[1].path, slide)
    regions = save_regions([Region(shapely.box(0, 0, 400, 400), name="r")], tmp_path / "r.geojson")
    table = SlideTable([SlideEntry(slide, "a", None, regions)], ["a"])
    cache = tmp_path / "tiles"
    before = bags(table, TileCache(cache))
    settings: dict[str, Any] = {}
    if change in ("tile_size", "min_tissue", "target_mpp"):
        settings = {"tile_size": 48, "min_tissue": 0.3, "target_mpp": 0.75}
        settings = {change: settings[change]}
    elif change == "slide rewritten":  # another slide under the same name
        shutil.copy(SlideTable.from_csv(slide_csv).entries[2].path, slide)
    elif change == "slide touched":  # the same size: the modification time tells
        stat = slide.stat()
        os.utime(slide, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    elif change == "regions":
        save_regions([Region(shapely.box(100, 100, 500, 500), name="r")], regions)
    else:
        for entry in cache.iterdir():
            entry.write_bytes(b"not a grid")
    after = bags(table, TileCache(cache), **settings)
    assert after.slides.tiles is not None
    assert after.slides.tiles.misses == 1
    same_grids(after.grids, bags(table, None, **settings).grids)
    assert after.slides.tiles.hits == 0
    again = bags(table, TileCache(cache), **settings)
    assert again.slides.tiles is not None
    assert again.slides.tiles.hits == 1
    for dataset in (before, after, again):
        dataset.slides.close()


def test_every_argument_of_the_grid_builder_is_in_the_key(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[dict[str, Any]] = []
    keyed: list[dict[str, Any]] = []
    build, keep = TileGrid.from_slide, TileCache.grid

    def spy_build(slide: Any, **kwargs: Any) -> TileGrid:
        built.append({k: v for k, v in kwargs.items() if k != "regions"})
        return build(slide, **kwargs)

    def spy_keep(
        self: TileCache, slide: Path, regions: Any, settings: dict[str, Any], *rest: Any
    ) -> TileGrid:
        keyed.append(dict(settings))
        return keep(self, slide, regions, settings, *rest)

    monkeypatch.setattr(TileGrid, "from_slide", spy_build)
    monkeypatch.setattr(TileCache, "grid", spy_keep)
    bags(SlideTable.from_csv(slide_csv), TileCache(tmp_path)).slides.close()
    assert built
    assert built == keyed


def test_image_datasets_keep_their_tissue_masks(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = SlideTable.from_csv(slide_csv)
    plain = SlideImageDataset(table, image_size=64, target_mpp=4.0)
    truth = [plain[i] for i in range(len(table))]
    SlideImageDataset(table, image_size=64, target_mpp=4.0, slides=SlideCache(tiles=TileCache(tmp_path)))[0]
    calls = []
    monkeypatch.setattr(slides_module, "tissue_mask", lambda slide: calls.append(slide) or None)
    cached = SlideImageDataset(
        table, image_size=64, target_mpp=4.0, slides=SlideCache(tiles=TileCache(tmp_path))
    )
    got = cached[0]
    assert calls == []  # the mask came from the cache
    assert (got.origin, got.downsample) == (truth[0].origin, truth[0].downsample)
    assert np.array_equal(got.x.numpy(), truth[0].x.numpy())
    for dataset in (plain, cached):
        dataset.slides.close()


def test_an_unwritable_cache_is_one_warning_and_the_run_goes_on(slide_csv: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    table = SlideTable.from_csv(slide_csv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = bags(table, TileCache(blocker / "tiles"))
    assert len(dataset.grids) == len(table)
    said = [str(w.message) for w in caught if w.category is RuntimeWarning]
    assert len(said) == 1
    assert "cannot keep tile grids there" in said[0]
    assert str(blocker / "tiles") in said[0]
    dataset.slides.close()


def test_where_the_cache_is(tmp_path: Path, slide_csv: Path) -> None:
    run = tmp_path / "runs" / "first"
    cache = tile_cache_for("auto", run)
    assert cache is not None
    assert cache.folder == tmp_path / "runs" / ".tiles"
    assert tile_cache_for("none", run) is None
    named = tile_cache_for(str(tmp_path / "mine"), run)
    assert named is not None
    assert named.folder == tmp_path / "mine"
    config = TrainConfig()
    config.data.csv, config.run.out_dir = str(slide_csv), str(tmp_path / "runs" / "cv")
    folds = prepare_folds(config, 2)
    # every fold reads one cache, beside the cross-validation's folder
    assert {f.config.data.tile_cache for f in folds} == {str(tmp_path / "runs" / ".tiles")}


def test_a_second_training_run_tiles_nothing(slide_csv: Path, tmp_path: Path) -> None:
    def run(name: str) -> list[str]:
        config = TrainConfig()
        config.data.csv, config.data.tile_size, config.data.bag_size = str(slide_csv), 32, 4
        config.model.backbone, config.optim.max_steps = "test_resnet", 1
        config.run.out_dir, config.run.device, config.run.tensorboard = str(tmp_path / name), "cpu", False
        return [e.text for e in train(config) if isinstance(e, Message) and e.text.startswith("tile grids")]

    def drawn() -> dict[str, int]:
        """The tissue check's thumbnails kept in the cache (drawn by the decode workers), by when written."""
        return {p.name: p.stat().st_mtime_ns for p in (tmp_path / ".tiles").glob("*.check.png")}

    assert run("first") == [f"tile grids: 0 from {tmp_path / '.tiles'}, 4 made and kept there"]
    first_drawn = drawn()
    assert len(first_drawn) == 4  # the tissue check's thumbnails, kept in the cache too
    assert run("second") == [f"tile grids: 4 from {tmp_path / '.tiles'}, 0 made and kept there"]
    assert drawn() == first_drawn  # the second run draws none
    first = sorted((tmp_path / "first" / "tissue_check").glob("*.png"))
    second = sorted((tmp_path / "second" / "tissue_check").glob("*.png"))
    assert len(first) == 4
    assert [p.name for p in first] == [p.name for p in second]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(first, second, strict=True))


def test_a_process_keeps_a_bounded_number_of_slides_open(slide_csv: Path, tmp_path: Path) -> None:
    table = SlideTable.from_csv(slide_csv)
    cache = SlideCache(max_open=2)
    dataset = BagDataset(table, tile_size=32, bag_size=5, slides=cache)
    assert cache.open_count() == 2
    for i in range(len(table)):
        dataset[i]  # read on this thread
        assert cache.open_count() <= 2
    paths = [e.path for e in table.entries]
    with cache.opened(paths[0]) as first, cache.opened(paths[1]), cache.opened(paths[2]):
        assert cache.open_count() == 3  # slides being read stay open, beyond the limit
        assert first.read_region((0, 0), 0, (4, 4)).shape == (4, 4, 3)
    assert cache.open_count() == 2
    cache.close()
    assert cache.open_count() == 0


def test_a_table_longer_than_the_open_files_limit_trains(slide_csv: Path, tmp_path: Path) -> None:
    """300 slides (links to a few files) under `ulimit -n 256`: the process kept every slide open and
    stopped at about the 130th with 'Too many open files'."""
    source = SlideTable.from_csv(slide_csv).entries
    folder = tmp_path / "links"
    folder.mkdir()
    rows = ["slide,label"]
    for i in range(300):
        link = folder / f"s{i:03d}.svs"
        link.symlink_to(source[i % len(source)].path)
        rows.append(f"{link},{source[i % len(source)].label}")
    (tmp_path / "table.csv").write_text("\n".join(rows) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"data: {{csv: {tmp_path / 'table.csv'}, tile_size: 32, bag_size: 4, workers: 2}}\n"
        "model: {backbone: test_resnet}\n"
        f"optim: {{max_steps: 3}}\nrun: {{device: cpu, tensorboard: false, out_dir: {tmp_path / 'run'}}}\n"
    )
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from bigslide.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "train", str(config), "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()


def test_running_out_of_files_anyway_is_one_line_naming_the_limit(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tiffslide

    def refused(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    monkeypatch.setattr(tiffslide, "TiffSlide", refused)  # a slide opened when no descriptor is left
    # decode workers forked from this process see the refusal too (after a napari test, they would come
    # from its fork server)
    monkeypatch.setattr(processes_module, "_START_METHOD", "fork")
    code = main(["train", "--set", f"data.csv={slide_csv}", "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1
    assert err[0].startswith("bigslide: error: ")
    assert f"too many open files: this process may have {soft} open at once (`ulimit -n`)" in err[0]
    monkeypatch.setattr(main_module, "cmd_methods", refused)  # anywhere else: the command's own line
    assert main(["methods"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"bigslide: error: {too_many_open_files()}"]
