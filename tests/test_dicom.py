"""DICOM whole-slide images: a .dcm file or a folder of one series opens through OpenSlide, pixel for pixel,
in slide tables, decode worker processes and a training run; without OpenSlide the error says what to do."""

from __future__ import annotations

import csv
import shutil
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("openslide")
pytest.importorskip("pydicom")

import openslide

from bigslide.cli.main import main
from bigslide.data.bags import BagDataset
from bigslide.data.loader import BatchLoader
from bigslide.data.table import SlideTable
from bigslide.errors import DataError, SlideError
from bigslide.synthetic.dicom import make_dicom_slide, write_dicom_pyramid
from bigslide.synthetic.pyramid import downsample_pyramid
from bigslide.wsi.dicom_series import series_file
from bigslide.wsi.slide import open_slide
from tests.conftest import textured_image

MPP = 0.25
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1300 x 1000 px slide in three levels (one file each), 0.25 µm/px, beside files that are not it."""
    folder = tmp_path_factory.mktemp("dicom") / "case-1"
    write_dicom_pyramid(folder, downsample_pyramid(textured_image(1000, 1300, seed=4), 3), mpp=MPP, tile=256)
    (folder / "README.txt").write_text("scanned 2025\n")
    _write_other_dicom(folder / "report.dcm")
    return folder


def _write_other_dicom(path: Path) -> None:
    """A DICOM file that is no whole-slide image (a secondary capture, as a report or a photo is)."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.PatientID = "OT", "x"
    ds.save_as(path, enforce_file_format=True)


def _openslide_rgb(
    reference: openslide.OpenSlide, location: tuple[int, int], level: int, size: tuple[int, int]
) -> np.ndarray:
    """OpenSlide's pixels with what lies outside the scan (transparent) shown as white glass."""
    rgba = np.asarray(reference.read_region(location, level, size))
    assert set(np.unique(rgba[..., 3])) <= {0, 255}
    return np.where(rgba[..., 3:] == 0, 255, rgba[..., :3]).astype(np.uint8)


@pytest.mark.parametrize("given", ["folder", "level_0.dcm", "level_2.dcm"])
def test_a_dicom_file_or_folder_reads_as_openslide_does(series: Path, given: str) -> None:
    path = series if given == "folder" else series / given
    reference = openslide.OpenSlide(str(series / "level_0.dcm"))
    with open_slide(path) as slide:
        assert slide.path == path
        assert slide.level_dimensions == reference.level_dimensions == ((1300, 1000), (650, 500), (325, 250))
        assert slide.level_downsamples == pytest.approx(reference.level_downsamples, abs=0)
        assert slide.mpp == (MPP, MPP)
        for level, downsample in enumerate(reference.level_downsamples):
            step = int(downsample)
            # inside, across tile borders, over the right/bottom edges and before the top-left corner
            for x, y in [(0, 0), (252, 508), (1100, 900), (1296, 996), (-40, -24), (600, -8)]:
                location = (x // step * step, y // step * step)  # on the level's pixel grid
                got = slide.read_region(location, level, (180, 130))
                np.testing.assert_array_equal(got, _openslide_rgb(reference, location, level, (180, 130)))
        smallest = slide.level_count - 1
        np.testing.assert_array_equal(
            np.asarray(slide.pyramid()[smallest]),
            _openslide_rgb(reference, (0, 0), smallest, reference.level_dimensions[smallest]),
        )


def test_a_folder_opens_through_its_largest_whole_slide_file(series: Path) -> None:
    assert series_file(series, is_wsi=lambda f: openslide.OpenSlide.detect_format(str(f)) == "dicom") == (
        series / "level_0.dcm"
    )


def test_a_folder_of_several_series_is_refused_naming_a_file_of_each_which_opens_its_own(
    series: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "study"
    shutil.copytree(series, folder)
    second = tmp_path / "second"
    write_dicom_pyramid(second, downsample_pyramid(textured_image(600, 800, seed=5), 2), mpp=MPP, seed=9)
    for f in second.iterdir():
        shutil.copy(f, folder / f"ihc_{f.name}")
    with pytest.raises(
        SlideError,
        match=r"study: a folder holding 2 DICOM whole-slide series.*\(ihc_level_0\.dcm, level_0\.dcm\)",
    ):
        open_slide(folder)
    with open_slide(folder / "ihc_level_1.dcm") as slide:
        assert slide.dimensions == (800, 600)
    with open_slide(folder / "level_0.dcm") as slide:
        assert slide.dimensions == (1300, 1000)


def test_a_label_filed_in_a_series_of_its_own_is_no_second_slide(series: Path, tmp_path: Path) -> None:
    import pydicom
    from pydicom.uid import generate_uid

    folder = tmp_path / "case"
    shutil.copytree(series, folder)
    label = pydicom.dcmread(series / "level_2.dcm")
    label.SeriesInstanceUID, label.SOPInstanceUID = generate_uid(), generate_uid()
    label.file_meta.MediaStorageSOPInstanceUID = label.SOPInstanceUID
    label.ImageType = ["ORIGINAL", "PRIMARY", "LABEL", "NONE"]
    label.save_as(folder / "label.dcm")
    with open_slide(folder) as slide:
        assert slide.dimensions == (1300, 1000)


def test_dicom_files_are_known_by_their_marker_not_their_name(series: Path, tmp_path: Path) -> None:
    plain = tmp_path / "export"
    plain.mkdir()
    for level in range(3):  # as some archives export them: IM0, IM1, ...
        shutil.copy(series / f"level_{level}.dcm", plain / f"IM{level}")
    reference = openslide.OpenSlide(str(series / "level_0.dcm"))
    for path in (plain, plain / "IM2"):
        with open_slide(path) as slide:
            assert slide.level_dimensions == reference.level_dimensions
            expected = _openslide_rgb(reference, (1000, 800), 1, (150, 100))
            np.testing.assert_array_equal(slide.read_region((1000, 800), 1, (150, 100)), expected)


def test_what_is_no_dicom_slide_is_a_clear_error(tmp_path: Path, series: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    only_report = tmp_path / "reports"
    only_report.mkdir()
    _write_other_dicom(only_report / "report.dcm")
    fake = tmp_path / "fake.dcm"
    fake.write_text("not dicom")
    cases = {
        empty: "a folder without DICOM files",
        only_report: "none of its 1 DICOM file(s) is a whole-slide image",
        only_report / "report.dcm": "report.dcm: is not a DICOM whole-slide image OpenSlide can read",
        fake: "not a DICOM file",
    }
    for path, message in cases.items():
        with pytest.raises(SlideError) as err:
            open_slide(path)
        assert str(err.value).startswith(f"{path}: "), err.value
        assert message in str(err.value)
        assert "\n" not in str(err.value)


def test_without_openslide_the_error_names_the_slide_and_the_extra(
    series: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("openslide-python") for dep in extras["openslide"])
    monkeypatch.setitem(sys.modules, "openslide", None)  # `import openslide` now fails
    for path in (series, series / "level_1.dcm"):
        with pytest.raises(SlideError) as err:
            open_slide(path)
        assert str(err.value).startswith(f"{path}: a DICOM slide")
        assert 'pip install "bigslide[openslide]"' in str(err.value)


# -- slide tables, decode workers, training ----------------------------------------------------------------


@pytest.fixture(scope="module")
def dicom_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four synthetic H&E slides as DICOM series; the table names two by folder and two by one file."""
    out = tmp_path_factory.mktemp("dicom-set")
    rows = []
    for i, (lesions, split) in enumerate([(2, "train"), (0, "train"), (2, "val"), (0, "val")]):
        info = make_dicom_slide(out / f"case_{i}", size=(512, 512), lesions=lesions, seed=20 + i, mpp=0.5)
        slide = f"case_{i}" if i % 2 == 0 else f"case_{i}/level_{i // 2}.dcm"
        rows.append([slide, "tumor" if info.label else "normal", split])
    path = out / "slides.csv"
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([["slide", "label", "split"], *rows])
    return path


def test_a_damaged_level_file_leaves_the_other_levels_readable(series: Path, tmp_path: Path) -> None:
    """OpenSlide refuses every read of a handle after one error: a level-0 file cut short took the sound
    levels (and so the tile grid, made on a coarse one) with it."""
    cut = tmp_path / "cut"
    shutil.copytree(series, cut)
    level0 = max(cut.glob("*.dcm"), key=lambda f: f.stat().st_size)
    data = level0.read_bytes()
    level0.write_bytes(data[: len(data) * 2 // 3])
    with open_slide(series) as sound:
        expected = sound.read_level(1)
    with open_slide(cut) as slide:
        with pytest.raises(SlideError, match=r"cut: cannot read level 0"):
            slide.read_level(0)
        np.testing.assert_array_equal(slide.read_level(1), expected)


def test_a_slide_table_takes_dicom_folders_and_files(dicom_csv: Path, tmp_path: Path) -> None:
    table = SlideTable.from_csv(dicom_csv)
    assert [e.path.relative_to(dicom_csv.parent).as_posix() for e in table.entries] == [
        "case_0",
        "case_1/level_0.dcm",
        "case_2",
        "case_3/level_1.dcm",
    ]
    (tmp_path / "notes").mkdir()
    bad = tmp_path / "bad.csv"
    bad.write_text("slide,label\nnotes,tumor\n")
    with pytest.raises(DataError, match=r"bad\.csv, row 2: .*notes is a folder without DICOM files"):
        SlideTable.from_csv(bad)


def test_decode_worker_processes_read_dicom_slides_as_this_process_does(dicom_csv: Path) -> None:
    table = SlideTable.from_csv(dicom_csv)
    batches = [[0], [3], [1], [2]]
    got = {}
    for workers in (0, 2):
        bags = BagDataset(table, tile_size=32, bag_size=6, augment=False, seed=3)
        with BatchLoader(bags, workers=workers, prefetch=2) as loader:
            loader.plan(batches)
            got[workers] = [loader.take(b)[0] for b in batches]
        bags.slides.close()
    for a, b in zip(got[0], got[2], strict=True):
        assert a.slide == b.slide
        np.testing.assert_array_equal(a.coords, b.coords)
        assert torch.equal(a.x, b.x)
    assert all(len(bag.coords) == 6 for bag in got[0])  # tissue was found on every slide
    assert len({bag.x.float().mean().item() for bag in got[0]}) == 4


def test_train_and_predict_on_dicom_slides_from_the_command_line(
    dicom_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"data: {{csv: {dicom_csv}, tile_size: 32, bag_size: 4, workers: 2}}\n"
        "model: {backbone: resnet18}\nmethod: {name: frozen_abmil}\nrun: {device: cpu}\n"
    )
    out = tmp_path / "run"
    assert main(["train", str(config), "--max-steps", "2", "--out", str(out), "--quiet"]) == 0
    checkpoint = out / "checkpoints" / "last.pt"
    assert checkpoint.is_file()
    predict = ["predict", "--slides", str(dicom_csv), "--checkpoint", str(checkpoint)]
    code = main([*predict, "--out", str(tmp_path / "p")])
    assert code == 0, capsys.readouterr().err
    predicted = list(csv.DictReader((tmp_path / "p" / "predictions.csv").open()))
    names = [Path(row["slide"]).name for row in predicted]
    assert names == ["case_0", "level_0.dcm", "case_2", "level_1.dcm"]
    assert all(row["predicted"] in ("normal", "tumor") for row in predicted)
    # heatmaps are named by folder: the files of a series are named by level (or UID)
    written = {p.name.split(".")[0] for p in (tmp_path / "p" / "heatmaps").glob("*.npz")}
    assert written == {"case_0", "case_1-level_0", "case_2", "case_3-level_1"}
    # without a table: the folder of series (each series folder a slide), or one file of a series
    for slides, expected in (
        (dicom_csv.parent, ["case_0", "case_1", "case_2", "case_3"]),
        (dicom_csv.parent / "case_1" / "level_0.dcm", ["level_0.dcm"]),
    ):
        out_k = tmp_path / f"p-{len(expected)}"
        assert (
            main(["predict", "--slides", str(slides), "--checkpoint", str(checkpoint), "--out", str(out_k)])
            == 0
        )
        assert [Path(r["slide"]).name for r in csv.DictReader((out_k / "predictions.csv").open())] == expected
