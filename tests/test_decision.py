"""The decision threshold: chosen on validation, kept in the checkpoint, used and named by predict, the
test metrics and a run's outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bigslide.data.table import SlideTable
from bigslide.engine import TrainConfig, predict_slides, run_to_end, train
from bigslide.engine.checkpoint import load_checkpoint, save_checkpoint
from bigslide.engine.decision import Decision, choose_threshold
from bigslide.engine.metrics import classification_metrics
from bigslide.explain.tissue_check import COLUMNS
from bigslide.synthetic.slide_set import make_slide_set
from tests.test_predict_cohort import make_checkpoint, predict, read_csv


def _probs(p1: list[float]) -> np.ndarray:
    p = np.asarray(p1, dtype=np.float64)
    return np.stack([1 - p, p], axis=1)


def test_the_threshold_separating_validation_is_chosen_mid_gap() -> None:
    # ranked right, all below 0.5: argmax calls every slide negative
    labels, probs = np.array([0, 0, 1, 1]), _probs([0.10, 0.20, 0.30, 0.40])
    decision = choose_threshold(labels, probs, epoch=3)
    assert decision.threshold == pytest.approx(0.25)
    assert (decision.source, decision.balanced_accuracy, decision.epoch) == ("validation", 1.0, 3)
    assert classification_metrics(labels, probs)["balanced_accuracy"] == 0.5
    scored = classification_metrics(labels, probs, decision)
    assert scored["balanced_accuracy"] == 1.0
    assert scored["threshold"] == pytest.approx(0.25)
    assert scored["auc"] == 1.0


def test_ties_take_the_middle_of_the_widest_interval() -> None:
    # one negative above one positive: cuts at 0.15 and at 0.65 both give balanced accuracy 0.75;
    # the gap 0.4-0.9 is wider than 0.1-0.2
    labels, probs = np.array([0, 1, 0, 1]), _probs([0.1, 0.2, 0.4, 0.9])
    decision = choose_threshold(labels, probs)
    assert decision.balanced_accuracy == pytest.approx(0.75)
    assert decision.threshold == pytest.approx(0.65)


def test_no_choice_without_both_classes_or_with_more_than_two() -> None:
    assert choose_threshold(np.array([1, 1]), _probs([0.2, 0.3])) == Decision()
    three = choose_threshold(np.array([0, 1, 2]), np.eye(3))
    assert three.source == "argmax"
    np.testing.assert_array_equal(three.classes(np.eye(3)), [0, 1, 2])
    assert Decision.from_state(None, 2) == Decision()  # a checkpoint from before: 0.5
    assert math.isnan(Decision().balanced_accuracy)


def test_predict_calls_classes_with_the_checkpoints_threshold_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cohort = make_slide_set(tmp_path / "cohort", n_slides=3, size=(512, 512), seed=3)
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    plain = tmp_path / "plain"
    code, stdout, _ = predict(
        ["--slides", str(cohort), "--checkpoint", str(ckpt), "--out", str(plain)], capsys
    )
    assert code == 0
    assert "decision: P(tumor) >= 0.5 (default" in stdout
    p1 = np.array([float(r["p_tumor"]) for r in read_csv(plain / "predictions.csv")])
    # a threshold between the slides' probabilities splits them where argmax does not
    cut = float(np.sort(p1)[1:].mean()) if np.ptp(p1) > 0 else float(p1[0])
    state = load_checkpoint(ckpt)
    state["decision"] = Decision(cut, "validation", 1.0, 0).state()
    chosen = save_checkpoint(state, tmp_path / "chosen.pt")
    out = tmp_path / "chosen"
    code, stdout, _ = predict(
        ["--slides", str(cohort), "--checkpoint", str(chosen), "--out", str(out)], capsys
    )
    assert code == 0
    assert f"decision: P(tumor) >= {cut:.4g}, chosen on the validation split" in stdout
    check = read_csv(out / "tissue_check.csv")
    assert [r["slide"] for r in check] == [str(e.path) for e in SlideTable.from_csv(cohort).entries]
    assert all(int(r["tiles_kept"]) > 0 for r in check)
    assert len(list((out / "tissue_check").glob("*.png"))) == 3
    rows = read_csv(out / "predictions.csv")
    assert [r["predicted"] for r in rows] == ["tumor" if p >= cut else "normal" for p in p1]
    assert {r["threshold"] for r in rows} == {f"{cut:.6g}"}
    # heatmap's and the library's predictions use it too
    preds, raw = predict_slides(chosen, SlideTable.from_csv(cohort), device="cpu")
    assert [p.label for p in preds] == [r["predicted"] for r in rows]
    assert raw.decision is not None
    assert raw.decision.threshold == cut


def test_a_run_chooses_its_threshold_on_validation_and_scores_the_test_split_with_it(tmp_path: Path) -> None:
    csv = make_slide_set(tmp_path / "slides", n_slides=8, size=(384, 384), seed=5)
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size = 32
    config.data.bag_size = 4
    config.model.backbone = "test_resnet"
    config.method.name = "abmil_acc"
    config.optim.epochs = 1
    config.run.device = "cpu"
    config.run.out_dir = str(tmp_path / "run")
    torch.manual_seed(0)
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    saved = Decision.from_state(load_checkpoint(result.checkpoint)["decision"])
    assert saved.source == "validation"
    assert saved.epoch == 0
    records = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert records[0]["val"]["chosen_threshold"] == pytest.approx(saved.threshold)
    assert records[-1]["test"]["threshold"] == pytest.approx(saved.threshold)
    # every slide of the run has its tissue check
    check = (tmp_path / "run" / "tissue_check.csv").read_text().splitlines()
    assert check[0].split(",") == list(COLUMNS)
    assert len(check) == 1 + 8
    assert len(list((tmp_path / "run" / "tissue_check").glob("*.png"))) == 8
