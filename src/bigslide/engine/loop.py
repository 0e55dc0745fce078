"""The training run: a generator of events that returns a `RunResult`.

The CLI prints the events; the napari plugin runs the same generator in a worker thread. Closing the
generator (GUI Stop, Ctrl-C in the CLI) saves a checkpoint, so a stopped run can be resumed exactly.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigslide.data.endpoint import Endpoint
from bigslide.data.loader import BatchLoader
from bigslide.data.sample import Batch, Sample, as_float
from bigslide.data.slides import SlideCache
from bigslide.data.stain_norm import StainFit
from bigslide.engine import setup
from bigslide.engine.board import RunBoard
from bigslide.engine.checkpoint import (
    RESUME_KEYS,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    seed_everything,
    set_rng_state,
)
from bigslide.engine.config import TrainConfig
from bigslide.engine.distributed import from_environment
from bigslide.engine.events import CheckpointSaved, Event, Loss, Message, Metrics, Progress
from bigslide.engine.features import attach_feature_store
from bigslide.engine.inference import predict_dataset
from bigslide.engine.logfile import LossLog
from bigslide.engine.metrics import endpoint_metrics
from bigslide.errors import ConfigError, TrainingError
from bigslide.files import atomic_write_text
from bigslide.memory.stepper import OptimStepper
from bigslide.methods.base import Method, get_method


@dataclass
class RunResult:
    out_dir: Path
    checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    method: Method | None = None  # the trained method (its modules are `method.model`)
    test: dict[str, float] | None = None  # metrics on the table's test split, after training


def collate(samples: list[Sample], device: torch.device, *, uint8: bool = True) -> Batch:
    """Images are stacked, bags concatenated tile-wise (`Batch.sizes`). `uint8=False`: pixels as floats
    in [0, 1] (for methods that do not scale them themselves)."""
    bags = samples[0].coords is not None
    sizes = [s.x.shape[0] for s in samples] if bags else None
    if len(samples) == 1:
        x = samples[0].x
    else:
        x = torch.cat([s.x for s in samples]) if bags else torch.stack([s.x for s in samples])
    if not uint8:
        x = as_float(x)
    if not bags and x.ndim == 3:  # one image: add the batch axis
        x = x.unsqueeze(0)
    y = torch.tensor([s.y for s in samples])  # class indices (int64), numbers or (time, event, interval)
    # Inputs stay in host memory: methods move what they need (Big-Layer never moves a whole bag).
    if device.type == "cuda":
        x = x.pin_memory()
    return Batch(x=x, y=y.to(device), samples=samples, sizes=sizes)


def checkpoint_path(config: TrainConfig) -> Path:
    return Path(config.run.out_dir) / "checkpoints" / "last.pt"


def train(
    config: TrainConfig, *, resume: bool = False, data: setup.RunData | None = None
) -> Generator[Event, None, RunResult]:
    """Train `config.method` on the configured data (or on `data`); yields events at least once per batch."""
    out = Path(config.run.out_dir)
    ranks = from_environment(config.run.device, timeout_s=config.run.dist_timeout)
    if ranks.is_main:
        out.mkdir(parents=True, exist_ok=True)
        config.to_yaml(out / "config.yaml")
    seed_everything(config.run.seed, deterministic=config.run.deterministic)
    device = ranks.device or setup.resolve_device(config.run.device)

    method_kind = get_method(config.method.name).kind
    slides = SlideCache(slide_mpp=config.data.slide_mpp)
    data = data or setup.build_data(config, method_kind, slides)
    train_ds, val_ds, test_ds = data.train, data.val, data.test
    endpoint = data.endpoint
    assert endpoint is not None  # RunData fills it in
    method = setup.build_method(config, endpoint, device)
    batch_size = method.batch_size(config.data.batch_size)
    if endpoint.survival_loss == "cox" and endpoint.task == "survival" and batch_size < 2:
        raise ConfigError(
            f"data.survival_loss: cox compares the bags of a batch, and {method.name} takes one bag per "
            "step; use data.survival_loss: nll"
        )
    if config.data.features:
        yield from attach_feature_store(config, method, (train_ds, val_ds, test_ds))
    loader = BatchLoader(train_ds, workers=config.data.workers, prefetch=config.data.prefetch)
    ranks.broadcast_module(method.model)
    if not ranks.is_main:
        val_ds = test_ds = None  # rank 0 validates and saves; the others only train
    n_val = len(val_ds) if val_ds is not None else 0
    yield Message(
        f"{method.name} on {device.type}: {len(train_ds)} train / {n_val} val items, {_predicts(endpoint)}"
    )

    batches_per_epoch = math.ceil(len(ranks.shard(np.arange(len(train_ds)))) / batch_size)
    total = config.optim.epochs * batches_per_epoch
    if config.optim.max_steps:
        total = min(total, config.optim.max_steps)
    optimizer = setup.build_optimizer(config, method)
    schedule = setup.build_schedule(config, optimizer, total)
    amp = None if config.run.amp == "none" else config.run.amp
    stepper = OptimStepper(
        optimizer,
        grad_clip=config.optim.grad_clip,
        amp=amp,
        device=device,
        accumulate=config.optim.accumulate,
        grad_sync=ranks.average_gradients if ranks.active else None,
    )

    state = {"epoch": 0, "batch": 0, "step": 0}
    history: list[dict[str, Any]] = []
    ckpt = checkpoint_path(config)
    resumed = resume and ckpt.is_file()
    if resumed:
        saved = load_checkpoint(ckpt, require=RESUME_KEYS)
        method.model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        stepper.load_state_dict(saved["stepper"])
        state = dict(saved["position"])
        history = list(saved.get("history", []))
        set_rng_state(saved["rng"])
        if saved.get("stain"):
            method.stain_reference = StainFit.from_state(saved["stain"])
        yield Message(f"resumed from {ckpt} at epoch {state['epoch']}, batch {state['batch']}")
    loss_log = LossLog(out / "losses.csv")
    board = None
    if ranks.is_main:
        loss_log.start(resume_step=state["step"] if resumed else None)
        if config.run.tensorboard:
            board = RunBoard(out, resume_step=state["step"] if resumed else None)

    def save() -> CheckpointSaved:
        if not ranks.is_main:
            return CheckpointSaved(str(ckpt), state["step"])
        payload = {
            "config": config.to_dict(),
            "classes": data.classes,
            "endpoint": endpoint.state(),
            "method": method.name,
            "model": method.model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "stepper": stepper.state_dict(),
            "position": dict(state),
            "history": history,
            "rng": rng_state(),
            # what slides are normalised to, so prediction maps them as training did
            "stain": method.stain_reference.state() if method.stain_reference is not None else None,
        }
        return CheckpointSaved(str(save_checkpoint(payload, ckpt)), state["step"])

    saved_at = -1
    try:
        while state["epoch"] < config.optim.epochs and state["step"] < total:
            epoch = state["epoch"]
            train_ds.set_epoch(epoch)
            order = ranks.shard(np.random.default_rng([config.run.seed, epoch]).permutation(len(train_ds)))
            batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
            loader.plan(batches[state["batch"] : state["batch"] + total - state["step"]])
            seen_y: list[Any] = []
            seen_p: list[np.ndarray] = []
            while state["batch"] < len(batches) and state["step"] < total:
                batch = collate(loader.take(batches[state["batch"]]), device, uint8=method.takes_uint8)
                if not method.takes_uint8 and (colour := method.colour(batch.samples)) is not None:
                    batch.x = colour(batch.x)  # floats on the host already: the stain maps go there
                method.model.train()
                try:
                    result = method.train_step(batch, stepper)
                except torch.OutOfMemoryError:
                    raise TrainingError(out_of_memory(config, method, state["step"] + 1, ckpt)) from None
                if not math.isfinite(result.loss):
                    where = f"; the last good checkpoint is {ckpt}" if ckpt.is_file() else ""
                    raise TrainingError(
                        f"loss became {result.loss} at step {state['step'] + 1} (epoch {epoch}){where}. "
                        "Lower optim.lr, set optim.grad_clip, or turn off run.amp."
                    )
                with warnings.catch_warnings():
                    # with accumulation the first batches do not step the optimizer yet; that is intended
                    warnings.filterwarnings("ignore", re.escape("Detected call of `lr_scheduler.step()`"))
                    schedule.step()
                state["batch"] += 1
                state["step"] += 1
                loss_log.write(state["step"], epoch, result.loss)
                if board is not None:
                    board.step(state["step"], result.loss, float(schedule.get_last_lr()[0]))
                seen_y.extend(batch.y.tolist())
                seen_p.extend(method.outputs(result.logits).cpu().numpy())
                yield Loss(state["step"], result.loss)
                yield Progress(state["step"], total, epoch)
                epoch_ends = state["batch"] >= len(batches) or state["step"] >= total  # saved below
                every = config.run.checkpoint_every
                if every and state["step"] % every == 0 and not epoch_ends:
                    saved_at = state["step"]
                    yield save()
            record: dict[str, Any] = {"epoch": epoch, "step": state["step"]}
            train_metrics = endpoint_metrics(endpoint, np.array(seen_y), np.array(seen_p))
            record["train"] = train_metrics
            yield Metrics(epoch, "train", train_metrics)
            if val_ds is not None:
                preds = predict_dataset(method, val_ds, repeats=config.data.inference_repeats)
                val_metrics = endpoint_metrics(endpoint, preds.labels, preds.probs)
                record["val"] = val_metrics
                yield Metrics(epoch, "val", val_metrics)
            if board is not None:
                board.epoch(record, method, val_ds)
            history.append(record)
            if state["batch"] >= len(batches):
                state["epoch"] += 1
                state["batch"] = 0
            saved_at = state["step"]
            yield save()
    except GeneratorExit:
        if state["step"] != saved_at:
            save()
        raise
    finally:
        loader.close()
        loss_log.close()
        if board is not None:
            board.close()
        slides.close()
        ranks.close()
    test = None
    if test_ds is not None:
        # every tile, as `bigslide predict` reads a slide: the figure a user reproduces from the CLI
        preds = predict_dataset(method, test_ds, repeats=0)
        test = endpoint_metrics(endpoint, preds.labels, preds.probs)
        if endpoint.task == "survival" and ranks.is_main and len(preds.labels) >= 2:
            from bigslide.explain.survival import km_plot, risk_groups

            labels = np.asarray(preds.labels, dtype=float)  # (time, event, interval) per case
            km_plot(risk_groups(labels[:, 0], labels[:, 1], endpoint.risk(preds.probs)), out / "km.png")
        yield Metrics(state["epoch"], "test", test)
    if ranks.is_main:
        records = history + ([{"test": test}] if test is not None else [])
        atomic_write_text(out / "metrics.json", json.dumps(records, indent=2))
    return RunResult(out, ckpt if ckpt.is_file() else None, history, state["step"], method, test)


def _predicts(endpoint: Endpoint) -> str:
    if endpoint.task == "classification":
        return f"classes {endpoint.classes}"
    if endpoint.task == "regression":
        return f"regression (target mean {endpoint.mean:.3g}, sd {endpoint.sd:.3g})"
    if endpoint.survival_loss == "cox":
        return "survival (Cox partial likelihood)"
    return (
        f"survival ({len(endpoint.bins) + 1} time intervals, cut at {[round(b, 3) for b in endpoint.bins]})"
    )


def out_of_memory(config: TrainConfig, method: Method, step: int, ckpt: Path) -> str:
    """Name the settings that bound this method's memory, with smaller values to try."""
    knobs = method.memory_knobs(dataclasses.asdict(config.data))
    tries = ", ".join(f"{key}={_half(value)} (now {value})" for key, value in knobs.items() if value)
    kept = f"; the last good checkpoint is {ckpt}" if ckpt.is_file() else ""
    amp = " or run.amp=bf16" if config.run.amp == "none" else ""
    return f"out of memory at step {step} ({method.name} on {method.device}): try {tries}{amp}{kept}"


def _half(value: float) -> float:
    return max(1, int(value) // 2) if isinstance(value, int) else value / 2


def run_to_end(gen: Generator[Event, None, RunResult]) -> RunResult:
    """Drive a run without looking at its events (tests, scripts)."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value
