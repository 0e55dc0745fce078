"""The training run: a generator of events that returns a `RunResult`.

The CLI prints the events; the napari plugin runs the same generator in a worker thread. Closing the
generator (GUI Stop, Ctrl-C in the CLI) saves a checkpoint, so a stopped run can be resumed exactly.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from pathlib import Path

import numpy as np

from bigslide.data.loader import BatchLoader
from bigslide.data.processes import DecodeProcesses
from bigslide.data.slides import SlideCache
from bigslide.data.sources import planned_endpoint
from bigslide.data.tile_cache import tile_cache_for
from bigslide.engine import setup
from bigslide.engine.advice import predicts
from bigslide.engine.checkpoint import (
    seed_everything,
)
from bigslide.engine.config import TrainConfig, check_backbone_name
from bigslide.engine.decision import Decision
from bigslide.engine.distributed import from_environment
from bigslide.engine.events import Event, Message
from bigslide.engine.features import attach_feature_store
from bigslide.engine.logfile import LossLog
from bigslide.engine.run import Run, RunResult
from bigslide.engine.tissue_report import write_tissue_check
from bigslide.errors import ConfigError
from bigslide.memory.stepper import OptimStepper
from bigslide.methods.base import get_method


def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    data: setup.RunData | None = None,
    processes: DecodeProcesses | None = None,
) -> Generator[Event, None, RunResult]:
    """Train `config.method` on the configured data (or on `data`); yields events at least once per batch.

    The run's slides are tiled, read, validated and mapped by one set of decode worker processes, started
    here (data.workers) and kept to the end, or `processes` shared with the caller (left running)."""
    check_backbone_name(config.model.backbone)  # set on the config after it was made
    own = processes is None and data is None
    if own:
        processes = setup.decode_processes(config.data)
    try:
        run = yield from _start(config, data, processes)
        try:
            resumed = resume and run.ckpt.is_file()
            if resumed:
                yield run.restore()
            elif resume:  # stopped before its first checkpoint, or another folder than meant
                yield Message(f"nothing to resume: {run.ckpt} does not exist; training from the start")
            run.open_logs(resumed)
            if not resumed and config.model.init_from:
                yield from run.validate_start()
            try:
                while run.state["epoch"] < config.optim.epochs and run.state["step"] < run.total:
                    yield from run.epoch()
            except GeneratorExit:  # stopped: keep what was trained since the last checkpoint
                if run.state["step"] != run.saved_at:
                    run.save()
                raise
            test = yield from run.score_test()  # the ranks share it: before their group closes
        finally:
            run.close()
    finally:
        if own and processes is not None:
            processes.close()
    return run.finish(test)


def _start(
    config: TrainConfig, data: setup.RunData | None, processes: DecodeProcesses | None
) -> Generator[Event, None, Run]:
    """Everything a run needs before its first batch: ranks, data, method, optimizer and schedule."""
    out = Path(config.run.out_dir).absolute()
    # written as a whole path, as data.csv is: the run's config.yaml replays (and resumes) the run from
    # any working folder
    config.run.out_dir = str(out)
    ranks = from_environment(config.run.device, timeout_s=config.run.dist_timeout)
    if ranks.is_main:
        out.mkdir(parents=True, exist_ok=True)
        config.to_yaml(out / "config.yaml")
    seed_everything(config.run.seed, deterministic=config.run.deterministic)
    device = ranks.device or setup.resolve_device(config.run.device)

    if ranks.active and config.data.skip_bad_slides:
        raise ConfigError(
            "data.skip_bad_slides: not with several ranks (a rank that leaves a batch out would wait for the "
            "others' gradients for ever); fix or drop the slide, or train on one rank"
        )
    # the model first: a backbone the configuration cannot build (a typo, a hub model not in the cache)
    # is said before a large cohort is tiled, not after
    planned = data.endpoint if data is not None else planned_endpoint(config.data, config.run.seed)
    method = setup.build_method(config, planned, device) if planned is not None else None
    tiles = tile_cache_for(config.data.tile_cache, out)
    slides = SlideCache(slide_mpp=config.data.slide_mpp, tiles=tiles, workers=processes)
    data = data or setup.build_data(config, get_method(config.method.name).kind, slides)
    for dataset in (data.train, data.val, data.test):
        for path, why in getattr(dataset, "left_out", {}).items():
            yield Message(f"left out (data.skip_bad_slides): {why}", left_out=(path,))
    if tiles is not None and tiles.hits + tiles.misses:
        yield Message(f"tile grids: {tiles.hits} from {tiles.folder}, {tiles.misses} made and kept there")
    endpoint = data.endpoint
    assert endpoint is not None  # RunData fills it in
    if method is None or endpoint != planned:  # UltraMNIST's classes; a table edited while it was read
        method = setup.build_method(config, endpoint, device)
    if (started := setup.init_from_checkpoint(config, method, endpoint)) is not None:
        yield Message(started)
    batch_size = method.batch_size(config.data.batch_size)
    if endpoint.survival_loss == "cox" and endpoint.task == "survival" and batch_size < 2:
        raise ConfigError(
            f"data.survival_loss: cox compares the bags of a batch, and {method.name} takes one bag per "
            "step; use data.survival_loss: nll"
        )
    if config.data.features:
        yield from attach_feature_store(config, method, (data.train, data.val, data.test))
    if (taught := setup.annotations_taught(method, data.train)) is not None:
        yield Message(taught)
    ranks.broadcast_module(method.model)
    # every rank validates and scores its share of the slides; rank 0 gathers them, computes and saves
    val, test = data.val, data.test
    yield Message(
        f"{method.title()} on {device.type}: {len(data.train)} train / {len(val) if val is not None else 0} "
        f"val items, {predicts(endpoint)}"
    )
    if ranks.is_main:  # what was kept as tissue and what was left out, slide by slide
        yield from write_tissue_check((data.train, data.val, data.test), config.data, slides, out)

    batches_per_epoch = math.ceil(len(ranks.shard(np.arange(len(data.train)))) / batch_size)
    total = config.optim.epochs * batches_per_epoch
    if config.optim.max_steps:
        total = min(total, config.optim.max_steps)
    optimizer = setup.build_optimizer(config, method)
    stepper = OptimStepper(
        optimizer,
        grad_clip=config.optim.grad_clip,
        amp=None if config.run.amp == "none" else config.run.amp,
        device=device,
        accumulate=config.optim.accumulate,
        grad_sync=ranks.average_gradients if ranks.active else None,
    )
    return Run(
        config=config,
        ranks=ranks,
        slides=slides,
        data=data,
        endpoint=endpoint,
        method=method,
        val=val,
        test=test,
        batch_size=batch_size,
        total=total,
        optimizer=optimizer,
        schedule=setup.build_schedule(config, optimizer, total),
        stepper=stepper,
        loader=BatchLoader(
            data.train,
            workers=config.data.workers,
            prefetch=config.data.prefetch,
            skip_bad=config.data.skip_bad_slides,
            processes=processes,
        ),
        loss_log=LossLog(out / "losses.csv"),
        decision=Decision.from_state(None, len(data.classes)),
    )


def run_to_end(gen: Generator[Event, None, RunResult]) -> RunResult:
    """Drive a run without looking at its events (tests, scripts)."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value
