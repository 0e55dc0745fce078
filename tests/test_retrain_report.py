"""What a retrain says it changed: the share of attention inside the outlines a person drew, and the
validation figures of the starting and the retrained weights on the same validation slides, never a "nan"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import shapely

from bigslide.engine import train
from bigslide.engine.events import Message
from bigslide.engine.retrain_report import OutlineShares, outline_shares, retrain_summary
from bigslide.engine.slide_prediction import SlidePrediction
from bigslide.explain.attention_share import attention_share
from bigslide.explain.heatmap import ScoreGrid
from bigslide.synthetic.slides import make_synthetic_slide
from bigslide.tiling.annotations import Annotation
from tests.test_engine import drain, small_config

# 3 x 4 cells of 100 level-0 px from (1000, 2000); one cell unscored
SCORES = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, np.nan]], np.float32)
GRID = ScoreGrid(SCORES, 100.0, (1000.0, 2000.0), None, "attention")
# holds the centres of cells (0, 0), (0, 1) and (1, 0); cell (1, 1)'s centre (1150, 2150) lies outside
OUTLINE = shapely.Polygon(
    [(1000, 2000), (1200, 2000), (1200, 2100), (1100, 2100), (1100, 2200), (1000, 2200)]
)


def test_the_attention_share_counts_the_cells_whose_centre_is_inside() -> None:
    assert attention_share(GRID, [OUTLINE]) == pytest.approx((1 + 2 + 5) / 66)
    two = [shapely.box(1000, 2000, 1100, 2100), shapely.box(1300, 2200, 1400, 2300)]  # (0, 0) and (2, 3)
    assert attention_share(GRID, two) == pytest.approx(1 / 66)  # the unscored cell counts for nothing
    shifted = ScoreGrid(SCORES - 3, 100.0, (1000.0, 2000.0), None, "attention")  # raw scores, some < 0
    assert attention_share(shifted, [OUTLINE]) == pytest.approx((0 + 1 + 4) / (66 - 11))  # from the lowest
    assert attention_share(GRID, []) is None
    empty = ScoreGrid(np.full((2, 2), np.nan, np.float32), 100.0, (0.0, 0.0), None, "attention")
    assert attention_share(empty, [OUTLINE]) is None


def test_outline_shares_split_lesion_from_not_lesion_outlines_by_slide() -> None:
    pred = SlidePrediction(Path("/data/a.svs"), np.array([0.5, 0.5]), ["n", "t"], {"attention": GRID})
    drawn = {
        "/data/a.svs": [
            Annotation(OUTLINE, "tumor"),
            Annotation(shapely.box(1300, 2100, 1400, 2200), "not LESION"),  # cell (1, 3): 8
        ]
    }
    assert outline_shares([pred], drawn) == [OutlineShares("/data/a.svs", (1 + 2 + 5) / 66, 8 / 66)]
    assert outline_shares([pred], {}) == [OutlineShares("/data/a.svs", None, None)]


def test_the_summary_reads_before_then_after_and_leaves_out_what_cannot_be_computed() -> None:
    before = [OutlineShares("/data/a.svs", 0.12, 0.30), OutlineShares("/data/b.svs", None, 0.2)]
    after = [OutlineShares("/data/a.svs", 0.456, 0.05), OutlineShares("/data/b.svs", None, 0.1)]
    start = {"accuracy": 0.5, "balanced_accuracy": 0.5, "auc": float("nan"), "qwk": 0.0}
    end = {"accuracy": 1.0, "balanced_accuracy": 1.0, "auc": float("nan"), "qwk": 1.0}
    lines = retrain_summary(before, after, start, end)
    assert lines == [
        "a.svs: attention inside the lesion outlines 12 % → 46 %; inside the Not-lesion outlines 30 % → 5 %.",
        "b.svs: attention inside the Not-lesion outlines 20 % → 10 %.",
        "Validation, same slides, before → after: accuracy 0.500 → 1.000; balanced accuracy 0.500 → 1.000 "
        "(AUC left out: the validation slides are all of one class).",
    ]
    assert retrain_summary(before, [], None, end) == []  # nothing to compare


def test_a_run_from_a_checkpoint_validates_its_starting_weights_first(tmp_path: Path) -> None:
    """The fine-tune's `start_val` is the starting checkpoint validated on the fine-tune's own validation
    slides: its figures equal the first run's last validation on the same slides with the same weights."""
    paths = [tmp_path / f"s{i}.svs" for i in range(4)]
    for i, path in enumerate(paths):
        make_synthetic_slide(path, size=(512, 384), lesions=i % 2, seed=30 + i)
    table = tmp_path / "slides.csv"
    labels = ["normal", "tumor"]
    table.write_text(
        "slide,label,split\n"
        + "".join(f"s{i}.svs,{labels[i % 2]},{'val' if i >= 2 else 'train'}\n" for i in range(4))
    )

    def config(out: str) -> object:
        c = small_config(table, tmp_path / out, "abmil_acc", hidden=16, chunk_size=4)
        c.model.backbone, c.optim.epochs, c.run.tensorboard = "test_resnet", 1, False
        c.data.inference_repeats = 0  # every tile: the same weights give the same figures
        return c

    first = drain(train(config("first")))[1]  # type: ignore[arg-type]
    assert first.start_val is None  # a run from scratch has no starting weights to validate
    tuned = config("tuned")
    tuned.model.init_from = str(first.checkpoint)  # type: ignore[attr-defined]
    events, result = drain(train(tuned))  # type: ignore[arg-type]
    assert result.start_val is not None
    assert set(result.start_val) == set(first.history[-1]["val"]) - {"chosen_threshold"}
    for key, value in result.start_val.items():
        assert value == pytest.approx(first.history[-1]["val"][key], nan_ok=True), key
    said = [
        e.text for e in events if isinstance(e, Message) and e.text.startswith("validation of the starting")
    ]
    assert len(said) == 1
