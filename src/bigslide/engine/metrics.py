"""Slide-level metrics (scikit-learn): accuracy, balanced accuracy, ROC-AUC, quadratic weighted kappa."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.metrics import accuracy_score, balanced_accuracy_score, cohen_kappa_score, roc_auc_score


def classification_metrics(y_true: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """`probs` is (n, C). AUC is one-vs-rest macro for C > 2; NaN when a class is missing from y_true."""
    y_true = np.asarray(y_true, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if len(y_true) == 0:
        return {}
    pred = probs.argmax(axis=1)
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
        out["auc"] = float("nan")
    elif n_classes == 2:
        out["auc"] = float(roc_auc_score(y_true, probs[:, 1]))
    elif len(present) == n_classes:
        p = probs / probs.sum(axis=1, keepdims=True)
        out["auc"] = float(roc_auc_score(y_true, p, multi_class="ovr", average="macro"))
    else:
        out["auc"] = float("nan")
    if np.isnan(out["qwk"]):
        out["qwk"] = 0.0  # kappa is undefined when both raters agree on one class
    return out
