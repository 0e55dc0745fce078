"""Print a training run's events: a tqdm progress bar with the loss, and metric lines.

Ctrl-C or SIGTERM asks the run to stop at the next step boundary: the generator is then closed, which
saves a checkpoint of the completed steps. A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from types import FrameType

from tqdm import tqdm

from bigslide.engine.events import CheckpointSaved, Event, Loss, Message, Metrics, Progress
from bigslide.engine.loop import RunResult


def _fmt(values: dict[str, float]) -> str:
    return "  ".join(f"{k}={v:.3f}" for k, v in values.items())


@contextmanager
def stop_requests() -> Iterator[threading.Event]:
    """While active, the first SIGINT/SIGTERM sets the returned event instead of interrupting."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def ask(signum: int, frame: FrameType | None) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()
        tqdm.write("stopping after this step (Ctrl-C again to interrupt at once)")

    previous = {s: signal.signal(s, ask) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_with_progress(gen: Generator[Event, None, RunResult], *, quiet: bool = False) -> RunResult:
    with stop_requests() as stop:
        return _drive(gen, stop, quiet=quiet)


def _drive(gen: Generator[Event, None, RunResult], stop: threading.Event, *, quiet: bool) -> RunResult:
    bar: tqdm | None = None
    try:
        while True:
            if stop.is_set():
                raise KeyboardInterrupt
            try:
                event = next(gen)
            except StopIteration as stop_iteration:
                return stop_iteration.value
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
