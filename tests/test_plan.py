"""Memory planner: predictions from small calibrations against the measured peaks of the real steps,
recommendations within the limit, and size parsing."""

from __future__ import annotations

import argparse

import pytest

from bigslide.bench.plan_check import (
    abmil_acc_check,
    biglayer_image_check,
    full_bag_check,
    full_image_check,
    patchgd_check,
)
from bigslide.errors import ConfigError
from bigslide.memory.meter import parse_size
from bigslide.memory.model import LinearFit
from bigslide.memory.targets import Candidate, Settings, Target
from bigslide.plan.recommend import override_string, recommend

TOLERANCE = 0.15  # relative error of a predicted peak against the measured one
BACKBONE = "resnet18"


def _error(predicted: int, measured: int) -> float:
    print(f"predicted {predicted / 2**20:.1f} MiB, measured {measured / 2**20:.1f} MiB")
    return abs(predicted - measured) / measured


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GB", 16 * 10**9),
        ("512MB", 512 * 10**6),
        ("0.5GiB", 2**29),
        ("80 gib", 80 * 2**30),
        ("24", 24 * 10**9),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "16XB", "-1GB", "0MB", "1..5GB"])
def test_parse_size_rejects_bad_values(text: str) -> None:
    with pytest.raises(ConfigError, match="--gpu-mem"):
        parse_size(text)


def test_linear_fit_recovers_fixed_and_slope() -> None:
    fit = LinearFit.fit([{"px": 100}, {"px": 200}, {"px": 400}], [1100, 1200, 1400])
    assert fit.fixed == pytest.approx(1000)
    assert fit.slopes["px"] == pytest.approx(1.0)
    assert fit(px=10_000) == pytest.approx(11_000)


@pytest.mark.slow
def test_full_image_prediction_matches_measured_peak() -> None:
    settings = Settings(backbone=BACKBONE, cap_px=128 * 128)
    predicted, measured = full_image_check(settings, 256)  # calibrated on 64..128 px images
    assert _error(predicted, measured) < TOLERANCE, (predicted, measured)


@pytest.mark.slow
def test_bag_predictions_match_measured_peaks() -> None:
    settings = Settings(backbone=BACKBONE, cap_px=6 * 32 * 32)
    predicted, measured = full_bag_check(settings, 32, 24)  # 3..6 tiles
    assert _error(predicted, measured) < TOLERANCE, ("full_bag", predicted, measured)
    predicted, measured = abmil_acc_check(settings, 32, 24, chunk=8)  # one-chunk bags of 3..6 tiles
    assert _error(predicted, measured) < TOLERANCE, ("abmil_acc", predicted, measured)


@pytest.mark.slow
def test_patchgd_prediction_matches_measured_peak() -> None:
    settings = Settings(backbone=BACKBONE, cap_px=2 * 64 * 64)
    predicted, measured = patchgd_check(settings, 256, 64, k=4, fill=4)  # k = 1..2 on 2x2 grids
    assert _error(predicted, measured) < TOLERANCE, (predicted, measured)


@pytest.mark.slow
def test_biglayer_prediction_matches_measured_peak() -> None:
    settings = Settings(backbone=BACKBONE, cap_px=128 * 128)
    predicted, measured, model = biglayer_image_check(settings, 256, stages=1, budget_mb=1024.0)
    assert _error(predicted, measured) < TOLERANCE, (predicted, measured)
    # The device keeps only the native tail's activations: less per pixel than the whole step.
    assert model.tail.compute.slopes["px"] < model.total.compute.slopes["px"]


def test_recommendation_respects_the_limit() -> None:
    target = Target(gpu_bytes=4 * 2**30, image=4096, margin=0.2)
    candidates = [
        Candidate("full_image", {}, 20 * 2**30, rank=0),
        Candidate("patchgd", {"patch_size": 256, "k": 64, "fill_batch_size": 64}, 3 * 2**30, rank=4),
        Candidate("patchgd", {"patch_size": 256, "k": 16, "fill_batch_size": 64}, 2 * 2**30, rank=16),
    ]
    for c in candidates:
        c.fits = c.peak <= target.usable_bytes
    best = recommend(candidates)
    assert best is not None
    assert best.peak <= target.usable_bytes < 3 * 2**30
    assert best.params["k"] == 16
    assert "--set method.params.k=16" in override_string(best, target)
    assert recommend([Candidate("full_image", {}, 20 * 2**30)]) is None


def test_cli_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    from bigslide.cli.main import main

    assert main(["plan", "--gpu-mem", "16 bananas", "--image", "512"]) == 2
    assert "--gpu-mem" in capsys.readouterr().err
    assert main(["plan", "--gpu-mem", "16GB"]) == 2  # neither --image nor --bag
    assert "--image" in capsys.readouterr().err
    assert main(["plan", "--gpu-mem", "16GB", "--method", "abmil_acc", "--image", "512"]) == 2
    assert "--bag" in capsys.readouterr().err


def test_parser_has_plan_command() -> None:
    from bigslide.cli.main import build_parser

    args = build_parser().parse_args(["plan", "--gpu-mem", "0.5GiB", "--bag", "64", "--method", "abmil_acc"])
    assert isinstance(args, argparse.Namespace)
    assert (args.bag, args.method, parse_size(args.gpu_mem)) == (64, "abmil_acc", 2**29)
