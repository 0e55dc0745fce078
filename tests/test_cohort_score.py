"""A labelled cohort predicted is scored against its table: per case, classes called by the checkpoint's
decision, the same figures scikit-learn and scikit-survival give on the cases, a figure that cannot be
computed left out with its reason; `bigslide predict` prints them, writes them beside predictions.csv
(with the table's labels in the CSV) and removes them once the table gives no label."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from sksurv.metrics import concordance_index_censored

from bigslide.data.endpoint import Endpoint
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.engine.cohort_score import FILE_NAME, score_cohort
from bigslide.engine.decision import Decision
from bigslide.engine.slide_prediction import SlideFailure, SlidePrediction
from bigslide.synthetic.slide_set import make_slide_set
from tests.test_predict_cohort import make_checkpoint, predict, read_csv

CLASSES = ["normal", "tumor"]


def _prediction(path: str, p_tumor: float, case: str | None = None) -> SlidePrediction:
    return SlidePrediction(Path(path), np.array([1 - p_tumor, p_tumor]), CLASSES, {}, case=case)


def test_cases_are_scored_once_at_the_decision_and_unlabelled_or_failed_ones_are_counted_apart() -> None:
    entries = [
        SlideEntry(Path("a1.svs"), "tumor", case="A"),
        SlideEntry(Path("a2.svs"), "tumor", case="A"),  # one case of two slides: one bag, scored once
        SlideEntry(Path("b.svs"), "normal", case="B"),
        SlideEntry(Path("c.svs"), "normal", case="C"),
        SlideEntry(Path("d.svs"), "tumor", case="D"),
        SlideEntry(Path("e.svs"), "", case="E"),  # no label: predicted, not scored
        SlideEntry(Path("f.svs"), "normal", case="F"),  # failed: not scored
        SlideEntry(Path("g.svs"), "normal", case="G"),  # not reached: left out
    ]
    table = SlideTable(entries, CLASSES, "classification")
    p = {"A": 0.7, "B": 0.45, "C": 0.2, "D": 0.4}
    results: list[SlidePrediction | SlideFailure] = [
        _prediction("a1.svs", p["A"], "A"),
        _prediction("a2.svs", p["A"], "A"),
        _prediction("b.svs", p["B"]),
        _prediction("c.svs", p["C"]),
        _prediction("d.svs", p["D"]),
        _prediction("e.svs", 0.9),
        SlideFailure(Path("f.svs"), "does not decode"),
    ]
    decision = Decision(0.42, "validation", 1.0, 3)
    score = score_cohort(table, results, Endpoint(classes=CLASSES), decision)
    assert score is not None
    assert (score.cases, score.unlabelled, score.failed) == (4, 1, 1)
    truth = np.array([1, 0, 0, 1])  # A, B, C, D
    probs = np.array([p["A"], p["B"], p["C"], p["D"]])
    called = (probs >= 0.42).astype(int)  # not at 0.5: B is called tumor, D normal
    assert score.metrics["auc"] == pytest.approx(roc_auc_score(truth, probs))
    assert score.metrics["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(truth, called))
    assert score.labelled == {"normal": 2, "tumor": 2}
    assert score.confusion == [[1, 1], [1, 1]]
    lines = score.lines()
    assert lines[0].startswith("scored against the table: 4 cases (1 case without a label, 1 case not ")
    assert f"AUC {roc_auc_score(truth, probs):.3f}" in lines[0]
    assert lines[1] == (
        "called by P(tumor) >= 0.42: 1 of 2 normal cases called normal, 1 of 2 tumor cases called tumor"
    )


def test_a_figure_that_cannot_be_computed_is_left_out_with_its_reason() -> None:
    table = SlideTable([SlideEntry(Path(f"{i}.svs"), "tumor") for i in range(3)], CLASSES, "classification")
    results: list[SlidePrediction | SlideFailure] = [
        _prediction(f"{i}.svs", p) for i, p in enumerate([0.9, 0.8, 0.3])
    ]
    score = score_cohort(table, results, Endpoint(classes=CLASSES), Decision())
    assert score is not None
    assert "nan" not in " ".join(score.lines()).lower()
    assert "AUC left out: the labelled slides are all of one class" in score.lines()[0]
    assert score.as_dict()["metrics"]["auc"] is None  # JSON null, not NaN
    assert score.metrics["accuracy"] == pytest.approx(2 / 3)


def test_an_unlabelled_table_has_no_score() -> None:
    table = SlideTable([SlideEntry(Path("a.svs"), "")], CLASSES, "classification")
    assert score_cohort(table, [_prediction("a.svs", 0.6)], Endpoint(classes=CLASSES)) is None


def test_survival_cases_are_scored_by_their_c_index() -> None:
    times, events, risks = [5.0, 8.0, 12.0, 20.0, 3.0], [1, 0, 1, 1, 1], [0.9, 0.1, 0.5, -0.4, 1.2]
    entries = [
        SlideEntry(Path(f"{i}.svs"), "", time=t, event=e) for i, (t, e) in enumerate(zip(times, events))
    ]
    table = SlideTable(entries, [], "survival")
    endpoint = Endpoint(task="survival", survival_loss="cox")
    results: list[SlidePrediction | SlideFailure] = [
        SlidePrediction(Path(f"{i}.svs"), np.array([r]), [], {}, endpoint=endpoint)
        for i, r in enumerate(risks)
    ]
    score = score_cohort(table, results, endpoint)
    assert score is not None
    assert (score.cases, score.confusion) == (5, [])
    expected = concordance_index_censored(np.array(events, bool), np.array(times), np.array(risks))[0]
    assert score.metrics["c_index"] == pytest.approx(expected)
    assert f"C-index {expected:.3f}" in score.lines()[0]


def test_predict_scores_a_labelled_table_and_forgets_the_score_when_labels_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = make_slide_set(tmp_path / "set", n_slides=4, size=(384, 384), seed=5)
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    out = tmp_path / "p"
    code, stdout, _err = predict(
        [
            "--slides",
            str(table),
            "--checkpoint",
            str(ckpt),
            "--out",
            str(out),
            "--no-heatmaps",
            "--workers",
            "0",
        ],
        capsys,
    )
    assert code == 0
    rows = read_csv(out / "predictions.csv")
    with table.open(newline="") as f:
        labels = {Path(r["slide"]).name: r["label"] for r in csv.DictReader(f)}
    assert {Path(r["slide"]).name: r["label"] for r in rows} == labels  # the table's labels, beside
    truth = np.array([r["label"] == "tumor" for r in rows], int)
    p_tumor = np.array([float(r["p_tumor"]) for r in rows])
    called = np.array([r["predicted"] == "tumor" for r in rows], int)
    saved = json.loads((out / FILE_NAME).read_text())
    assert saved["cases"] == len(rows) == 4
    assert saved["metrics"]["auc"] == pytest.approx(roc_auc_score(truth, p_tumor))
    assert saved["metrics"]["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(truth, called))
    assert "scored against the table: 4 slides: " in stdout
    assert f"figures of the labelled cases: {out / FILE_NAME}" in stdout
    # the same slides without labels: nothing scored, and the earlier score is not left to be taken for it
    unlabelled = tmp_path / "unlabelled.csv"
    unlabelled.write_text("slide\n" + "".join(f"{tmp_path / 'set' / name}\n" for name in labels))
    code, stdout, _err = predict(
        ["--slides", str(unlabelled), "--checkpoint", str(ckpt), "--out", str(out), "--no-heatmaps"], capsys
    )
    assert code == 0
    assert "scored against" not in stdout
    assert not (out / FILE_NAME).exists()
    assert "label" not in read_csv(out / "predictions.csv")[0]


def test_predictions_from_python_are_scored_with_the_checkpoints_own_decision(tmp_path: Path) -> None:
    from bigslide.engine import predict_slides, score_cohort

    table_csv = make_slide_set(tmp_path / "set", n_slides=4, size=(384, 384), seed=5)
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    table = SlideTable.from_csv(table_csv)
    predictions, _ = predict_slides(ckpt, table, device="cpu")
    score = score_cohort(table, predictions)  # the endpoint and decision the predictions carry
    assert score is not None
    truth = np.array([CLASSES.index(e.label) for e in table.entries])
    p_tumor = np.array([p.probs[1] for p in predictions])
    assert score.metrics["auc"] == pytest.approx(roc_auc_score(truth, p_tumor))
    called = np.array([CLASSES.index(p.label) for p in predictions])
    assert score.confusion == [[int(((truth == t) & (called == c)).sum()) for c in (0, 1)] for t in (0, 1)]
