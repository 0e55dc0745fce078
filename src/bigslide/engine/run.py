"""A training run between batches (`Run`): what it holds (data, method, optimizer, schedule, logs) and
the steps that move it on (an epoch, validation, a checkpoint, the test split); and what a finished run
returns (`RunResult`). `bigslide.engine.loop.train` starts one and drives it."""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigslide.data.bags import BagDataset, item_slides
from bigslide.data.endpoint import Endpoint
from bigslide.data.loader import BatchLoader
from bigslide.data.sample import Batch, Sample, collate
from bigslide.data.slides import SlideCache
from bigslide.data.stain_norm import StainFit
from bigslide.engine import setup
from bigslide.engine.advice import out_of_memory
from bigslide.engine.board import RunBoard, shows_heatmaps
from bigslide.engine.checkpoint import (
    RESUME_KEYS,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from bigslide.engine.config import TrainConfig
from bigslide.engine.decision import Decision, choose_threshold
from bigslide.engine.distributed import DistContext, EpochOutputs
from bigslide.engine.events import CheckpointSaved, Event, Loss, Message, Metrics, Progress
from bigslide.engine.inference import DatasetPredictions, predict_dataset, preview_maps
from bigslide.engine.logfile import LossLog
from bigslide.engine.metrics import endpoint_metrics
from bigslide.engine.run_folder import LAST
from bigslide.errors import DataError, SlideError, TrainingError
from bigslide.explain.heatmap import ScoreGrid
from bigslide.files import atomic_write_text
from bigslide.memory.stepper import OptimStepper
from bigslide.methods.base import Method, StepResult
from bigslide.nn.hub_models import hub_recipe

NEXT_EPOCH_AHEAD = 2
"""Batches of the next epoch read while an epoch validates."""
BOARD_BAG_SHARE, BOARD_MIN_TILES = 4, 64
"""The board's per-epoch heatmap reads 1/BOARD_BAG_SHARE of a bag's tiles, at least BOARD_MIN_TILES (when
validation samples bags)."""


@dataclass
class RunResult:
    out_dir: Path
    checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    method: Method | None = None  # the trained method (its modules are `method.model`)
    test: dict[str, float] | None = None  # metrics on the table's test split, after training
    # validation of the weights a run started from (model.init_from), before its first step
    start_val: dict[str, float] | None = None


def checkpoint_path(config: TrainConfig) -> Path:
    return Path(config.run.out_dir) / LAST


@dataclass
class Run:
    """A training run between batches: what it holds, and the steps that move it on."""

    config: TrainConfig
    ranks: DistContext
    slides: SlideCache
    data: setup.RunData
    endpoint: Endpoint
    method: Method
    val: setup.TrainData | None
    test: setup.TrainData | None
    batch_size: int
    total: int  # optimizer steps of the whole run
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    stepper: OptimStepper
    loader: BatchLoader
    loss_log: LossLog
    board: RunBoard | None = None
    state: dict[str, int] = field(default_factory=lambda: {"epoch": 0, "batch": 0, "step": 0})
    decision: Decision = field(default_factory=Decision)  # chosen on the last validation (two classes)
    history: list[dict[str, Any]] = field(default_factory=list)
    saved_at: int = -1  # the step of the last checkpoint
    start_val: dict[str, float] | None = None  # `validate_start`'s metrics
    reported: set[int] = field(default_factory=set)  # bad training items already named in a message
    reported_eval: set[tuple[str, str]] = field(default_factory=set)  # (split, why) of those not predicted
    # survival: the last epoch's predicted risks of the validation cases (else of the training bags), the
    # scale a prediction's risk is read against (its percentile among them): {"split": ..., "risks": [...]}
    risk_reference: dict[str, Any] | None = None
    planned: int = -1  # the epoch whose batches the loader reads ahead

    @property
    def out(self) -> Path:
        return Path(self.config.run.out_dir)

    @property
    def ckpt(self) -> Path:
        return checkpoint_path(self.config)

    def restore(self) -> Message:
        """Continue exactly where the last checkpoint left off: weights, optimizer, position and RNGs."""
        saved = load_checkpoint(self.ckpt, require=RESUME_KEYS)
        self.method.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.schedule.load_state_dict(saved["schedule"])
        self.stepper.load_state_dict(saved["stepper"])
        self.state = dict(saved["position"])
        self.saved_at = self.state["step"]
        self.history = list(saved.get("history", []))
        set_rng_state(saved["rng"])
        if saved.get("stain"):
            self.method.stain_reference = StainFit.from_state(saved["stain"])
        self.risk_reference = saved.get("risk_reference")
        self.decision = Decision.from_state(saved.get("decision"), len(self.data.classes))
        epoch, batch, step = self.state["epoch"], self.state["batch"], self.state["step"]
        if batch:
            where = f"in epoch {epoch + 1}, after {batch} of its batches"
        else:
            where = f"after epoch {epoch}" if epoch else "before its first step"
        text = f"resumed from {self.ckpt} {where}"
        if step >= self.total:  # a rerun of a finished run, or of one whose step cap was reached
            limit, epochs = self.config.optim.max_steps, self.config.optim.epochs
            text += (
                f"; nothing left to train: optim.max_steps {limit} reached (raise it with --max-steps)"
                if limit and limit <= step
                else f"; nothing left to train: all {epochs} epochs done (raise optim.epochs with --epochs)"
            )
        return Message(text)

    def open_logs(self, resumed: bool) -> None:
        if not self.ranks.is_main:
            return
        self.loss_log.start(resume_step=self.state["step"] if resumed else None)
        if self.config.run.tensorboard:
            self.board = RunBoard(self.out, resume_step=self.state["step"] if resumed else None)

    def save(self) -> CheckpointSaved:
        if not self.ranks.is_main:
            return CheckpointSaved(str(self.ckpt), self.state["step"])
        method = self.method
        payload = {
            "config": self.config.to_dict(),
            "classes": self.data.classes,
            "endpoint": self.endpoint.state(),
            "method": method.name,
            "model": method.model.state_dict(),
            # how a hub encoder is built again without the hub (None for every other backbone): the
            # description it was built from, else the hub cache's
            "encoder": method.spec.recipe or hub_recipe(self.config.model.backbone),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "stepper": self.stepper.state_dict(),
            "position": dict(self.state),
            "history": self.history,
            "rng": rng_state(),
            # what slides are normalised to, so prediction maps them as training did
            "stain": method.stain_reference.state() if method.stain_reference is not None else None,
            "risk_reference": self.risk_reference,
            # the threshold prediction calls a slide's class with (two classes)
            "decision": self.decision.state() if self.endpoint.task == "classification" else None,
        }
        self.saved_at = self.state["step"]
        return CheckpointSaved(str(save_checkpoint(payload, self.ckpt)), self.state["step"])

    def epoch(self) -> Generator[Event, None, None]:
        """Train the rest of the current epoch, then score it, validate and save."""
        config, state, method = self.config, self.state, self.method
        epoch = state["epoch"]
        batches = self.batches(epoch)
        if self.planned != epoch:  # else its first batches were read while the last epoch validated
            self.data.train.set_epoch(epoch)
            self.loader.plan(batches[state["batch"] : state["batch"] + self.total - state["step"]])
        seen = EpochOutputs()  # the epoch's training outputs, each rank's (torchrun) scored together
        while state["batch"] < len(batches) and state["step"] < self.total:
            samples = self.take(batches[state["batch"]])
            for i in sorted(set(self.loader.bad) - self.reported):
                self.reported.add(i)
                yield Message(
                    f"left out of training (data.skip_bad_slides): {self.loader.bad[i]}",
                    left_out=item_slides(self.data.train, i),
                )
            if not samples:  # every item of the batch is a bad slide, left out
                state["batch"] += 1
                continue
            items = [i for i in batches[state["batch"]] if i not in self.loader.bad]
            batch = collate(samples, method.device, uint8=method.takes_uint8)
            loss = self.step(batch)
            seen.add(items, batch.y.tolist(), method.outputs(loss.logits).cpu().numpy())
            yield Loss(state["step"], loss.loss)
            yield Progress(state["step"], self.total, epoch)
            epoch_ends = state["batch"] >= len(batches) or state["step"] >= self.total  # saved below
            every = config.run.checkpoint_every
            if every and state["step"] % every == 0 and not epoch_ends:
                yield self.save()
        if state["batch"] >= len(batches) and epoch + 1 < config.optim.epochs and state["step"] < self.total:
            # the next epoch's first bags are read while this one validates, so its first step does not
            # wait; only a few, so validation's reads do not queue behind a whole read-ahead
            self.data.train.set_epoch(epoch + 1)
            self.loader.plan(self.batches(epoch + 1)[: self.total - state["step"]], ahead=NEXT_EPOCH_AHEAD)
            self.planned = epoch + 1
        record: dict[str, Any] = {"epoch": epoch, "step": state["step"]}
        targets, outputs = seen.everyone(self.ranks)
        record["train"] = endpoint_metrics(self.endpoint, targets, outputs)
        yield Metrics(epoch, "train", record["train"])
        split = "train"
        repeats, val = config.data.inference_repeats, self.val
        # the board's heatmap is validation's own read of the first slide when that reads every tile
        sampled = isinstance(val, BagDataset) and repeats > 0 and val.bag_size > 0
        drawn = self.board is not None and shows_heatmaps(val) and not sampled
        preds = self.predict_shared(val, repeats, "validating", first_map=drawn)
        yield from self.left_out(preds, self.val, "validation")
        if preds is not None and len(preds.labels):
            record["val"] = endpoint_metrics(self.endpoint, preds.labels, preds.probs)
            outputs, split = preds.probs, "validation"
            if self.endpoint.task == "classification":
                self.decision = choose_threshold(preds.labels, preds.probs, epoch=epoch)
                if self.decision.source == "validation":
                    record["val"]["chosen_threshold"] = self.decision.threshold
            yield Metrics(epoch, "val", record["val"])
        if self.endpoint.task == "survival" and len(outputs):
            self.risk_reference = {"split": split, "risks": [float(r) for r in self.endpoint.risk(outputs)]}
        if self.board is not None:
            self.board.epoch(record, self.board_maps(preds), val)
        self.history.append(record)
        if state["batch"] >= len(batches):
            state["epoch"] += 1
            state["batch"] = 0
        yield self.save()

    def board_maps(self, preds: DatasetPredictions | None) -> dict[str, dict[str, ScoreGrid]] | None:
        """The first validation slide's maps for the board: validation's, when it read every tile; else a
        lattice over the whole slide of a quarter of a bag's tiles (a sampled bag alone shows scattered
        dots), read now."""
        if preds is not None and preds.grids:
            return preds.grids[0]
        val = self.val
        if isinstance(val, BagDataset) and len(val) and val.bag_size > 0:
            return preview_maps(self.method, val, 0, max(BOARD_MIN_TILES, val.bag_size // BOARD_BAG_SHARE))
        return None

    def validate_start(self) -> Generator[Event, None, None]:
        """Validate the weights the run starts from (a checkpoint's, model.init_from): what its training
        then changes on the same validation slides is read against this."""
        preds = self.predict_shared(self.val, self.config.data.inference_repeats, "validating")
        yield from self.left_out(preds, self.val, "validation")
        if preds is None or not len(preds.labels):
            return
        self.start_val = endpoint_metrics(self.endpoint, preds.labels, preds.probs)
        shown = ", ".join(f"{k} {v:.3f}" for k, v in self.start_val.items() if math.isfinite(v))
        yield Message(f"validation of the starting weights: {shown}")

    def predict_shared(
        self, dataset: setup.TrainData | None, repeats: int, what: str, *, first_map: bool = False
    ) -> DatasetPredictions | None:
        """Every item of `dataset` predicted, each rank its share (`DistContext.share`): all of them, in
        order, on rank 0 (what one process predicts); None on the other ranks, or without a dataset.
        `first_map`: the first item's heatmaps too, from the same read (`grids[0]`, on rank 0). A slide
        that cannot be read is left out with data.skip_bad_slides (named in `left_out`), else stops the run
        as `take` does."""
        if dataset is None:
            return None
        mine = [int(i) for i in self.ranks.share(len(dataset))]
        drawn = [0] if first_map and self.ranks.is_main else []
        try:
            preds = predict_dataset(
                self.method,
                dataset,
                repeats=repeats,
                items=mine,
                with_grids=drawn,
                skip_bad=self.config.data.skip_bad_slides,
            )
        except (SlideError, DataError) as err:
            raise self.stopped(err, what) from None
        if not self.ranks.active:
            return preds
        parts = self.ranks.gather((mine, preds.labels, preds.probs), f"{what} (gathering the predictions)")
        if parts is None:  # not rank 0
            return None
        order = np.concatenate([items for items, _labels, _probs in parts])
        at = np.argsort(order, kind="stable")
        labels = np.concatenate([np.asarray(lab) for _items, lab, _probs in parts if len(lab)])[at]
        probs = np.concatenate([np.asarray(pr) for _items, _labels, pr in parts if len(pr)])[at]
        return DatasetPredictions(labels, probs, preds.grids[:1])  # rank 0's first item is the first

    def left_out(self, preds: DatasetPredictions | None, dataset: Any, split: str) -> Iterator[Message]:
        """A message for each slide of `split` (read from `dataset`) left out (data.skip_bad_slides), once
        per run."""
        for i, why in {} if preds is None else preds.left_out.items():
            if (split, why) not in self.reported_eval:
                self.reported_eval.add((split, why))
                yield Message(f"left out of {split} (data.skip_bad_slides): {why}", item_slides(dataset, i))

    def batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's batches of training items (this rank's share), in the order they are trained."""
        n = len(self.data.train)
        order = self.ranks.shard(np.random.default_rng([self.config.run.seed, epoch]).permutation(n))
        return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    def take(self, batch: np.ndarray) -> list[Sample]:
        """The batch's samples; a slide that cannot be read stops the run, named, after saving what was
        trained since the last checkpoint (the batches before it are trained; resuming starts at it)."""
        try:
            return self.loader.take(batch)
        except (SlideError, DataError) as err:
            raise self.stopped(err, "training") from None

    def stopped(self, err: SlideError | DataError, what: str) -> SlideError | DataError:
        """`err` (a slide that cannot be read) as the error that stops the run, after saving what was
        trained since the last checkpoint, and naming it (resuming trains on, or validates again, from it)."""
        state = self.state
        if state["step"] and state["step"] != self.saved_at:
            self.save()
        kept = (
            f"its last checkpoint is {self.ckpt} (step {self.saved_at})"
            if self.saved_at >= 0
            else "no checkpoint was saved"
        )
        if what != "training" and self.history:  # the epochs' metrics so far are kept too
            self.write_metrics(None)
        return type(err)(
            f"{err}; the run stopped while {what} at step {state['step']} (epoch {state['epoch']}): {kept}. "
            "Set data.skip_bad_slides: true to leave such slides out and go on (resume keeps the steps done)"
        )

    def step(self, batch: Batch) -> StepResult:
        """One training batch: forward, backward, and an optimizer step when one is due."""
        method, state = self.method, self.state
        if not method.takes_uint8 and (colour := method.colour(batch.samples)) is not None:
            batch.x = colour(batch.x)  # floats on the host already: the stain maps go there
        method.model.train()
        try:
            result = method.train_step(batch, self.stepper)
        except torch.OutOfMemoryError:
            raise TrainingError(out_of_memory(self.config, method, state["step"] + 1, self.ckpt)) from None
        if not math.isfinite(result.loss):
            where = f"; the last good checkpoint is {self.ckpt}" if self.ckpt.is_file() else ""
            raise TrainingError(
                f"loss became {result.loss} at step {state['step'] + 1} (epoch {state['epoch']}){where}. "
                "Lower optim.lr, set optim.grad_clip, or turn off run.amp."
            )
        with warnings.catch_warnings():
            # with accumulation the first batches do not step the optimizer yet; that is intended
            warnings.filterwarnings("ignore", re.escape("Detected call of `lr_scheduler.step()`"))
            self.schedule.step()
        state["batch"] += 1
        state["step"] += 1
        self.loss_log.write(state["step"], state["epoch"], result.loss)
        if self.board is not None:
            self.board.step(state["step"], result.loss, float(self.schedule.get_last_lr()[0]))
        return result

    def close(self) -> None:
        self.loader.close()
        self.loss_log.close()
        if self.board is not None:
            self.board.close()
        self.slides.close()
        self.ranks.close()

    def score_test(self) -> Generator[Event, None, dict[str, float] | None]:
        """The table's test split, with every tile as `bigslide predict` reads a slide (the figure a user
        reproduces from the CLI); a survival run also draws its Kaplan-Meier plot."""
        preds = self.predict_shared(self.test, 0, "scoring the test split")
        yield from self.left_out(preds, self.test, "the test split")
        if preds is None or not len(preds.labels):
            return None
        decision = self.decision if self.endpoint.task == "classification" else None
        test = endpoint_metrics(self.endpoint, preds.labels, preds.probs, decision)
        if decision is not None:
            yield Message(f"test split: {decision.describe(self.endpoint.classes)}")
        if self.endpoint.task == "survival" and self.ranks.is_main and len(preds.labels) >= 2:
            from bigslide.explain.survival import km_plot, risk_groups

            labels = np.asarray(preds.labels, dtype=float)  # (time, event, interval) per case
            groups = risk_groups(labels[:, 0], labels[:, 1], self.endpoint.risk(preds.probs))
            km_plot(groups, self.out / "km.png")
        yield Metrics(self.state["epoch"], "test", test)
        return test

    def write_metrics(self, test: dict[str, float] | None) -> None:
        """metrics.json: each epoch's record, and the test split's (on rank 0)."""
        if self.ranks.is_main:
            records = self.history + ([{"test": test}] if test is not None else [])
            atomic_write_text(self.out / "metrics.json", json.dumps(records, indent=2))

    def finish(self, test: dict[str, float] | None) -> RunResult:
        self.write_metrics(test)
        ckpt = self.ckpt if self.ckpt.is_file() else None
        return RunResult(self.out, ckpt, self.history, self.state["step"], self.method, test, self.start_val)
