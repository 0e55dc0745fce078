import math

import numpy as np
import pytest

from bigslide.engine.metrics import classification_metrics


def test_binary_metrics_match_hand_computed_values() -> None:
    y = np.array([0, 0, 0, 1, 1])
    p1 = np.array([0.1, 0.6, 0.2, 0.7, 0.4])
    m = classification_metrics(y, np.stack([1 - p1, p1], axis=1))
    # predictions 0,1,0,1,0: 3 of 5 right; recall 2/3 (class 0) and 1/2 (class 1)
    assert m["accuracy"] == pytest.approx(0.6)
    assert m["balanced_accuracy"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    # positive pairs ranked above negatives: (0.7 > all 3) + (0.4 > 0.1, 0.2) = 5 of 6
    assert m["auc"] == pytest.approx(5 / 6)


def test_quadratic_kappa_penalises_far_errors_more() -> None:
    y = np.array([0, 1, 2, 3, 4] * 4)
    eye = np.eye(5)
    near = classification_metrics(y, eye[np.clip(y + 1, 0, 4)])["qwk"]
    far = classification_metrics(y, eye[4 - y])["qwk"]
    perfect = classification_metrics(y, eye[y])["qwk"]
    assert perfect == pytest.approx(1.0)
    assert far < 0 < near < perfect


def test_auc_and_balanced_accuracy_are_nan_when_only_one_class_is_present() -> None:
    m = classification_metrics(np.array([1, 1]), np.array([[0.2, 0.8], [0.6, 0.4]]))
    assert math.isnan(m["auc"])
    assert math.isnan(m["balanced_accuracy"])  # nothing to balance: a cross-validation mean leaves it out
    assert m["accuracy"] == pytest.approx(0.5)
