"""The learning bench's results file: parts run apart share it, a changed setting under a part is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from bigslide.bench.learning import _update, render_tables


def test_parts_share_the_results_file_and_a_changed_setting_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    _update(path, meta={"backbone": "test_resnet", "epochs": 3}, command="bench learning --parts tumour_mil")
    _update(path, key="tumour_mil/abmil_acc/seed0", value={"auc": 1.0, "balanced_accuracy": 0.75})
    # Another part with settings of its own joins the same file.
    state = _update(path, meta={"backbone": "test_resnet", "subtle_epochs": 12}, command="--parts subtle")
    assert state["meta"] == {"backbone": "test_resnet", "epochs": 3, "subtle_epochs": 12}
    assert state["commands"] == ["bench learning --parts tumour_mil", "--parts subtle"]
    assert "| abmil_acc | 1 | 1.000 (1 seed) | 0.750 (1 seed) | — |" in render_tables(state)
    with pytest.raises(SystemExit, match=r"other settings \(epochs\)"):
        _update(path, meta={"backbone": "test_resnet", "epochs": 5}, command="--epochs 5")
