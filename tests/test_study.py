"""A study from the command line: every method on survival and regression tables, and `bigslide predict`
writing risks, numbers and the Kaplan-Meier plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from sksurv.metrics import concordance_index_censored

from bigslide.cli.main import main
from bigslide.engine import run_to_end, train
from bigslide.synthetic.study import make_study_set
from tests.test_engine import TINY, small_config


@pytest.fixture(scope="module")
def survival_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_study_set(tmp_path_factory.mktemp("survival"), "survival", n=12, size=(512, 512), seed=2)


@pytest.fixture(scope="module")
def regression_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_study_set(tmp_path_factory.mktemp("regression"), "regression", n=8, size=(512, 512), seed=2)


@pytest.mark.parametrize("method", sorted(TINY))
def test_every_method_trains_on_survival_and_scores_the_test_split(
    method: str, survival_csv: Path, tmp_path: Path
) -> None:
    config = small_config(survival_csv, tmp_path / method, method, **TINY[method])
    config.data.task = "survival"
    config.data.time_bins = 3
    if method != "biglayer_mil":  # it reads one bag per step: Cox needs a batch
        config.data.survival_loss = "cox"
        config.data.batch_size = 3
    config.optim.epochs = 1
    result = run_to_end(train(config))
    assert result.test is not None
    assert set(result.test) == {"c_index", "td_auc"}
    assert 0.0 <= result.test["c_index"] <= 1.0
    assert np.isfinite(result.history[-1]["train"]["c_index"])


def test_cox_with_one_bag_per_step_is_refused_before_training(survival_csv: Path, tmp_path: Path) -> None:
    from bigslide.errors import ConfigError

    config = small_config(survival_csv, tmp_path, "biglayer_mil", **TINY["biglayer_mil"])
    config.data.task = "survival"
    config.data.survival_loss = "cox"
    config.data.batch_size = 2
    with pytest.raises(ConfigError, match=r"takes one bag per step; use data\.survival_loss: nll"):
        run_to_end(train(config))


def _cli_train(csv_path: Path, out: Path, task: str, *extra: str) -> Path:
    code = main(
        [
            "train",
            "--method",
            "abmil_acc",
            "--set",
            f"data.csv={csv_path}",
            "--set",
            f"data.task={task}",
            "--set",
            "data.tile_size=32",
            "--set",
            "data.bag_size=8",
            "--set",
            "model.backbone=test_resnet",
            "--epochs",
            "2",
            "--device",
            "cpu",
            "--quiet",
            "--out",
            str(out),
            *extra,
        ]
    )
    assert code == 0
    return out / "checkpoints" / "last.pt"


def test_survival_from_the_cli_predicts_risks_and_draws_kaplan_meier(
    survival_csv: Path, tmp_path: Path
) -> None:
    checkpoint = _cli_train(survival_csv, tmp_path / "run", "survival")
    records = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(records[-1]["test"]) == {"c_index", "td_auc"}
    assert (
        main(
            [
                "predict",
                "--slides",
                str(survival_csv),
                "--checkpoint",
                str(checkpoint),
                "--out",
                str(tmp_path / "p"),
            ]
        )
        == 0
    )
    with (tmp_path / "p" / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12
    assert list(rows[0])[:4] == ["slide", "time", "event", "risk"]
    curves = np.array([[float(v) for k, v in row.items() if k.startswith("survival_")] for row in rows])
    assert curves.shape == (12, 4)  # data.time_bins 4 intervals
    assert np.all(np.diff(curves, axis=1) <= 0)
    risks = np.array([float(row["risk"]) for row in rows])
    assert risks == pytest.approx(-curves.sum(axis=1), abs=1e-5)
    assert (tmp_path / "p" / "km.png").stat().st_size > 0
    # the table's times and events make the cohort a scored one: its C-index, from the CSV's own columns
    times = np.array([float(row["time"]) for row in rows])
    observed = np.array([row["event"] == "1" for row in rows])
    scored = json.loads((tmp_path / "p" / "cohort_metrics.json").read_text())
    c_index = concordance_index_censored(observed, times, risks)[0]
    assert scored["metrics"]["c_index"] == pytest.approx(c_index, abs=1e-5)
    maps = {p.name.split(".")[1] for p in (tmp_path / "p" / "heatmaps").glob("*.npz")}
    assert maps == {"attention", "risk"}


def test_regression_from_the_cli_predicts_numbers_in_the_tables_units(
    regression_csv: Path, tmp_path: Path
) -> None:
    checkpoint = _cli_train(regression_csv, tmp_path / "run", "regression")
    records = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(records[0]["val"]) == {"mae", "rmse", "pearson_r"}
    out = tmp_path / "p"
    assert (
        main(["predict", "--slides", str(regression_csv), "--checkpoint", str(checkpoint), "--out", str(out)])
        == 0
    )
    with (out / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["slide", "target", "predicted", "error"]
    assert not any(r["error"] for r in rows)
    targets = [float(r["target"]) for r in csv.DictReader(regression_csv.open())]
    assert [float(r["target"]) for r in rows] == targets  # the table's own values, beside the estimates
    predicted = [float(r["predicted"]) for r in rows]
    # standardised in training, given back in the table's units: within the targets' range, not near 0 +- 1
    assert min(targets) - np.ptp(targets) < np.mean(predicted) < max(targets) + np.ptp(targets)
    assert not (out / "km.png").exists()
