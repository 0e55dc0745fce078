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

from bigslide.data.loader import BatchLoader
from bigslide.data.sample import Batch, Sample, as_float
from bigslide.data.slides import SlideCache
from bigslide.engine import setup
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
from bigslide.engine.inference import predict_dataset
from bigslide.engine.logfile import LossLog
from bigslide.engine.metrics import classification_metrics
from bigslide.errors import TrainingError
from bigslide.memory.stepper import OptimStepper
from bigslide.methods.base import Method, get_method


@dataclass
class RunResult:
    out_dir: Path
    checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    method: Method | None = None  # the trained method (its modules are `method.model`)


def collate(samples: list[Sample], device: torch.device, *, uint8: bool = True) -> Batch:
    """`uint8=False`: pixels as floats in [0, 1] (for methods that do not scale them themselves)."""
    x = torch.stack([s.x for s in samples]) if len(samples) > 1 else samples[0].x
    if not uint8:
        x = as_float(x)
    if samples[0].coords is None and x.ndim == 3:  # one image: add the batch axis
        x = x.unsqueeze(0)
    y = torch.tensor([s.y for s in samples], dtype=torch.long)
    # Inputs stay in host memory: methods move what they need (Big-Layer never moves a whole bag).
    if device.type == "cuda":
        x = x.pin_memory()
    return Batch(x=x, y=y.to(device), samples=samples)


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
    train_ds, val_ds = data.train, data.val
    loader = BatchLoader(train_ds, workers=config.data.workers, prefetch=config.data.prefetch)
    method = setup.build_method(config, data.classes, device)
    ranks.broadcast_module(method.model)
    if not ranks.is_main:
        val_ds = None  # rank 0 validates and saves; the others only train
    n_val = len(val_ds) if val_ds is not None else 0
    yield Message(
        f"{method.name} on {device.type}: {len(train_ds)} train / {n_val} val items, classes {data.classes}"
    )

    batch_size = method.batch_size(config.data.batch_size)
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
        yield Message(f"resumed from {ckpt} at epoch {state['epoch']}, batch {state['batch']}")
    loss_log = LossLog(out / "losses.csv")
    if ranks.is_main:
        loss_log.start(resume_step=state["step"] if resumed else None)

    def save() -> CheckpointSaved:
        if not ranks.is_main:
            return CheckpointSaved(str(ckpt), state["step"])
        payload = {
            "config": config.to_dict(),
            "classes": data.classes,
            "method": method.name,
            "model": method.model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "stepper": stepper.state_dict(),
            "position": dict(state),
            "history": history,
            "rng": rng_state(),
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
            seen_y: list[int] = []
            seen_p: list[np.ndarray] = []
            while state["batch"] < len(batches) and state["step"] < total:
                batch = collate(loader.take(batches[state["batch"]]), device, uint8=method.takes_uint8)
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
                seen_y.extend(batch.y.tolist())
                seen_p.extend(torch.softmax(result.logits.float(), dim=1).cpu().numpy())
                yield Loss(state["step"], result.loss)
                yield Progress(state["step"], total, epoch)
                epoch_ends = state["batch"] >= len(batches) or state["step"] >= total  # saved below
                every = config.run.checkpoint_every
                if every and state["step"] % every == 0 and not epoch_ends:
                    saved_at = state["step"]
                    yield save()
            record: dict[str, Any] = {"epoch": epoch, "step": state["step"]}
            train_metrics = classification_metrics(np.array(seen_y), np.array(seen_p))
            record["train"] = train_metrics
            yield Metrics(epoch, "train", train_metrics)
            if val_ds is not None:
                preds = predict_dataset(method, val_ds, repeats=config.data.inference_repeats)
                val_metrics = classification_metrics(preds.labels, preds.probs)
                record["val"] = val_metrics
                yield Metrics(epoch, "val", val_metrics)
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
        slides.close()
        ranks.close()
    if ranks.is_main:
        (out / "metrics.json").write_text(json.dumps(history, indent=2))
    return RunResult(out, ckpt if ckpt.is_file() else None, history, state["step"], method)


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
