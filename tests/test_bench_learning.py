"""The learning bench: parts run apart share the results file, a changed setting under a part is refused;
UltraMNIST compares like with like (same canvases, measured memory)."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shapely

from bigslide.bench import learning
from bigslide.bench.learning import _update, render_tables
from bigslide.bench.learning import runs as learning_runs
from bigslide.data.slides import SlideCache
from bigslide.engine import CheckpointSaved, TrainConfig, train
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.run import checkpoint_path
from bigslide.engine.setup import build_data
from bigslide.synthetic.slide_set import make_slide_set


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


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    learning.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_every_ultramnist_run_sees_the_same_canvases_at_its_own_size() -> None:
    args = _args("--canvas", "128", "--canvases", "6")
    runs = {"patchgd": 128, "full_image": 64}
    data = {
        m: build_data(learning.ultramnist_config(args, m, size, 0, m), "image", SlideCache())
        for m, size in runs.items()
    }
    big, small = data["patchgd"].train, data["full_image"].train
    np.testing.assert_array_equal(big.labels, small.labels)  # type: ignore[union-attr]
    image, shrunk = big[3].x[0].numpy(), small[3].x[0].numpy()
    assert image.shape == (128, 128)
    assert shrunk.shape == (64, 64)
    # The low-resolution run sees the full canvas shrunk, not a canvas drawn anew at its size.
    assert np.abs(shrunk - image.reshape(64, 2, 64, 2).mean(axis=(1, 3))).mean() < 0.03


def test_step_memory_grows_with_the_image() -> None:
    args = _args("--canvas", "96")
    small = learning.step_memory(learning.ultramnist_config(args, "full_image", 16, 0, "m"))
    large = learning.step_memory(learning.ultramnist_config(args, "full_image", 96, 0, "m"))
    assert large > small


def test_frozen_probe_reads_lesion_tiles_from_random_features(tmp_path: Path) -> None:
    # Tumour lesions change a tile's colour and texture, so a probe on random features must find them;
    # a probe that mixed up tiles and labels (or train and test) would sit near 0.5.
    csv = make_slide_set(tmp_path, n_slides=8, size=(512, 512), seed=3, lesion_kind="tumour")
    images, labels = learning.lesion_tiles(csv, "test", 32)
    assert images.shape[1:] == (32, 32, 3)
    assert images.dtype == np.uint8
    assert 0 < labels.sum() < len(labels)
    result = learning.frozen_probe_run(_args("--subtle-tile", "32"), csv, seed=0)
    assert result["tile_auc"] > 0.9


def test_an_interrupted_run_continues_from_its_checkpoint_only_under_the_same_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = _args("--canvas", "64", "--canvases", "8", "--ultramnist-epochs", "2")
    config = learning.ultramnist_config(args, "full_image", 16, 0, "um")
    config.run.out_dir = str(tmp_path / "um")
    run = train(config)
    for event in run:  # stopped after the first epoch's checkpoint, as a killed bench would have been
        if isinstance(event, CheckpointSaved):
            break
    run.close()
    assert load_checkpoint(checkpoint_path(config))["position"]["epoch"] == 1

    resumed: list[bool] = []

    def recording_train(config: TrainConfig, *, resume: bool = False, **kw: Any) -> Any:
        resumed.append(resume)
        return train(config, resume=resume, **kw)

    monkeypatch.setattr(learning_runs, "train", recording_train)
    assert len(learning.train_run(config).history) == 2
    changed = learning.ultramnist_config(args, "full_image", 16, 0, "um")
    changed.run.out_dir = config.run.out_dir
    changed.optim.lr = 1e-2
    assert len(learning.train_run(changed).history) == 2
    assert resumed == [True, False]  # the same settings continue; another learning rate starts afresh


@pytest.mark.parametrize("kind", ["survival", "regression"])
def test_a_study_run_is_scored_on_its_test_split_beside_the_oracle(kind: str, tmp_path: Path) -> None:
    from scipy.stats import pearsonr

    from bigslide.bench.learning.study import study_run
    from bigslide.synthetic.study import make_study_set

    csv_path = make_study_set(tmp_path / "set", kind, n=12, size=(512, 512), seed=4)  # type: ignore[arg-type]
    args = argparse.Namespace(
        study_bag=8, study_epochs=1, epochs=1, backbone="test_resnet", out=str(tmp_path / "out")
    )
    metrics = study_run(args, csv_path, kind, "abmil_acc", 0)  # type: ignore[arg-type]
    with csv_path.open() as f:
        test = [r for r in csv.DictReader(f) if r["split"] == "test"]
    if kind == "regression":
        assert set(metrics) == {"mae", "rmse", "pearson_r", "oracle_pearson_r"}
        oracle = [float(r["oracle"]) for r in test]
        assert metrics["oracle_pearson_r"] == pytest.approx(
            pearsonr(oracle, [float(r["target"]) for r in test])[0]
        )
    else:
        assert set(metrics) == {"c_index", "td_auc", "oracle_c_index"}
        assert 0.5 < metrics["oracle_c_index"] <= 1.0


def test_the_annotations_part_draws_a_quarter_of_the_training_lesions_and_normal_squares(
    tmp_path: Path,
) -> None:
    from bigslide.bench.learning.annotations import annotated_set
    from bigslide.data.table import SlideTable
    from bigslide.synthetic.slide_set import load_lesions
    from bigslide.tiling.annotations import NOT_LESION, read_annotations

    csv_path = make_slide_set(
        tmp_path / "subtle", n_slides=8, size=(512, 512), seed=2, lesion_kind="subtle", lesion_count=(2, 2)
    )
    table = SlideTable.from_csv(annotated_set(csv_path, 32, 0.5))
    lesions = load_lesions(csv_path.parent / "lesions.json")
    train = [e for e in table.entries if e.split == "train"]
    drawn = {e.path.name: read_annotations(e.annotations) for e in train if e.annotations is not None}
    outlined = [a for found in drawn.values() for a in found if a.name == "tumor"]
    total = sum(len(lesions[e.path.name]) for e in train)
    assert len(outlined) == round(total / 4)
    for name, found in drawn.items():  # each lesion outline is a lesion's own; the squares are clear of them
        truth = [shapely.Polygon(p) for p in lesions[name]]
        for annotation in found:
            if annotation.name == "tumor":
                assert any(annotation.geometry.equals(t) for t in truth)
            else:
                assert annotation.name == NOT_LESION
                assert not any(annotation.geometry.intersects(t) for t in truth)
    assert any(a.name == NOT_LESION for found in drawn.values() for a in found)
    assert all(e.annotations is None for e in table.entries if e.split != "train")  # test slides: none


def test_epochs_to_the_goal_count_the_first_reach_and_the_last_fall() -> None:
    from bigslide.bench.learning.annotations import goal_epochs

    assert goal_epochs([0.5, 0.95, 0.8, 0.92, 0.93]) == {
        "epochs_to_goal": 2.0,
        "epochs_to_stay": 4.0,
        "final_val_auc": 0.93,
    }
    never = goal_epochs([0.5, 0.95, 0.7])
    assert never["epochs_to_goal"] == 2.0
    assert np.isnan(never["epochs_to_stay"])
    assert goal_epochs([0.9, 0.91])["epochs_to_stay"] == 1.0


def test_the_suggest_parts_oracle_answers_from_the_lesion_masks_and_stops_at_k_answers(
    tmp_path: Path,
) -> None:
    from bigslide.bench.learning.suggest import answered_table, oracle
    from bigslide.data.table import SlideTable
    from bigslide.synthetic.slide_set import load_lesions
    from bigslide.tiling.annotations import NOT_LESION, read_annotations

    lesion = shapely.box(0, 0, 100, 100)
    tiles = np.array([[x + 16, y + 16] for y in range(0, 192, 32) for x in range(0, 192, 32)], float)
    assert oracle(shapely.box(0, 0, 96, 96), [lesion], tiles) == "lesion"  # 9 of 9 tiles in it
    assert oracle(shapely.box(96, 96, 192, 192), [lesion], tiles) == NOT_LESION  # none
    assert oracle(shapely.box(64, 64, 160, 160), [lesion], tiles) is None  # 1 of 9: mixed, skipped
    assert oracle(shapely.box(500, 500, 596, 596), [lesion], tiles) is None  # no tile: skipped
    assert oracle(shapely.box(0, 0, 96, 96), [], tiles) == NOT_LESION  # a slide without lesions

    csv_path = make_slide_set(
        tmp_path / "subtle", n_slides=8, size=(512, 512), seed=2, lesion_kind="subtle", lesion_count=(2, 2)
    )
    table = SlideTable.from_csv(csv_path)
    lesions = load_lesions(csv_path.parent / "lesions.json")
    positive = next(e for e in table.entries if e.split == "train" and lesions[e.path.name])
    negative = next(e for e in table.entries if e.split == "train" and not lesions[e.path.name])
    grid = np.array([[x + 16, y + 16] for y in range(0, 512, 32) for x in range(0, 512, 32)], float)
    in_lesion = shapely.contains_xy(shapely.Polygon(lesions[positive.path.name][0]), grid[:, 0], grid[:, 1])
    x, y = grid[np.flatnonzero(in_lesion)[0]]
    places = [
        (negative.path, shapely.box(0, 0, 96, 96)),
        (positive.path, shapely.box(x - 16, y - 16, x + 16, y + 16)),  # one tile, in a lesion
        (positive.path, shapely.box(1000, 1000, 1096, 1096)),  # off the slide: skipped
        (negative.path, shapely.box(200, 200, 296, 296)),
        (negative.path, shapely.box(300, 300, 396, 396)),  # beyond k = 3 answers
    ]
    tiles = {e.path: grid for e in table.entries}
    out, counts = answered_table(csv_path, tmp_path / "answered", places, 3, tiles)
    assert counts == {"answered_lesion": 1.0, "answered_not_lesion": 2.0, "skipped": 1.0}
    answered = SlideTable.from_csv(out)
    drawn = {e.path: read_annotations(e.annotations) for e in answered.entries if e.annotations}
    assert [a.name for a in drawn[positive.path]] == [positive.label]
    assert [a.name for a in drawn[negative.path]] == [NOT_LESION, NOT_LESION]
    assert {e.path for e in answered.entries} == {e.path for e in table.entries}  # the test slides too
