"""The process that steps the model never decodes a slide's pixels: tile grids (tissue, ink and focus
measures), tissue masks, stain fits, tissue-check thumbnails, training bags, validation, test scoring,
maps and cohort prediction all decode in the decode worker processes. Here this process's decoder raises,
so any decode that slips back onto it fails the run."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pytest

from bigslide.cli.main import main
from bigslide.data import processes as processes_module
from bigslide.engine import TrainConfig, run_to_end, train
from bigslide.engine.inference import predict_slide
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.wsi.slide import Slide


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("off-main"), n_slides=6, size=(512, 512), seed=11)


@pytest.fixture
def decoded_here(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Slides decoded by this process (each raises); forked workers inherit the check but are other
    processes, so they decode."""
    monkeypatch.setattr(processes_module, "_START_METHOD", "fork")
    main_process = os.getpid()
    decoded: list[str] = []
    for name in ("read_file_tile", "read_file_tile_luma", "_read_level"):
        original = getattr(Slide, name)

        def guarded(self: Slide, *args: Any, _original: Any = original, _name: str = name) -> Any:
            if os.getpid() == main_process:
                decoded.append(f"{self.path}: {_name}{args}")
                raise AssertionError(f"{self.path}: pixels decoded by the process that steps the model")
            return _original(self, *args)

        monkeypatch.setattr(Slide, name, guarded)
    return decoded


def config_for(csv_path: Path, out: Path, method: str, **data: Any) -> TrainConfig:
    config = TrainConfig()
    config.data.csv = str(csv_path)
    config.data.tile_size, config.data.bag_size, config.data.image_size = 32, 4, 64
    config.data.workers, config.data.tile_cache = 2, "none"  # cold: every grid made in this run
    for key, value in data.items():
        setattr(config.data, key, value)
    config.model.backbone = "test_resnet"
    config.method.name = method
    config.optim.epochs = 2
    config.run.out_dir, config.run.device, config.run.tensorboard = str(out), "cpu", True
    return config


@pytest.mark.parametrize(
    ("method", "data"),
    [
        ("abmil_acc", {}),  # bags: grids, thumbnails, bags, validation, test, TensorBoard maps
        ("abmil_acc", {"stain_normalise": "macenko", "augment": True}),  # stain fits per slide
        ("full_image", {}),  # one image per slide: tissue masks, image boxes
    ],
)
def test_training_decodes_nothing_in_the_training_process(
    slide_csv: Path, tmp_path: Path, decoded_here: list[str], method: str, data: dict[str, Any]
) -> None:
    result = run_to_end(train(config_for(slide_csv, tmp_path / "run", method, **data)))
    assert decoded_here == []
    assert result.steps > 0
    assert result.test is not None
    assert [r["epoch"] for r in result.history] == [0, 1]
    assert all("val" in r for r in result.history)
    checks = list((tmp_path / "run" / "tissue_check").glob("*.png"))
    assert len(checks) == 6  # a thumbnail per slide, drawn by the workers


@pytest.fixture(scope="module")
def checkpoint(slide_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained model (its config's data.workers, 2, is what a slide's map is read with)."""
    config = config_for(slide_csv, tmp_path_factory.mktemp("trained"), "abmil_acc")
    config.optim.epochs, config.run.tensorboard = 1, False
    run = run_to_end(train(config))
    assert run.checkpoint is not None
    return run.checkpoint


def test_cohort_prediction_and_a_slide_map_decode_nothing_here(
    slide_csv: Path,
    checkpoint: Path,
    tmp_path: Path,
    decoded_here: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "predicted"
    argv = ["predict", "--slides", str(slide_csv), "--checkpoint", str(checkpoint), "--out", str(out)]
    code = main([*argv, "--workers", "2", "--device", "cpu", "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    with (out / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6
    assert all(r["error"] == "" for r in rows)
    assert len(list((out / "tissue_check").glob("*.png"))) == 6

    slide = Path(rows[0]["slide"])
    prediction = predict_slide(checkpoint, slide, device="cpu")
    assert "attention" in prediction.grids
    assert decoded_here == []
