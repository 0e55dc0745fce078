"""The method protocol is the only place that knows a method: a method defined outside the package trains
from the command line, gets its memory advice, heatmap titles and typed parameters from its own class, and
the planner says plainly that it has no calibration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from bigslide.cli.main import main
from bigslide.engine import predict_slide
from bigslide.engine.advice import out_of_memory
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.config import TrainConfig
from bigslide.errors import ConfigError
from bigslide.methods.base import make_params
from bigslide.synthetic.slide_set import make_slide_set
from tests.toy_method import ToyTileMean, toy_method

__all__ = ["toy_method"]  # the fixture


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("toy-slides"), n_slides=4, size=(384, 384), seed=2)


def test_a_new_method_trains_from_the_cli_and_predicts_with_its_own_titles(
    toy_method: type, slide_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["methods"]) == 0
    assert "toy_tile_mean" in capsys.readouterr().out
    out = tmp_path / "run"
    args = [
        "train",
        "--method",
        "toy_tile_mean",
        "--set",
        f"data.csv={slide_csv}",
        "--set",
        "data.tile_size=32",
    ]
    args += [
        "--set",
        "method.params.width=4",
        "--epochs",
        "2",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args) == 0
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state["method"] == "toy_tile_mean"
    assert state["config"]["method"]["params"] == {"width": 4}
    assert state["model"]["0.weight"].shape == (4, 3)
    pred = predict_slide(out / "checkpoints" / "last.pt", slide_csv.parent / "slide_000.svs", device="cpu")
    assert set(pred.grids) == {"attention"}
    assert pred.titles == {"attention": "tile score"}
    assert pred.probs.sum() == pytest.approx(1.0, abs=1e-5)


def test_out_of_memory_advice_comes_from_the_method(toy_method: type, tmp_path: Path) -> None:
    config = TrainConfig()
    config.method.name = "toy_tile_mean"
    config.data.bag_size = 64
    method = ToyTileMean(make_params("toy_tile_mean", {"width": 16}), _spec(), torch.device("cpu"))
    advice = out_of_memory(config, method, 3, tmp_path / "none.pt")
    assert "method.params.width=8 (now 16)" in advice
    assert "data.bag_size=32 (now 64)" in advice


@pytest.mark.parametrize(
    ("method", "assignment", "message"),
    [
        ("toy_tile_mean", "method.params.width=abc", r"method\.params\.width: expected int, got 'abc'"),
        ("abmil_acc", "method.params.chunk_size=abc", r"method\.params\.chunk_size: expected int, got 'abc'"),
        ("patchgd", "method.params.encoder_bn=maybe", r"method\.params\.encoder_bn: 'maybe' is not one of"),
        ("abmil_acc", "method.params.chunk_size=2.5", r"method\.params\.chunk_size: expected int, got 2\.5"),
    ],
)
def test_bad_method_params_are_one_line_errors_naming_the_key(
    toy_method: type,
    method: str,
    assignment: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["train", "--demo", "--method", method, "--set", assignment, "--out", str(tmp_path), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.search(message, err), err
    key, value = assignment.removeprefix("method.params.").split("=")
    with pytest.raises(ConfigError, match=message):  # the same check for scripts and the GUI
        make_params(method, {key: yaml.safe_load(value)})


def test_the_planner_says_a_method_has_no_calibration(
    toy_method: type, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--gpu-mem", "1GB", "--bag", "16", "--tile", "32", "--method", "toy_tile_mean"])
    out = capsys.readouterr().out
    assert code == 1  # nothing can be recommended
    assert "toy_tile_mean" in out
    assert "no calibration" in out
    assert "recommendation: nothing fits" in out


def _spec():  # type: ignore[no-untyped-def]
    from bigslide.methods.base import ModelSpec

    return ModelSpec(backbone="none")
