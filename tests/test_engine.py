"""The training engine end to end on small synthetic slides: events, checkpoints, stop, resume, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bigslide import TileGrid, open_slide
from bigslide.data.bags import BagDataset
from bigslide.data.table import SlideTable
from bigslide.engine import (
    CheckpointSaved,
    Loss,
    Message,
    Metrics,
    Progress,
    TrainConfig,
    predict_slide,
    run_to_end,
    train,
)
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.errors import TrainingError
from bigslide.synthetic.slide_set import make_slide_set


@pytest.fixture(scope="session")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("engine-slides"), n_slides=6, size=(768, 768), seed=3)


def small_config(csv: Path, out: Path, method: str = "frozen_abmil", **params: object) -> TrainConfig:
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size = 32
    config.data.bag_size = 6
    config.data.image_size = 64
    config.model.backbone = "resnet18"
    config.method.name = method
    config.method.params = dict(params)
    config.optim.epochs = 2
    config.optim.lr = 1e-3
    config.run.out_dir = str(out)
    config.run.device = "cpu"
    config.run.deterministic = True
    return config


def losses(events: list[object]) -> list[float]:
    return [e.value for e in events if isinstance(e, Loss)]


def drain(gen) -> tuple[list[object], object]:  # type: ignore[no-untyped-def]
    events = []
    while True:
        try:
            events.append(next(gen))
        except StopIteration as stop:
            return events, stop.value


def test_run_yields_progress_metrics_and_checkpoints_and_saves_its_config(
    slide_csv: Path, tmp_path: Path
) -> None:
    config = small_config(slide_csv, tmp_path / "run")
    events, result = drain(train(config))
    n_train = len(SlideTable.from_csv(slide_csv).subset("train"))
    assert n_train >= 2
    assert [e.step for e in events if isinstance(e, Progress)] == list(range(1, 2 * n_train + 1))
    assert {(e.epoch, e.split) for e in events if isinstance(e, Metrics)} == {
        (0, "train"),
        (0, "val"),
        (1, "train"),
        (1, "val"),
        (2, "test"),  # the table's test slides, scored once after training
    }
    assert result.test is not None
    # classes called at the threshold the validation split chose (two classes)
    assert set(result.test) == {"accuracy", "balanced_accuracy", "qwk", "auc", "threshold"}
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())[-1] == {"test": result.test}
    assert [e.step for e in events if isinstance(e, CheckpointSaved)] == [n_train, 2 * n_train]
    assert all(np.isfinite(losses(events)))
    assert result.checkpoint == tmp_path / "run" / "checkpoints" / "last.pt"
    assert TrainConfig.from_yaml(tmp_path / "run" / "config.yaml") == config
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert load_checkpoint(result.checkpoint)["position"] == {"epoch": 2, "batch": 0, "step": 2 * n_train}


def test_closing_the_run_saves_a_checkpoint_and_resume_repeats_the_same_losses(
    slide_csv: Path, tmp_path: Path
) -> None:
    full, _ = drain(train(small_config(slide_csv, tmp_path / "full", "full_bag")))

    config = small_config(slide_csv, tmp_path / "stopped", "full_bag")
    gen = train(config)
    seen = []
    for event in gen:
        seen.append(event)
        if isinstance(event, Progress) and event.step == 2:
            break
    gen.close()  # what the GUI's Stop and the CLI's Ctrl-C do
    assert load_checkpoint(tmp_path / "stopped" / "checkpoints" / "last.pt")["position"]["step"] == 2
    rest, _ = drain(train(config, resume=True))
    assert losses(seen) + losses(rest) == pytest.approx(losses(full), rel=1e-6, abs=1e-7)
    said = [e.text for e in rest if isinstance(e, Message) and e.text.startswith("resumed from")]
    assert said == [
        f"resumed from {config.run.out_dir}/checkpoints/last.pt in epoch 1, after 2 of its batches"
    ]
    # the finished run again: it says why it trains nothing
    again, _ = drain(train(config, resume=True))
    said = [e.text for e in again if isinstance(e, Message) and e.text.startswith("resumed from")]
    epochs = config.optim.epochs
    assert said[0].endswith(
        f"after epoch {epochs}; nothing left to train: all {epochs} epochs done "
        "(raise optim.epochs with --epochs)"
    )
    assert not losses(again)


def test_non_finite_loss_stops_with_a_message_and_keeps_the_last_good_checkpoint(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_config(slide_csv, tmp_path / "nan")
    config.optim.epochs = 3
    run_to_end(train(config))
    good = load_checkpoint(tmp_path / "nan" / "checkpoints" / "last.pt")
    from bigslide.methods.mil_baselines import FrozenABMIL

    monkeypatch.setattr(FrozenABMIL, "train_step", lambda self, batch, stepper: _nan_step())
    config.optim.epochs = 4
    with pytest.raises(TrainingError, match=r"loss became nan at step \d+ .*last good checkpoint .*last.pt"):
        run_to_end(train(config, resume=True))
    kept = load_checkpoint(tmp_path / "nan" / "checkpoints" / "last.pt")
    assert kept["position"] == good["position"]
    for key, value in good["model"].items():
        assert torch.equal(kept["model"][key], value)


def _nan_step():  # type: ignore[no-untyped-def]
    from bigslide.methods.base import StepResult

    return StepResult(float("nan"), torch.zeros(1, 2))


def test_predict_slide_gives_probabilities_and_an_attention_grid_over_every_tissue_tile(
    slide_csv: Path, tmp_path: Path
) -> None:
    config = small_config(slide_csv, tmp_path / "p")
    config.optim.epochs = 1
    result = run_to_end(train(config))
    slide = slide_csv.parent / "slide_000.svs"
    pred = predict_slide(result.checkpoint, slide)
    assert pred.probs.shape == (2,)
    assert pred.probs.sum() == pytest.approx(1.0, abs=1e-5)
    grid = pred.grids["attention"]
    with open_slide(slide) as s:
        tiles = TileGrid.from_slide(s, 32, min_tissue=config.data.min_tissue)
    assert np.isfinite(grid.scores).sum() == len(tiles)
    assert grid.cell_size_level0 == 32
    assert grid.mpp == pytest.approx((0.5, 0.5))


TINY = {
    "abmil_acc": {"hidden": 32, "attention_dim": 16, "chunk_size": 3},
    "full_bag": {"hidden": 32, "attention_dim": 16},
    "frozen_abmil": {"hidden": 32, "attention_dim": 16},
    "biglayer_mil": {"hidden": 32, "attention_dim": 16, "stages": 1, "budget_mb": 1.0},
    "patchgd": {"patch_size": 32, "latent_dim": 16, "epsilon": 2, "encoder_bn": "frozen"},
    "full_image": {},
    "biglayer_image": {"stages": 1, "budget_mb": 1.0},
}


@pytest.mark.parametrize("method", sorted(TINY))
def test_every_method_trains_through_the_engine_and_gives_slide_heatmaps(
    method: str, slide_csv: Path, tmp_path: Path
) -> None:
    from bigslide.methods import available_methods

    assert set(TINY) == set(available_methods()), "a registered method is missing from this table"
    config = small_config(slide_csv, tmp_path / method, method, **TINY[method])
    config.optim.epochs = 1
    config.optim.max_steps = 2
    events, result = drain(train(config))
    assert len(losses(events)) == 2
    assert all(np.isfinite(losses(events)))
    pred = predict_slide(result.checkpoint, slide_csv.parent / "slide_000.svs")
    assert pred.probs.sum() == pytest.approx(1.0, abs=1e-5)
    expected = {"attention"} if method in ("abmil_acc", "full_bag", "frozen_abmil", "biglayer_mil") else set()
    if method == "patchgd":
        expected = {"norm", "pca", "evidence"}
    assert set(pred.grids) == expected
    for grid in pred.grids.values():
        assert np.isfinite(grid.scores).any()
        with open_slide(slide_csv.parent / "slide_000.svs") as s:
            w, h = s.dimensions
        rows, cols = grid.scores.shape[:2]
        # the grid lies on the slide: its far corner is inside the level-0 extent (plus one cell)
        assert grid.origin[0] + cols * grid.cell_size_level0 <= w + grid.cell_size_level0
        assert grid.origin[1] + rows * grid.cell_size_level0 <= h + grid.cell_size_level0


def test_patchgd_trains_on_in_memory_arrays(tmp_path: Path) -> None:
    from bigslide.data.arrays import ArrayImageDataset
    from bigslide.data.sources import RunData

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 64, 96, 3), dtype=np.uint8)  # non-square: a 2 x 3 patch grid
    data = RunData(["a", "b"], ArrayImageDataset(images, [0, 1, 0, 1]), ArrayImageDataset(images[:2], [0, 1]))
    config = small_config(Path("unused.csv"), tmp_path, "patchgd", **TINY["patchgd"])
    config.optim.max_steps = 3
    events, result = drain(train(config, data=data))
    assert len(losses(events)) == 3
    assert {(e.epoch, e.split) for e in events if isinstance(e, Metrics)} == {(0, "train"), (0, "val")}
    assert result.method is not None
    assert result.method.predict(data.train[0]).maps["norm"].shape == (2, 3)


def test_a_run_writes_tensorboard_events_read_back_by_tensorboard(slide_csv: Path, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = run_to_end(train(small_config(slide_csv, tmp_path / "run")))
    events = EventAccumulator(str(result.out_dir), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()
    losses = [e.value for e in events.Scalars("train/loss")]
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, result.steps + 1))
    logged = [float(line.split(",")[2]) for line in (result.out_dir / "losses.csv").read_text().split()[1:]]
    assert losses == pytest.approx(logged, rel=1e-6)
    assert "train/learning_rate" in tags["scalars"]
    assert [e.step for e in events.Scalars("val/auc")] == [0, 1]
    assert events.Scalars("val/auc")[-1].value == pytest.approx(result.history[-1]["val"]["auc"])
    (image_tag,) = tags["images"]
    assert "attention" in image_tag
    assert len(events.Images(image_tag)) == 2  # one per epoch


@pytest.mark.parametrize("repeats", [0, 1])
def test_the_boards_heatmap_shows_the_whole_first_validation_slide_at_the_cost_of_a_quarter_bag(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repeats: int
) -> None:
    """Predicting every tile of a slide again for the board would lengthen every epoch's end; a
    sampled bag alone draws scattered dots. Validation of every tile (repeats 0) is the board's map;
    else a quarter of a bag's tiles on a lattice over the whole slide."""
    import bigslide.engine.inference as inference
    import bigslide.engine.run as run_module
    from bigslide.engine.board import RunBoard
    from bigslide.engine.run import BOARD_MIN_TILES

    predicted, shown = [], []
    real_predict, real_epoch = inference.predict_dataset, RunBoard.epoch

    def counted(method: object, dataset: object, **kwargs: object) -> object:
        predicted.append((kwargs.get("repeats"), kwargs.get("with_grids")))
        return real_predict(method, dataset, **kwargs)  # type: ignore[arg-type]

    def kept(self: RunBoard, record: dict, first: object, val: BagDataset) -> None:
        shown.append((first, val.grids[val.items[0][0]]))
        real_epoch(self, record, first, val)  # type: ignore[arg-type]

    monkeypatch.setattr(run_module, "predict_dataset", counted)
    monkeypatch.setattr(inference, "predict_dataset", counted)
    monkeypatch.setattr(RunBoard, "epoch", kept)
    config = small_config(slide_csv, tmp_path / "run")
    config.data.inference_repeats, config.data.bag_size = repeats, 24
    result = run_to_end(train(config))
    validation = (repeats, [0] if repeats == 0 else [])  # the board's map drawn in validation's read
    board = [] if repeats == 0 else [(0, True)]  # else one more read: the lattice preview
    assert predicted == [validation, *board, validation, *board, (0, [])]  # then the test slides
    assert len(shown) == result.history[-1]["epoch"] + 1 == 2
    for first, tiles in shown:
        assert first is not None
        ((_slide, maps),) = first.items()
        grid = maps["attention"]
        scored = int(np.isfinite(grid.scores).sum())
        if repeats == 0:
            assert scored == len(tiles)
        else:
            assert scored <= BOARD_MIN_TILES < len(tiles)  # a quarter of a bag's tiles read, at least 64
        # over the whole slide, not a corner of it
        extent = np.array(grid.scores.shape[::-1]) * grid.cell_size_level0
        assert (extent >= np.ptp(tiles.coords, axis=0) - grid.cell_size_level0).all()


def test_a_preview_of_a_large_slide_reads_one_tile_in_s_by_s_over_the_same_area(
    slide_csv: Path, tmp_path: Path
) -> None:
    config = small_config(slide_csv, tmp_path, "abmil_acc", **TINY["abmil_acc"])
    config.optim.max_steps = 1
    _, result = drain(train(config))
    slide = slide_csv.parent / "slide_000.svs"
    full = predict_slide(result.checkpoint, slide)
    tiles = int(np.isfinite(full.grids["attention"].scores).sum())
    preview = predict_slide(result.checkpoint, slide, max_tiles=tiles // 5)
    step = preview.thinned
    assert full.thinned == 1
    assert step == 3  # ceil(sqrt(5)): at most max_tiles tiles are read
    coarse, fine = preview.grids["attention"], full.grids["attention"]
    assert coarse.cell_size_level0 == pytest.approx(step * fine.cell_size_level0)
    read = int(np.isfinite(coarse.scores).sum())
    assert 0 < read <= tiles // 5
    assert tiles / step**2 * 0.5 <= read  # a lattice over the whole tissue, not a corner of it
    # each read tile's cell covers the full map's cells around it: the preview lies over the same tissue
    w, h = coarse.scores.shape[1] * coarse.cell_size_level0, coarse.scores.shape[0] * coarse.cell_size_level0
    assert w >= fine.scores.shape[1] * fine.cell_size_level0 - coarse.cell_size_level0
    assert h >= fine.scores.shape[0] * fine.cell_size_level0 - coarse.cell_size_level0
    assert coarse.origin == pytest.approx(fine.origin)
