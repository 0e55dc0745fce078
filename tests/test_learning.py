"""The learning path end to end: a small fixed-seed run on synthetic tumour slides beats chance clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from bigslide.data.table import SlideTable
from bigslide.engine import TrainConfig, predict_slides, run_to_end, train
from bigslide.explain.localisation import lesion_cell_auc
from bigslide.synthetic.slide_set import load_lesions, make_slide_set


@pytest.fixture(scope="module")
def tumour_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 slides of 512², half with 2-3 tumours; 8 train, 8 test (no validation pass: keeps it fast)."""
    csv = make_slide_set(
        tmp_path_factory.mktemp("learning-slides"), n_slides=16, size=(512, 512), seed=21, lesion_count=(2, 3)
    )
    table = csv.with_name("train_test.csv")
    table.write_text(csv.read_text().replace(",val\n", ",test\n"))
    return table


def test_abmil_acc_learns_the_tumour_task(tumour_csv: Path, tmp_path: Path) -> None:
    config = TrainConfig()
    config.data.csv = str(tumour_csv)
    config.data.target_mpp = 1.0  # 10x: tumour nuclei are plain to see, tiles are small
    config.data.tile_size = 32
    config.data.bag_size = 16
    config.model.backbone = "test_resnet"
    config.method.name = "abmil_acc"
    config.optim.epochs = 3
    config.optim.lr = 2e-3
    config.run.seed = 0
    config.run.device = "cpu"
    config.run.out_dir = str(tmp_path)
    result = run_to_end(train(config))
    assert result.checkpoint is not None

    table = SlideTable.from_csv(tumour_csv)
    held_out = table.subset("test")
    assert len(held_out) == 8
    preds, raw = predict_slides(result.checkpoint, held_out, device="cpu", repeats=0)
    labels = np.array([table.encode(e.label) for e in held_out.entries])
    assert roc_auc_score(labels, raw.probs[:, 1]) >= 0.85
    lesions = load_lesions(tumour_csv.parent / "lesions.json")
    cell_aucs = [
        lesion_cell_auc(p.grids["attention"], lesions[Path(e.path).name])
        for p, e in zip(preds, held_out.entries)
        if e.label == "tumor"
    ]
    assert np.nanmean(cell_aucs) >= 0.75, cell_aucs
