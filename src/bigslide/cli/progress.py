"""Print a training run's events: a tqdm progress bar with the loss, and metric lines."""

from __future__ import annotations

from collections.abc import Generator

from tqdm import tqdm

from bigslide.engine.events import CheckpointSaved, Event, Loss, Message, Metrics, Progress
from bigslide.engine.loop import RunResult


def _fmt(values: dict[str, float]) -> str:
    return "  ".join(f"{k}={v:.3f}" for k, v in values.items())


def run_with_progress(gen: Generator[Event, None, RunResult], *, quiet: bool = False) -> RunResult:
    bar: tqdm | None = None
    try:
        while True:
            try:
                event = next(gen)
            except StopIteration as stop:
                return stop.value
            if quiet:
                continue
            if isinstance(event, Progress):
                if bar is None:
                    bar = tqdm(total=event.total, unit="batch", dynamic_ncols=True)
                bar.update(event.step - bar.n)
            elif isinstance(event, Loss) and bar is not None:
                bar.set_postfix(loss=f"{event.value:.4f}")
            elif isinstance(event, Metrics):
                tqdm.write(f"epoch {event.epoch} {event.split:5s} {_fmt(event.values)}")
            elif isinstance(event, CheckpointSaved):
                tqdm.write(f"checkpoint saved: {event.path} (step {event.step})")
            elif isinstance(event, Message):
                tqdm.write(event.text)
    except KeyboardInterrupt:
        gen.close()  # the run saves a checkpoint when closed
        raise
    finally:
        if bar is not None:
            bar.close()
