"""The command line: bad input exits non-zero with one line naming the culprit; a run trains and predicts."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from bigslide.cli.main import main
from bigslide.engine.config import TrainConfig
from bigslide.synthetic.slide_set import make_slide_set


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("cli-slides"), n_slides=4, size=(512, 512), seed=2)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    err = capsys.readouterr().err
    return code, err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_train_without_config_or_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["train"], capsys)
    assert code == 2
    assert (
        "data.csv: no slide table given (`bigslide train slides.csv`, or set data.source: demo"
        in one_line(err)
    )


def test_a_slide_table_given_for_the_config_is_trained_on_with_the_defaults(
    slide_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    settings = ["data.tile_size=32", "data.bag_size=4", "model.backbone=test_resnet", "run.device=cpu"]
    args = ["train", str(slide_csv), "--max-steps", "1", "--out", str(out), "--quiet"]
    code, err = run_cli([*args, *(a for v in settings for a in ("--set", v))], capsys)
    assert code == 0, err
    config = TrainConfig.from_yaml(out / "config.yaml")
    assert (config.data.source, Path(config.data.csv)) == ("csv", slide_csv.resolve())
    assert config.method.name == TrainConfig().method.name
    assert (out / "checkpoints" / "last.pt").is_file()


def test_a_spreadsheet_given_for_the_config_is_said_to_be_saved_as_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    book = tmp_path / "slides.xlsx"
    book.write_bytes(b"PK\x03\x04" + bytes(32))
    code, err = run_cli(["train", str(book)], capsys)
    assert code == 2
    assert f"{book}: a spreadsheet workbook; save its sheet as CSV" in err
    assert "YAML)" in err
    assert "not valid YAML" not in err


def test_a_table_given_to_a_demo_config_is_not_silently_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A demo run's config.yaml taken as a template, its table changed but its source left demo."""
    table = tmp_path / "mine.csv"
    table.write_text("slide,label\na.svs,tumor\n")
    args = ["train", "--demo", "--set", f"data.csv={table}", "--out", str(tmp_path / "r")]
    code, err = run_cli(args, capsys)
    assert code == 2
    assert f"data.csv: {table} is not read while data.source is demo" in one_line(err)
    assert "set data.source: csv" in one_line(err)
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_predict_into_a_file_is_refused_before_any_slide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "taken").write_text("")
    args = ["predict", "--slides", str(tmp_path / "s.csv"), "--checkpoint", str(tmp_path / "c.pt")]
    code, err = run_cli([*args, "--out", str(tmp_path / "taken")], capsys)
    assert code == 2
    assert "--out " + str(tmp_path / "taken") + ": a file, not a folder" in one_line(err)


def test_missing_config_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["train", str(tmp_path / "missing.yaml")], capsys)
    assert code == 2
    assert "missing.yaml: no such config file" in one_line(err)


def test_bad_override_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["train", "--demo", "--set", "optim.lr=fast", "--out", str(tmp_path)], capsys)
    assert code == 2
    assert "optim.lr: expected float, got 'fast'" in one_line(err)


def test_unknown_method_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["train", "--demo", "--method", "magic", "--out", str(tmp_path)], capsys)
    assert code == 2
    assert "unknown method 'magic'" in one_line(err)


def test_predict_names_the_bad_slide_in_the_csv(
    slide_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "fake.svs"
    fake.write_text("this is not a slide")
    csv = tmp_path / "slides.csv"
    csv.write_text(f"slide,label\n{slide_csv.parent / 'slide_000.svs'},tumor\nfake.svs,normal\n")
    ckpt = tmp_path / "none.pt"
    code, err = run_cli(["predict", "--slides", str(csv), "--checkpoint", str(ckpt)], capsys)
    assert code == 2
    assert "none.pt: no such checkpoint" in one_line(err)


def test_train_then_predict_and_heatmap_from_a_fresh_process(slide_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(
        f"data: {{csv: {slide_csv}, tile_size: 32, bag_size: 4}}\n"
        "method: {name: frozen_abmil}\nrun: {device: cpu}\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "bigslide",
        "train",
        str(config),
        "--max-steps",
        "2",
        "--out",
        str(out),
        "--quiet",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ckpt = out / "checkpoints" / "last.pt"
    assert ckpt.is_file()
    assert (out / "config.yaml").is_file()

    bad_csv = tmp_path / "bad.csv"
    (tmp_path / "fake.svs").write_text("this is not a slide")
    bad_csv.write_text(f"slide,label\n{slide_csv.parent / 'slide_000.svs'},tumor\nfake.svs,normal\n")
    pred = [sys.executable, "-m", "bigslide", "predict", "--slides", str(bad_csv), "--checkpoint", str(ckpt)]
    done = subprocess.run(
        [*pred, "--out", str(tmp_path / "p"), "--quiet"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1  # the slide that is not one failed; the other was predicted
    assert "fake.svs" in one_line(done.stderr)
    assert "1 slide predicted, 0 skipped (outputs present), 1 failed" in done.stdout
    assert "fake.svs" in (tmp_path / "p" / "predictions.csv").read_text().splitlines()[2]

    heat = [sys.executable, "-m", "bigslide", "heatmap", "--checkpoint", str(ckpt)]
    for i in (0, 1):  # each slide given: each one's maps (only the last one's were drawn)
        heat += ["--slide", str(slide_csv.parent / f"slide_00{i}.svs")]
    done = subprocess.run([*heat, "--out", str(tmp_path / "h")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    made = sorted(p.name.split(".")[0] for p in (tmp_path / "h").iterdir())
    assert made == ["slide_000"] * 3 + ["slide_001"] * 3  # npz grid, PNG overlay, GeoJSON of each
    assert (
        sorted(p.suffix for p in (tmp_path / "h").iterdir()) == [".geojson"] * 2 + [".npz"] * 2 + [".png"] * 2
    )


HELP_IMPORTS = """
import sys
from bigslide.cli.main import main
for argv in (["--help"], ["--version"], ["bench", "--help"], ["train", "--help"], ["plan", "--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
heavy = sorted(m for m in ("torch", "timm", "tiffslide", "skimage", "bigslide.bench.acc") if m in sys.modules)
print("heavy:", ",".join(heavy))
"""


def test_help_answers_without_loading_torch_or_the_benches() -> None:
    done = subprocess.run([sys.executable, "-c", HELP_IMPORTS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("heavy:"), done.stdout[-500:]
    assert "benchmarks (side-by-side timings and memory)" in done.stdout
    assert f"\nbigslide {metadata.version('bigslide')}\n" in done.stdout  # --version


PREDICT_IMPORTS = """
import sys
import bigslide.cli.predict, bigslide.cli.main, bigslide.napari
print("sklearn" if any(m.split(".")[0] == "sklearn" for m in sys.modules) else "no sklearn")
"""


def test_prediction_starts_without_loading_sklearn() -> None:
    # sklearn takes about a second to import on one core; every rank of a prediction under torchrun, and
    # every decode worker started afresh, would pay it for metrics it computes at the end, if at all
    command = [sys.executable, "-c", PREDICT_IMPORTS]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no sklearn"


def test_a_bench_takes_its_own_arguments_and_help() -> None:
    cmd = [sys.executable, "-m", "bigslide", "bench", "grid"]
    done = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: bigslide bench grid")
    bad = subprocess.run([*cmd, "--no-such-option"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "unrecognized arguments: --no-such-option" in bad.stderr


def test_a_run_folder_stands_for_its_last_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bigslide.cli.main import run_checkpoint

    last = tmp_path / "run" / "checkpoints" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    assert run_checkpoint(str(tmp_path / "run")) == last
    assert run_checkpoint(str(last)) == last
    args = ["--slides", str(tmp_path / "s.csv"), "--out", str(tmp_path / "out")]
    code, err = run_cli(["predict", *args, "--checkpoint", str(tmp_path)], capsys)  # a folder of runs
    assert code != 0
    assert f"{tmp_path}: a folder, not a checkpoint" in one_line(err)
