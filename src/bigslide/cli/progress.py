"""Print a training run's events: a tqdm progress bar with the loss, and metric lines.

On a terminal the bar is redrawn in place. Where the output goes to a file or a pipe (a cluster job's log,
`nohup`, `| tee`), a bar redrawn with carriage returns becomes one endless line with the messages glued
into it: there a plain line is printed every LOG_EVERY_S seconds and at the end instead (`progress_bar`).

Ctrl-C or SIGTERM asks the run to stop at the next step boundary: the generator is then closed, which
saves a checkpoint of the completed steps. A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from types import FrameType

from tqdm import tqdm

from bigslide.engine.events import CheckpointSaved, Event, Loss, Message, Metrics, Progress
from bigslide.engine.loop import RunResult
from bigslide.engine.metric_words import why_missing

LOG_EVERY_S = 30.0
"""Seconds between progress lines in a log (output that is not a terminal)."""


class LogLines:
    """tqdm's `update` / `set_postfix` / `close` for a log: a line such as "120/600 batches (20%), 3.1
    batches/s, about 2 min 35 s left, loss=0.5123" when LOG_EVERY_S has passed since the last, and at the
    end."""

    def __init__(self, total: int, unit: str, *, disable: bool = False) -> None:
        self.total, self.unit, self.disable = total, unit, disable
        self.n = 0
        self._postfix = ""
        self._start = self._last = time.monotonic()
        self._logged = 0
        self._due = False

    def update(self, n: int = 1) -> None:
        if self._due:
            self._log()
        self.n += n
        # written once the step's figures are in (the loss, the tiles per second follow the count)
        self._due = time.monotonic() - self._last >= LOG_EVERY_S

    def set_postfix(self, **values: object) -> None:
        self.set_postfix_str(", ".join(f"{k}={v}" for k, v in values.items()))

    def set_postfix_str(self, text: str) -> None:
        self._postfix = text
        if self._due:
            self._log()

    def close(self) -> None:
        if self._due or self.n != self._logged:
            self._log()

    def _log(self) -> None:
        self._last = now = time.monotonic()
        self._logged, self._due = self.n, False
        if self.disable:
            return
        plural = self.unit + ("es" if self.unit.endswith(("ch", "s", "x")) else "s")
        parts = [
            f"{self.n}/{self.total} {plural}" + (f" ({100 * self.n / self.total:.0f}%)" if self.total else "")
        ]
        rate = self.n / (now - self._start) if now > self._start else 0.0
        if rate > 0:
            parts.append(f"{rate:.{1 if rate < 100 else 0}f} {self.unit}/s")
            if 0 < self.n < self.total:
                parts.append(f"about {_duration((self.total - self.n) / rate)} left")
        parts += [self._postfix] if self._postfix else []
        tqdm.write(", ".join(parts), file=sys.stderr)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{secs} s"


def progress_bar(total: int, unit: str, *, disable: bool = False) -> tqdm | LogLines:
    """A progress bar redrawn in place on a terminal, progress lines in a log (see the module's notes)."""
    if sys.stderr.isatty():
        return tqdm(total=total, unit=unit, dynamic_ncols=True, disable=disable)
    return LogLines(total, unit, disable=disable)


def _fmt(values: dict[str, float], split: str) -> str:
    """`key=value` for each figure; one that cannot be computed on `split` is named with the reason."""
    line = "  ".join(f"{k}={v:.3f}" for k, v in values.items() if math.isfinite(v))
    missing = [f"{k} left out: {why_missing(k, split)}" for k, v in values.items() if not math.isfinite(v)]
    return line + (f"  ({'; '.join(missing)})" if missing else "")


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
        again = "Ctrl-C again" if signum == signal.SIGINT else "a second SIGTERM"
        tqdm.write(f"stopping after this step ({again} to interrupt at once)")

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
    bar: tqdm | LogLines | None = None
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
                    bar = progress_bar(event.total, "batch")
                bar.update(event.step - bar.n)
            elif isinstance(event, Loss) and bar is not None:
                bar.set_postfix(loss=f"{event.value:.4f}")
            elif isinstance(event, Metrics):
                # epochs counted from 1, as the decision line and napari count them; the test split is
                # scored once, after the last
                when = "test" if event.split == "test" else f"epoch {event.epoch + 1} {event.split:5s}"
                tqdm.write(f"{when} {_fmt(event.values, event.split)}")
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
