"""Slide- or case-level metrics per endpoint.

classification (scikit-learn): accuracy, balanced accuracy, ROC-AUC, quadratic weighted kappa.
regression: MAE, RMSE, Pearson r. survival (scikit-survival, which also gives the Kaplan-Meier curves
and the log-rank test of the report): Harrell's C-index with censoring, and the cumulative/dynamic AUC
at the quartiles of the event times (mean over those times), NaN where it is not defined.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

from bigslide.data.endpoint import Endpoint
from bigslide.engine.decision import Decision


def endpoint_metrics(
    endpoint: Endpoint, y: np.ndarray, outputs: np.ndarray, decision: Decision | None = None
) -> dict[str, float]:
    """Metrics of `outputs` (n, K) (`Method.outputs`) against the targets `y` as datasets give them;
    classes are called by `decision` (None: the most probable class)."""
    if len(y) == 0:
        return {}
    if endpoint.task == "classification":
        return classification_metrics(y, outputs, decision)
    if endpoint.task == "regression":
        return regression_metrics(np.asarray(y, dtype=np.float64), np.asarray(outputs)[:, 0])
    y = np.asarray(y, dtype=np.float64).reshape(-1, 3)
    return survival_metrics(y[:, 0], y[:, 1], endpoint.risk(np.asarray(outputs)))


def regression_metrics(y_true: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    error = np.asarray(predicted, dtype=np.float64) - y_true
    r = float("nan")
    if len(y_true) > 1 and np.std(y_true) > 0 and np.std(predicted) > 0:
        r = float(np.corrcoef(y_true, predicted)[0, 1])
    return {"mae": float(np.abs(error).mean()), "rmse": float(np.sqrt((error**2).mean())), "pearson_r": r}


def survival_metrics(time: np.ndarray, event: np.ndarray, risk: np.ndarray) -> dict[str, float]:
    """Harrell's C-index (NaN without a comparable pair) and the mean time-dependent AUC."""
    from sksurv.metrics import concordance_index_censored, cumulative_dynamic_auc
    from sksurv.util import Surv

    observed = np.asarray(event) > 0.5
    out = {"c_index": float("nan"), "td_auc": float("nan")}
    if observed.any() and len(time) > 1:
        with contextlib.suppress(ValueError):  # every pair is incomparable
            out["c_index"] = float(concordance_index_censored(observed, time, risk)[0])
    times = np.quantile(time[observed], [0.25, 0.5, 0.75]) if observed.sum() >= 2 else np.array([])
    times = np.unique(times[(times >= time.min()) & (times < time.max())])
    if len(times):
        survival = Surv.from_arrays(observed, time)
        with contextlib.suppress(ValueError):  # censoring leaves a time without cases or controls
            out["td_auc"] = float(cumulative_dynamic_auc(survival, survival, risk, times)[1])
    return out


def classification_metrics(
    y_true: np.ndarray, probs: np.ndarray, decision: Decision | None = None
) -> dict[str, float]:
    """`probs` is (n, C). AUC is one-vs-rest macro for C > 2; NaN when a class is missing from y_true
    (balanced accuracy too, when only one is present).
    Classes are called by `decision` (None: the most probable class); with one, `threshold` is its
    threshold on P(class 1)."""
    # here: sklearn takes a second to import, and a prediction without labels never scores
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, cohen_kappa_score, roc_auc_score

    y_true = np.asarray(y_true, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if len(y_true) == 0:
        return {}
    pred = decision.classes(probs) if decision is not None else probs.argmax(axis=1)
    n_classes = probs.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one-class subsets warn; the NaN below says it
        out = {
            "accuracy": float(accuracy_score(y_true, pred)),
            "balanced_accuracy": float(balanced_accuracy_score(y_true, pred)),
            "qwk": float(cohen_kappa_score(y_true, pred, weights="quadratic", labels=list(range(n_classes)))),
        }
    present = np.unique(y_true)
    if len(present) < 2:
        # a set of one class has no second class to balance with (its "balanced" accuracy would be the
        # accuracy), and no AUC: both left out of means, as their words say
        out["auc"] = out["balanced_accuracy"] = float("nan")
    elif n_classes == 2:
        out["auc"] = float(roc_auc_score(y_true, probs[:, 1]))
    elif len(present) == n_classes:
        p = probs / probs.sum(axis=1, keepdims=True)
        out["auc"] = float(roc_auc_score(y_true, p, multi_class="ovr", average="macro"))
    else:
        out["auc"] = float("nan")
    if np.isnan(out["qwk"]):
        out["qwk"] = 0.0  # kappa is undefined when both raters agree on one class
    if decision is not None and n_classes == 2 and decision.source != "argmax":
        out["threshold"] = float(decision.threshold)
    return out
