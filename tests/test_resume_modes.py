"""Exact resume in every mode: a run stopped between batches (mid-accumulation included) and resumed ends
with the same parameters, optimizer state and gradient-scaler state as a run that was never stopped."""

from __future__ import annotations

import csv as csv_module
from pathlib import Path

import pytest
import torch

from bigslide.engine import TrainConfig, run_to_end, train
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.events import Progress
from bigslide.memory import stepper as stepper_module
from bigslide.synthetic.slide_set import make_slide_set
from tests.test_engine import TINY, small_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four training slides and no validation split: the runs here are about the training state."""
    csv = make_slide_set(tmp_path_factory.mktemp("resume-slides"), n_slides=4, size=(384, 384), seed=5)
    rows = list(csv_module.DictReader(csv.open()))
    with csv.with_name("train.csv").open("w", newline="") as f:
        writer = csv_module.DictWriter(f, fieldnames=["slide", "label", "split"])
        writer.writeheader()
        writer.writerows({"slide": r["slide"], "label": r["label"], "split": "train"} for r in rows)
    return csv.with_name("train.csv")


def config_for(csv: Path, out: Path, method: str) -> TrainConfig:
    config = small_config(csv, out, method, **TINY[method])
    config.optim.epochs = 1
    config.optim.accumulate = 2
    config.optim.optimizer = "sgd"  # momentum buffers: a missed or doubled step changes them
    return config


def stop_after(config: TrainConfig, steps: int) -> None:
    """Run until `steps` batches are done, then close the run as the GUI's Stop or Ctrl-C does."""
    gen = train(config)
    for event in gen:
        if isinstance(event, Progress) and event.step == steps:
            gen.close()
            return
    raise AssertionError(f"the run ended before step {steps}")


def final_state(config: TrainConfig) -> dict[str, object]:
    return load_checkpoint(Path(config.run.out_dir) / "checkpoints" / "last.pt")


def assert_same_run(resumed: dict, reference: dict) -> None:  # type: ignore[type-arg]
    assert resumed["position"] == reference["position"]
    for key, value in reference["model"].items():
        torch.testing.assert_close(resumed["model"][key], value, rtol=1e-6, atol=1e-7, msg=key)
    ref_state, got_state = reference["optimizer"]["state"], resumed["optimizer"]["state"]
    assert ref_state.keys() == got_state.keys()
    for index, buffers in ref_state.items():
        for name, value in buffers.items():
            torch.testing.assert_close(got_state[index][name], value, rtol=1e-6, atol=1e-7)
    assert resumed["stepper"]["steps"] == reference["stepper"]["steps"]
    assert resumed["stepper"]["scaler"] == reference["stepper"]["scaler"]


@pytest.mark.parametrize("method", sorted(TINY))
def test_stopped_mid_accumulation_resumes_exactly(method: str, slide_csv: Path, tmp_path: Path) -> None:
    reference = config_for(slide_csv, tmp_path / "reference", method)
    run_to_end(train(reference))
    total = final_state(reference)["position"]["step"]
    assert total >= 4

    stopped = config_for(slide_csv, tmp_path / "stopped", method)
    stop_after(stopped, 3)  # odd: one batch's gradient is waiting for its partner
    saved = final_state(stopped)
    assert saved["position"]["step"] == 3
    if method != "patchgd":  # PatchGD steps within a batch (every ε inner iterations)
        assert saved["stepper"]["pending"] == 1
        assert any(g is not None for g in saved["stepper"]["grads"])
    run_to_end(train(stopped, resume=True))
    assert_same_run(final_state(stopped), final_state(reference))


def test_fp16_gradient_scaler_state_is_resumed(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CPU has no fp16 scaler in the engine; give it torch's CPU one, growing the scale every step, so a
    # resumed run that restarted the scale would end with another one.
    monkeypatch.setattr(
        stepper_module,
        "make_scaler",
        lambda device, amp: (
            torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=1) if amp == "fp16" else None
        ),
    )
    reference = config_for(slide_csv, tmp_path / "reference", "full_bag")
    reference.run.amp = "fp16"
    run_to_end(train(reference))
    expected = final_state(reference)
    assert expected["stepper"]["scaler"]["scale"] > 2.0**4

    stopped = config_for(slide_csv, tmp_path / "stopped", "full_bag")
    stopped.run.amp = "fp16"
    stop_after(stopped, 3)
    run_to_end(train(stopped, resume=True))
    assert_same_run(final_state(stopped), expected)
