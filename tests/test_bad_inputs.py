"""Bad input, end to end through the CLI: one clear line naming the culprit, a non-zero exit, nothing lost.

Every case of the table resumes a copy of one small trained run, so each also checks that the run's
last checkpoint is untouched by the failure.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from bigslide.cli.main import main
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideEntry
from bigslide.engine import TrainConfig, run_to_end, train
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.errors import SlideError
from bigslide.methods.base import StepResult
from bigslide.synthetic.pyramid import LazyLevel, downsample_pyramid, write_pyramid
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.tissue import tissue_mask
from bigslide.wsi.slide import WHOLE_READ_PIXELS, open_slide
from tests.conftest import textured_tissue


@dataclass(frozen=True)
class Base:
    """A slide set and a trained run (2 steps of frozen_abmil) whose folder each case copies."""

    csv: Path
    config: Path
    run: Path

    @property
    def slides(self) -> Path:
        return self.csv.parent

    def slide(self, i: int) -> Path:
        return self.slides / f"slide_{i:03d}.svs"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    folder = tmp_path_factory.mktemp("bad-inputs")
    csv = make_slide_set(folder / "slides", n_slides=4, size=(512, 512), seed=5)
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size = 32
    config.data.bag_size = 4
    config.method.name = "frozen_abmil"
    config.method.params = {"hidden": 32, "attention_dim": 16}
    config.optim.max_steps = 2
    config.run.out_dir = str(folder / "run")
    config.run.device = "cpu"
    config.run.deterministic = True
    run_to_end(train(config))
    return Base(csv, config.to_yaml(folder / "config.yaml"), folder / "run")


# -- the inputs ---------------------------------------------------------------------------------------
def write_csv(folder: Path, rows: list[tuple[object, ...]], header: str = "slide,label,split") -> Path:
    path = folder / "table.csv"
    path.write_text(header + "\n" + "".join(",".join(str(v) for v in row) + "\n" for row in rows))
    return path


def with_slide(base: Base, folder: Path, slide: Path) -> Path:
    """The base table with slide 0 replaced by `slide` (in the train split)."""
    rows = [(slide, "tumor", "train")] + [(base.slide(i), "normal", "train") for i in (1, 2)]
    return write_csv(folder, [*rows, (base.slide(3), "tumor", "val")])


def truncated(base: Base, folder: Path) -> list[str]:
    cut = folder / "truncated.svs"
    data = base.slide(0).read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    return ["--set", f"data.csv={with_slide(base, folder, cut)}"]


def damaged_tiles(base: Base, folder: Path) -> list[str]:
    """A copy of a slide whose file tiles' JPEG data is overwritten: it opens, but no tile decodes."""
    import tifffile

    hurt = folder / "damaged.svs"
    hurt.write_bytes(base.slide(0).read_bytes())
    with tifffile.TiffFile(hurt) as tif:
        spots = [(o, n) for page in tif.pages for o, n in zip(page.dataoffsets, page.databytecounts)]
    with hurt.open("r+b") as f:
        for offset, count in spots:
            f.seek(offset + 2)
            f.write(bytes([0xFF, 0xC4, 0x00, 0x01]) * ((count - 4) // 4))
    return ["--set", f"data.csv={with_slide(base, folder, hurt)}"]


def not_a_tiff(base: Base, folder: Path) -> list[str]:
    fake = folder / "scan.svs"
    fake.write_text("<html>this download failed</html>")
    return ["--set", f"data.csv={with_slide(base, folder, fake)}"]


def blank_slide(base: Base, folder: Path) -> list[str]:
    glass = np.full((512, 512, 3), 240, np.uint8)
    path = write_pyramid(folder / "blank.svs", downsample_pyramid(glass, 2), mpp=0.5)
    return ["--set", f"data.csv={with_slide(base, folder, path)}"]


def csv_missing_file(base: Base, folder: Path) -> list[str]:
    rows = [(base.slide(0), "tumor", "train"), ("gone/missing.svs", "normal", "train")]
    return ["--set", f"data.csv={write_csv(folder, rows)}"]


def csv_duplicate(base: Base, folder: Path) -> list[str]:
    rows = [(base.slide(i), "tumor", "train") for i in (0, 1)] + [(base.slide(0), "tumor", "val")]
    return ["--set", f"data.csv={write_csv(folder, rows)}"]


def csv_one_class(base: Base, folder: Path) -> list[str]:
    rows = [(base.slide(i), "tumor", split) for i, split in ((0, "train"), (1, "train"), (2, "val"))]
    return ["--set", f"data.csv={write_csv(folder, rows)}"]


def regions_csv(base: Base, folder: Path, geojson: str) -> list[str]:
    regions = folder / "regions.geojson"
    regions.write_text(geojson)
    rows = [(base.slide(0), "tumor", "train", regions), (base.slide(1), "normal", "train", "")]
    return ["--set", f"data.csv={write_csv(folder, rows, 'slide,label,split,regions')}"]


def geojson_malformed(base: Base, folder: Path) -> list[str]:
    return regions_csv(base, folder, '{"type": "FeatureCollection", "features": [')


def geojson_outside(base: Base, folder: Path) -> list[str]:
    far = [[[5000, 5000], [5600, 5000], [5600, 5600], [5000, 5600], [5000, 5000]]]
    feature = {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": far}, "properties": {}}
    return regions_csv(
        base, folder, str({"type": "FeatureCollection", "features": [feature]}).replace("'", '"')
    )


def predict_unknown_label(base: Base, folder: Path) -> list[str]:
    rows = [(base.slide(0), "tumor", ""), (base.slide(1), "tumour", "")]
    ckpt = folder / "run" / "checkpoints" / "last.pt"
    return ["predict", "--slides", str(write_csv(folder, rows)), "--checkpoint", str(ckpt)]


def nan_step(*_: object) -> StepResult:
    return StepResult(float("nan"), torch.zeros(1, 2))


def oom_step(*_: object) -> StepResult:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def disk_full_on_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    def replace(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", replace)


@dataclass(frozen=True)
class Case:
    name: str
    args: Callable[[Base, Path], list[str]]
    message: str  # regex on the one stderr line; {run} stands for the run folder
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    code: int = 2


def _patch_step(step: Callable[..., StepResult]) -> Callable[[pytest.MonkeyPatch], None]:
    def apply(monkeypatch: pytest.MonkeyPatch) -> None:
        from bigslide.methods.mil_baselines import FrozenABMIL

        monkeypatch.setattr(FrozenABMIL, "train_step", step)

    return apply


CASES = [
    Case("truncated-tiff", truncated, r"truncated\.svs: .*(truncated|not a readable TIFF)"),
    Case(
        "damaged-tiles",
        damaged_tiles,
        r"damaged\.svs: cannot decode file tile \(row \d+, col \d+\) of level \d .*; "
        r"set data\.skip_bad_slides: true to leave such slides out",
    ),
    Case(
        "non-tiff-named-svs",
        not_a_tiff,
        r"scan\.svs: not a readable TIFF slide \(it does not begin as a TIFF file does: damaged, cut short",
    ),
    Case(
        "slide-smaller-than-tile",
        lambda b, f: ["--set", "data.tile_size=1024"],
        r"slide_00\d\.svs: a tile of 1024 px does not fit the slide \(512 x 512 px at level 0\)",
    ),
    Case("empty-tissue", blank_slide, r"blank\.svs: no tile of 32 px at 0\.5 µm/px has tissue >= 0\.6"),
    Case(
        "csv-missing-file", csv_missing_file, r"table\.csv, row 3: slide file not found: .*gone/missing\.svs"
    ),
    Case("csv-unknown-label", predict_unknown_label, r"table\.csv, row 3: unknown label 'tumour'; known"),
    Case(
        "csv-duplicate-row",
        csv_duplicate,
        r"table\.csv, row 4: slide_000\.svs is listed twice \(first at row 2\)",
    ),
    Case(
        "csv-one-class",
        csv_one_class,
        r"data: every slide of .*table\.csv is labelled 'tumor': a classifier learns from slides of at least",
    ),
    Case("geojson-malformed", geojson_malformed, r"regions\.geojson: not valid JSON"),
    Case(
        "geojson-outside-slide",
        geojson_outside,
        r"regions\.geojson: .*slide_000\.svs: region 0 with bounds x 5000\.\.5600, y 5000\.\.5600 "
        r"lies outside the slide \(512 x 512 px\)",
    ),
    Case(
        "slide-mpp-not-positive",
        lambda b, f: ["--slide-mpp", "-0.5"],
        r"data\.slide_mpp must be a positive number .*-0\.5",
    ),
    Case(
        "mpp-not-positive",
        lambda b, f: ["--set", "data.target_mpp=0"],
        r"data\.target_mpp must be a positive number .*got 0",
    ),
    Case(
        "mpp-magnification-disagree",
        lambda b, f: ["--set", "data.target_mpp=0.5", "--set", "data.magnification=40"],
        r"data\.target_mpp=0\.5 and data\.magnification=40 disagree \(40x is 0\.25 µm/px\)",
    ),
    Case(
        "nan-loss",
        lambda b, f: [],
        r"loss became nan at step 3 \(epoch 1\); the last good checkpoint is {run}/checkpoints/last\.pt\. "
        r"Lower optim\.lr",
        _patch_step(nan_step),
    ),
    Case(
        "out-of-memory",
        lambda b, f: [],
        r"out of memory at step 3 \(frozen_abmil on cpu\): try .*data\.bag_size=2 \(now 4\) "
        r"or run\.amp=bf16; the last good checkpoint is {run}/checkpoints/last\.pt",
        _patch_step(oom_step),
    ),
    Case(
        "checkpoint-disk-full",
        lambda b, f: [],
        r"could not write checkpoint {run}/checkpoints/last\.pt: No space left on device",
        disk_full_on_replace,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_naming_the_culprit_and_loses_nothing(
    case: Case,
    base: Base,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    shutil.copytree(base.run, run)
    before = load_checkpoint(run / "checkpoints" / "last.pt")
    args = case.args(base, tmp_path)
    if args[:1] != ["predict"]:
        args = [
            "train",
            str(base.config),
            "--out",
            str(run),
            "--resume",
            "--epochs",
            "3",
            "--max-steps",
            "4",
            "--quiet",
            *args,
        ]
    if case.patch:
        case.patch(monkeypatch)
    code = main(args)
    monkeypatch.undo()

    assert code == case.code
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    assert re.search(case.message.replace("{run}", re.escape(str(run))), lines[0]), lines[0]
    assert lines[0].startswith("bigslide: error: ")

    after = load_checkpoint(run / "checkpoints" / "last.pt")
    assert after["position"] == before["position"]
    for key, value in before["model"].items():
        assert torch.equal(after["model"][key], value), key
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.pt"]  # no stray temp file


# -- inputs that work, with a warning --------------------------------------------------------------------
def test_predict_reads_a_slide_stating_no_pixel_size_at_its_table_rows(
    base: Base, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bigslide predict` on a table whose mpp column gives a file's pixel size: predicted with its maps,
    on decode workers, with no --slide-mpp; the same table without it names the slide."""
    with open_slide(base.slide(0)) as slide:
        pixels, mpp = slide.read_level(0), slide.mpp
    assert mpp is not None
    path = write_pyramid(tmp_path / "nompp.tif", downsample_pyramid(pixels, 2), mpp=None, flavour="tiff")
    ckpt = str(base.run / "checkpoints" / "last.pt")
    for given, code in ((f"{mpp[0]:g}", 0), ("", 1)):  # 1: a slide failed, named in its row
        table = write_csv(tmp_path, [(path, "tumor", given)], header="slide,label,mpp")
        out = tmp_path / f"out-{code}"
        argv = ["predict", "--slides", str(table), "--checkpoint", ckpt, "--out", str(out), "--workers", "1"]
        assert main([*argv, "--quiet"]) == code
        err = capsys.readouterr().err
        rows = list(csv.DictReader((out / "predictions.csv").open()))
        if code == 0:
            assert rows[0]["error"] == "", rows
            assert (out / "heatmaps" / "nompp.attention.png").is_file()
        else:
            assert "nompp.tif: the file states no pixel size" in err + rows[0]["error"]


def test_slide_without_mpp_is_an_error_naming_it_unless_a_pixel_size_is_given(
    base: Base, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = np.full((256, 256, 3), 240, np.uint8)
    image[64:192, 64:192] = (150, 60, 140)
    path = write_pyramid(tmp_path / "nompp.tif", downsample_pyramid(image, 2), mpp=None, flavour="tiff")
    entry = SlideEntry(path, "tumor")

    unknown, assumed = SlideCache(), SlideCache(slide_mpp=0.25)
    with pytest.raises(
        SlideError, match=r"nompp\.tif: the file states no pixel size \(mpp\).*data\.slide_mpp"
    ):
        unknown.grid(entry, 32, 0.25, 0.6)
    unknown.close()

    given = assumed.grid(entry, 32, 0.25, 0.6)
    assumed.close()
    assert given.slide_mpp == (0.25, 0.25)
    assert len(given) == 16  # the 4 x 4 tiles of the planted square, read as stored

    from bigslide.cli.main import build_parser
    from bigslide.cli.train import config_from_args

    args = build_parser().parse_args(["train", str(base.config), "--slide-mpp", "0.25"])
    config = config_from_args(args)
    assert (config.data.slide_mpp, config.data.target_mpp) == (0.25, 0.5)
    args = build_parser().parse_args(["train", str(base.config), "--target-mpp", "1.0"])
    config = config_from_args(args)
    assert (config.data.slide_mpp, config.data.target_mpp) == (None, 1.0)
    # a magnification alone is the resolution asked for, not a disagreement with the default 0.5 µm/px
    args = build_parser().parse_args(["train", str(base.config), "--set", "data.magnification=40"])
    assert config_from_args(args).data.target_mpp == 0.25
    args = build_parser().parse_args(["train", "--demo", "--set", "data.target_mpp=2"])
    assert config_from_args(args).data.target_mpp == 2.0
    for command in (["train", str(base.config)], ["predict", "--slides", "a.csv", "--checkpoint", "c.pt"]):
        with pytest.raises(SystemExit):  # --mpp meant one or the other: refused, naming both
            build_parser().parse_args([*command, "--mpp", "0.25"])
        assert "--slide-mpp" in capsys.readouterr().err


@pytest.fixture(scope="module")
def flat_slide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[tuple[int, int]]]:
    """A 12,288 x 9,216 px single-level tiled TIFF (340 MB of RGB), tissue in 6 known 1024-px tiles."""
    glass = np.full((1024, 1024, 3), 240, np.uint8)
    tissue = textured_tissue((1024, 1024))
    tissue_tiles = {(ty, tx) for ty in (2, 3) for tx in (4, 5, 6)}

    def tile(ty: int, tx: int) -> np.ndarray:
        return tissue if (ty, tx) in tissue_tiles else glass

    path = tmp_path_factory.mktemp("flat") / "flat.tif"
    write_pyramid(
        path, [LazyLevel(9216, 12288, tile)], mpp=0.5, tile=1024, flavour="tiff", compression="zstd"
    )
    return path, tissue_tiles


def test_huge_slide_without_pyramid_works_through_a_streamed_thumbnail(
    flat_slide: tuple[Path, set[tuple[int, int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, tissue_tiles = flat_slide
    with open_slide(path) as slide:
        assert slide.level_count == 1
        w, h = slide.dimensions
        assert w * h > WHOLE_READ_PIXELS
        th, tw = slide.tile_shape(0)
        reads: list[int] = []
        file_tiles: list[tuple[int, int]] = []
        original = slide._read_level

        def recorded(level: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
            reads.append((y1 - y0) * (x1 - x0))
            return original(level, y0, y1, x0, x1)

        monkeypatch.setattr(slide, "_read_level", recorded)

        def recorded_tile(
            read: Callable[[int, int, int], np.ndarray],
        ) -> Callable[[int, int, int], np.ndarray]:
            def one_tile(level: int, row: int, col: int) -> np.ndarray:
                file_tiles.append((row, col))
                return read(level, row, col)

            return one_tile

        # one file tile decoded, as RGB or as luma
        monkeypatch.setattr(slide, "read_file_tile", recorded_tile(slide.read_file_tile))
        monkeypatch.setattr(slide, "read_file_tile_luma", recorded_tile(slide.read_file_tile_luma))
        with pytest.warns(
            UserWarning,
            match=r"flat\.tif: no pyramid level smaller than 12288 x 9216 px; building "
            r"a thumbnail by reading level 0 in strips \(slow\)\. Save the slide as a pyramidal TIFF",
        ):
            mask = tissue_mask(slide)
        grid = TileGrid.from_slide(slide, 512)

    assert mask.downsample == pytest.approx(6.0)
    covered = mask.mask.sum() * mask.downsample**2
    assert covered == pytest.approx(6 * 1024 * 1024, rel=0.01)
    # tissue tiles of 512 px: 4 per planted 1024-px tile, found from the thumbnail
    expected = sorted(
        (tx * 1024 + dx, ty * 1024 + dy) for ty, tx in tissue_tiles for dy in (0, 512) for dx in (0, 512)
    )
    assert sorted(map(tuple, grid.coords.tolist())) == expected
    # level 0 was read once, in strips far smaller than the level, never whole; then, for the kept tiles'
    # focus, only file tiles under them or touching them (a pixel around), each once
    assert sum(reads) == w * h
    assert max(reads) <= w * 1024
    assert len(file_tiles) == len(set(file_tiles))
    under = {(int(y) // th, int(x) // tw) for x, y in grid.coords}
    assert under <= set(file_tiles)
    assert all(any(abs(r - a) <= 1 and abs(c - b) <= 1 for a, b in under) for r, c in file_tiles)
    assert len(file_tiles) < (w // tw) * (h // th) / 2


def test_a_bad_method_parameter_fails_before_a_large_table_is_read(
    base: Base, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1,000 slides, none opened: the parameter is checked when the config is read
    rows = [(f"missing/slide_{i:04d}.svs", "tumor" if i % 2 else "normal", "") for i in range(1000)]
    table = write_csv(tmp_path, rows)
    start = time.perf_counter()
    code = main(["train", str(base.config), "--set", f"data.csv={table}", "--set", "method.params.hidden=0"])
    elapsed = time.perf_counter() - start
    assert code != 0
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "method.params.hidden: must be >= 1" in line
    assert elapsed < 1.0, f"the error took {elapsed:.2f} s"


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("model.backbone=resnet5O", "model.backbone: Unknown model (resnet5O)"),
        ("model.backbone=no_such_package.encoders:make", "model.backbone: no_such_package.encoders:make"),
    ],
)
def test_a_model_the_config_cannot_build_fails_before_any_slide_is_tiled(
    base: Base,
    setting: str,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def tiled(*args: object, **kwargs: object) -> TileGrid:
        raise AssertionError("a slide was tiled before the model was built")

    monkeypatch.setattr(TileGrid, "from_slide", tiled)
    settings = [setting, "data.tile_cache=none", "data.workers=0"]  # tiled here, where the patch is
    flags = [arg for value in settings for arg in ("--set", value)]
    code = main(["train", str(base.config), *flags, "--out", str(tmp_path / "run")])
    assert code != 0
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert said in line, line


def test_replaying_a_trained_runs_config_never_trains_over_it(
    base: Base, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its config.yaml names the run's own folder: without --resume, replaying it replaced the trained
    checkpoint with a new one."""
    run = tmp_path / "copy"
    shutil.copytree(base.run, run)
    config = TrainConfig.from_yaml(run / "config.yaml")
    config.run.out_dir = str(run)
    config.to_yaml(run / "config.yaml")
    before = (run / "checkpoints" / "last.pt").read_bytes()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # from another working folder
    assert main(["train", str(run / "config.yaml"), "--max-steps", "1", "--quiet"]) == 0
    said = capsys.readouterr().err
    assert f"{run} holds a trained run (--resume continues it): this one trains into {run}-2" in said
    assert (run / "checkpoints" / "last.pt").read_bytes() == before
    assert load_checkpoint(tmp_path / "copy-2" / "checkpoints" / "last.pt")["position"]["step"] == 1
    # with --resume, from the same other folder, it goes on in the run's own folder
    assert Path(TrainConfig.from_yaml(base.run / "config.yaml").run.out_dir).is_absolute()
    steps = load_checkpoint(run / "checkpoints" / "last.pt")["position"]["step"]
    resume = ["--resume", "--epochs", "3", "--max-steps", str(steps + 1), "--quiet"]
    assert main(["train", str(run / "config.yaml"), *resume]) == 0
    assert load_checkpoint(run / "checkpoints" / "last.pt")["position"]["step"] == steps + 1
    assert not (elsewhere / "run").exists()
