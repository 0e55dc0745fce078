"""`bigslide predict` over a cohort: the same predictions with decode processes as without (and as
`predict_slides`), resumable per slide, a broken slide reported in the CSV while the others are predicted,
and no half-written output under a final name."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bigslide.cli import report
from bigslide.cli.main import main
from bigslide.cli.report import write_predictions
from bigslide.data.table import SlideTable
from bigslide.engine import setup
from bigslide.engine.checkpoint import save_checkpoint
from bigslide.engine.config import TrainConfig
from bigslide.engine.inference import predict_slides
from bigslide.explain.heatmap import ScoreGrid
from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.wsi.slide import open_slide
from tests.conftest import broken_tile_slide


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three 512 x 512 synthetic slides and their table (slide,label,split)."""
    return make_slide_set(tmp_path_factory.mktemp("cohort"), n_slides=3, size=(512, 512), seed=3)


def make_checkpoint(folder: Path, method: str, params: dict | None = None) -> Path:
    """Untrained weights of `method` on a tiny encoder: what predict reads, without the training."""
    config = TrainConfig()
    config.method.name = method
    config.method.params = dict(params or {})
    config.model.backbone = "test_resnet"
    config.data.tile_size = 32
    config.data.image_size = 64
    config.run.device = "cpu"
    torch.manual_seed(0)
    built = setup.build_method(config, ["normal", "tumor"], torch.device("cpu"))
    state = {
        "config": config.to_dict(),
        "classes": ["normal", "tumor"],
        "method": method,
        "model": built.model.state_dict(),
        "history": [],
    }
    return save_checkpoint(state, folder / f"{method}.pt")


def predict(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["predict", "--device", "cpu", "--quiet", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def heatmap_arrays(folder: Path) -> dict[str, np.ndarray]:
    return {p.name: ScoreGrid.load_npz(p).scores for p in sorted((folder / "heatmaps").glob("*.npz"))}


@pytest.mark.parametrize(("method", "params"), [("abmil_acc", {}), ("full_image", {})])
def test_decode_processes_predict_what_one_process_and_predict_slides_do(
    method: str, params: dict, cohort: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = make_checkpoint(tmp_path, method, params)
    outs = {w: tmp_path / f"w{w}" for w in (0, 2)}
    for w, out in outs.items():
        argv = ["--slides", str(cohort), "--checkpoint", str(ckpt), "--out", str(out), "--workers", str(w)]
        code, stdout, _ = predict(argv, capsys)
        assert code == 0
        assert "3 slides predicted, 0 skipped (outputs present), 0 failed" in stdout
    assert (outs[0] / "predictions.csv").read_text() == (outs[2] / "predictions.csv").read_text()

    # the path every slide went through before: one slide after another, tiles on threads
    table = SlideTable.from_csv(cohort, classes=["normal", "tumor"], labels_required=False)
    preds, _ = predict_slides(ckpt, table, device="cpu", repeats=0)
    reference = write_predictions(preds, tmp_path / "reference", heatmaps=True, table=table)
    assert (outs[2] / "predictions.csv").read_text() == reference.read_text()
    rows = read_csv(outs[2] / "predictions.csv")
    assert [r["error"] for r in rows] == ["", "", ""]
    assert all(abs(float(r["p_normal"]) + float(r["p_tumor"]) - 1) < 1e-5 for r in rows)

    expected = heatmap_arrays(tmp_path / "reference")
    assert bool(expected) == (method == "abmil_acc")  # attention maps; a plain image model has none
    for out in outs.values():
        got = heatmap_arrays(out)
        assert got.keys() == expected.keys()
        for name, scores in expected.items():
            np.testing.assert_array_equal(got[name], scores, err_msg=name)


def test_a_rerun_keeps_what_is_done_and_overwrite_predicts_again(
    cohort: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    out = tmp_path / "out"
    args = ["--slides", str(cohort), "--checkpoint", str(ckpt), "--out", str(out), "--workers", "0"]
    assert predict(args, capsys)[0] == 0
    first = (out / "predictions.csv").read_text()
    rebuilt = ("predictions.csv", "tissue_check.csv", "cohort_metrics.json")  # rebuilt each run
    check = (out / "tissue_check.csv").read_text()
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name not in rebuilt)
    stamps = {p: p.stat().st_mtime_ns for p in files}
    assert len(list((out / "slides").glob("*.json"))) == 3

    code, stdout, _ = predict(args, capsys)
    assert code == 0
    assert "0 slides predicted, 3 skipped (outputs present), 0 failed" in stdout
    assert {p: p.stat().st_mtime_ns for p in files} == stamps  # nothing written again
    assert (out / "predictions.csv").read_text() == first  # rebuilt from the rows on disk
    assert (out / "tissue_check.csv").read_text() == check

    # a slide whose row is gone (stopped before it) is predicted; one whose heatmap is gone too
    rows = sorted((out / "slides").glob("*.json"))
    rows[1].unlink()
    next((out / "heatmaps").glob("slide_002.*.png")).unlink()
    code, stdout, _ = predict(args, capsys)
    assert "2 slides predicted, 1 skipped (outputs present), 0 failed" in stdout
    assert (out / "predictions.csv").read_text() == first

    # a slide file replaced under its name (a rescan, a corrected file) is predicted again
    table = SlideTable.from_csv(cohort, labels_required=False)
    replaced = table.entries[0].path
    os.utime(replaced, ns=(replaced.stat().st_atime_ns, replaced.stat().st_mtime_ns + 1_000_000_000))
    code, stdout, _ = predict(args, capsys)
    assert "1 slide predicted, 2 skipped (outputs present), 0 failed" in stdout

    code, stdout, _ = predict([*args, "--overwrite"], capsys)
    assert "3 slides predicted, 0 skipped (outputs present), 0 failed" in stdout
    assert all(p.stat().st_mtime_ns > stamps[p] for p in files if p.suffix == ".json")

    # another checkpoint's rows do not stand for this one
    other = tmp_path / "other.pt"
    shutil.copy(ckpt, other)
    with other.open("ab") as f:
        f.write(b"\0")  # other bytes, same weights: rows are keyed by the file's content
    code, stdout, _ = predict([*args[:2], "--checkpoint", str(other), *args[4:]], capsys)
    assert "3 slides predicted, 0 skipped" in stdout


def test_broken_slides_get_their_error_in_the_csv_and_the_others_their_predictions(
    cohort: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    (tmp_path / "fake.svs").write_text("this is not a slide")
    broken = broken_tile_slide(tmp_path / "broken.svs")
    good = [cohort.parent / f"slide_00{i}.svs" for i in (0, 1)]
    table = tmp_path / "slides.csv"
    table.write_text(f"slide\n{good[0]}\nfake.svs\n{broken}\n{good[1]}\n")
    out = tmp_path / "out"
    args = ["--slides", str(table), "--checkpoint", str(ckpt), "--out", str(out), "--workers", "2"]
    code, stdout, err = predict(args, capsys)
    assert code == 1  # some slide failed; the others are predicted
    assert "2 slides predicted, 0 skipped (outputs present), 2 failed" in stdout

    rows = read_csv(out / "predictions.csv")
    names = ["slide_000.svs", "fake.svs", "broken.svs", "slide_001.svs"]
    assert [Path(r["slide"]).name for r in rows] == names
    assert rows[0]["error"] == rows[3]["error"] == ""
    assert rows[0]["predicted"] in ("normal", "tumor")
    assert rows[3]["predicted"] in ("normal", "tumor")
    assert "fake.svs" in rows[1]["error"]
    assert rows[1]["predicted"] == rows[1]["p_tumor"] == ""
    assert "broken.svs: cannot decode file tile (row 1, col 1) of level 0" in rows[2]["error"]
    assert rows[2]["predicted"] == ""
    assert [line.split(": failed: ")[0] for line in err.splitlines()] == [
        str(tmp_path / "fake.svs"),
        str(broken),
    ]
    assert not list((out / "heatmaps").glob("broken.*"))
    assert not list((out / "heatmaps").glob("fake.*"))

    # a rerun tries the failed slides again and keeps the good ones
    code, stdout, _ = predict(args, capsys)
    assert code == 1
    assert "0 slides predicted, 2 skipped (outputs present), 2 failed" in stdout


def test_a_slide_interrupted_while_written_leaves_no_file_under_a_final_name(
    cohort: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    out = tmp_path / "out"
    # in this process: with workers, a slide's heatmaps are written by a worker, which finishes the slide it
    # writes (it ignores Ctrl-C) and writes each file as here, under a temporary name
    args = ["--slides", str(cohort), "--checkpoint", str(ckpt), "--out", str(out), "--workers", "0"]
    written = report.grid_geojson
    calls = []

    def dies_on_the_second_slide(grid: ScoreGrid, path: Path) -> Path:
        calls.append(path)
        if len(calls) == 2:
            Path(path).write_text('{"type": "FeatureCollection", "feat')  # half a file, then Ctrl-C
            raise KeyboardInterrupt
        return written(grid, path)

    monkeypatch.setattr(report, "grid_geojson", dies_on_the_second_slide)
    code, stdout, err = predict(args, capsys)
    monkeypatch.undo()
    assert code == 130
    # the slide being written is lost; the one predicted meanwhile is written whole before the exit
    assert "2 slides predicted" in stdout
    assert "run again to go on" in err
    assert not (out / "predictions.csv").exists()
    assert sorted(p.name.split(".")[0] for p in (out / "slides").iterdir()) == ["slide_000", "slide_002"]
    assert not (out / "heatmaps" / "slide_001.attention.geojson").exists()
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]  # no temporary file left behind
    json.loads((out / "heatmaps" / "slide_000.attention.geojson").read_text())

    code, stdout, _ = predict(args, capsys)
    assert code == 0
    assert "1 slide predicted, 2 skipped (outputs present), 0 failed" in stdout
    assert len(read_csv(out / "predictions.csv")) == 3


def test_slides_of_one_name_in_different_case_folders_each_get_their_own_heatmaps_and_thumbnail(
    cohort: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    for case, source in (("case1", "slide_000.svs"), ("case2", "slide_001.svs")):
        (tmp_path / case).mkdir()
        shutil.copy(cohort.parent / source, tmp_path / case / "HE.svs")
    table = tmp_path / "slides.csv"
    table.write_text("slide\ncase1/HE.svs\ncase2/HE.svs\n")
    out = tmp_path / "out"
    args = ["--slides", str(table), "--checkpoint", str(ckpt), "--out", str(out), "--workers", "2"]
    assert predict(args, capsys)[0] == 0

    got = heatmap_arrays(out)
    assert sorted(got) == ["case1-HE.attention.npz", "case2-HE.attention.npz"]
    assert sorted(p.name for p in (out / "tissue_check").glob("*.png")) == ["case1-HE.png", "case2-HE.png"]
    # each file is its own slide's: the same as predicting that slide alone
    for case, source in (("case1", "slide_000"), ("case2", "slide_001")):
        alone = tmp_path / f"alone-{case}"
        one = tmp_path / f"{case}.csv"
        one.write_text(f"slide\n{cohort.parent / source}.svs\n")
        assert predict(["--slides", str(one), "--checkpoint", str(ckpt), "--out", str(alone)], capsys)[0] == 0
        expected = heatmap_arrays(alone)[f"{source}.attention.npz"]
        np.testing.assert_array_equal(got[f"{case}-HE.attention.npz"], expected)
        thumbnail = (alone / "tissue_check" / f"{source}.png").read_bytes()
        assert (out / "tissue_check" / f"{case}-HE.png").read_bytes() == thumbnail


def test_a_slide_scanned_coarser_than_the_model_reads_is_predicted_with_a_warning(
    cohort: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = make_checkpoint(tmp_path, "abmil_acc")  # reads at 0.5 µm/px
    with open_slide(cohort.parent / "slide_000.svs") as fine:
        pixels = fine.read_level(0)
    coarse = tmp_path / "ten_x.svs"
    half = np.asarray(Image.fromarray(pixels).reduce(2))
    write_pyramid(coarse, downsample_pyramid(half, 2), mpp=2 * fine.mpp[0], flavour="svs")
    table = tmp_path / "slides.csv"
    table.write_text(f"slide\n{cohort.parent / 'slide_000.svs'}\n{coarse}\n")
    args = ["--slides", str(table), "--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]
    code, _, err = predict(args, capsys)
    assert code == 0
    warned = [line for line in err.splitlines() if "coarser than" in line]
    assert warned == [
        f"warning: {coarse}: scanned at 1 µm/px, coarser than the 0.5 µm/px the model reads: its tiles are "
        "enlarged 2.0 times and show less detail than the model learnt from (a lower-magnification scan; "
        "predictions on it are less reliable)"
    ]


def test_one_slide_or_a_folder_of_slides_is_predicted_as_a_table_of_them_would_be(
    cohort: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    folder = tmp_path / "scans"
    (folder / "case2").mkdir(parents=True)
    shutil.copy(cohort.parent / "slide_000.svs", folder / "a.svs")
    shutil.copy(cohort.parent / "slide_001.svs", folder / "case2" / "b.SVS")
    Image.new("RGB", (64, 64)).save(folder / "overview.png")  # an image beside the slides: not one of them
    (tmp_path / "slides.csv").write_text("slide\nscans/a.svs\nscans/case2/b.SVS\n")

    def predictions(slides: Path, out: str) -> list[list[str]]:
        args = ["--slides", str(slides), "--checkpoint", str(ckpt), "--out", str(tmp_path / out)]
        code, _out, err = predict(args, capsys)
        assert code == 0, err
        with (tmp_path / out / "predictions.csv").open(newline="") as f:
            return [row[1:] for row in csv.reader(f)]  # all but the slide's path, as the table names it

    from_table = predictions(tmp_path / "slides.csv", "table")
    assert len(from_table) == 3  # the header and two slides
    assert predictions(folder, "folder") == from_table
    assert predictions(folder / "a.svs", "one") == from_table[:2]

    (tmp_path / "empty").mkdir()
    for slides, said in (
        (tmp_path / "empty", "a folder with no slide in it"),
        (folder / "c.svs", "no such slide"),
    ):
        code, _out, err = predict(
            ["--slides", str(slides), "--checkpoint", str(ckpt), "--out", str(tmp_path / "x")], capsys
        )
        assert code != 0
        assert f"{slides}: {said}" in err, err
        assert "Traceback" not in err


def test_whole_slide_bags_are_predicted_without_timing_convolutions() -> None:
    """Training times cuDNN's algorithms for its fixed shapes; a whole slide's bag ends in a chunk of its
    own size, which timing would cost seconds per slide: prediction turns the timing off, then back."""
    from types import SimpleNamespace

    from bigslide.data.sample import Sample
    from bigslide.engine.inference import predict_sample

    seen: list[bool] = []
    method = SimpleNamespace(
        model=torch.nn.Identity(),
        takes_uint8=True,
        predict=lambda s: seen.append(torch.backends.cudnn.benchmark),
    )
    bag = Sample(x=torch.zeros(3, 3, 8, 8, dtype=torch.uint8), y=0, slide="s", coords=np.zeros((3, 2)))
    image = Sample(x=torch.zeros(3, 8, 8, dtype=torch.uint8), y=0, slide="s")
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        predict_sample(method, bag)  # type: ignore[arg-type]
        assert torch.backends.cudnn.benchmark
        predict_sample(method, image)  # type: ignore[arg-type]
    finally:
        torch.backends.cudnn.benchmark = before
    assert seen == [False, True]  # images of one size keep the timing


@pytest.mark.parametrize(("omp", "expected"), [(None, 3), ("4", 4)])
def test_on_the_cpu_the_model_leaves_the_decode_workers_their_cores_and_gives_them_back(
    omp: str | None,
    expected: int,
    cohort: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # on 4 cores with 1 decode worker the model predicts on 3 threads, unless the user chose a number
    import bigslide.engine.cohort as cohort_module
    import bigslide.engine.cpu_threads as cpu_threads

    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 4)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    seen: list[int] = []
    real = cohort_module.predict_samples

    def recording(*args: object, **kwargs: object) -> object:
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cohort_module, "predict_samples", recording)
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        argv = [
            "--slides",
            str(cohort),
            "--checkpoint",
            str(ckpt),
            "--out",
            str(tmp_path / "o"),
            "--workers",
            "1",
        ]
        code, _, _ = predict(argv, capsys)
        assert code == 0
        assert seen == [expected] * 3
        assert torch.get_num_threads() == 4  # the caller's threads, once the cohort is done
    finally:
        torch.set_num_threads(before)
