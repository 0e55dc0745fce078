"""What a decode worker process runs: read squares of slides into the shared buffers the parent sends,
and whatever else decodes a slide's pixels (its tile grid, tissue mask, tissue-check thumbnail).

A worker takes tasks from its pipe until None comes (or the pipe or the parent goes). A read names a
shared buffer (sent once, then held by number), a slide and the squares to read into it, and is answered
with None or the error raised; a call names a function, which gets the worker's own `SlideCache` (its
open slides, `process_slides`) and the task's arguments, and is answered with its result (`Returned`) or
the error raised. The worker ignores Ctrl-C, drops the signal handlers it inherits, runs at a lower
priority than the training process, and exits on its own when the parent dies, even by SIGKILL.
"""

from __future__ import annotations

import math
import os
import select
import signal
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from bigslide.data.decode import read_squares
from bigslide.data.slides import process_slides
from bigslide.errors import DataError
from bigslide.wsi.resolution import ReadPlan

# In a worker process: the shared buffers it was given, by number (holding one keeps it mapped: torch finds
# it again when the buffer next comes). Its slides are `process_slides`: the least recently read is closed
# beyond `open_slides_limit()`, so a cohort read once slide by slide keeps a worker's open files bounded.
_BUFFERS: dict[int, torch.Tensor] = {}
WORKER_NICENESS = 10  # the training process comes first; decoding fills the time it leaves


class Unreceived(Exception):  # noqa: N818 - an answer, not an error of the worker's own
    """A worker's answer when the task did not arrive whole (its buffer's descriptor did not come)."""


class Returned(NamedTuple):
    """A call's answer: what the function returned (an exception it returns is a value, not an error)."""

    value: Any


def serve(conn: Connection, parent: int) -> None:
    """A worker's life: tasks from its pipe until None comes, or the pipe or the parent goes."""
    _start_worker(parent)
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        answer: BaseException | Returned | None = None
        try:
            task = ForkingPickler.loads(message)
        except Exception as err:  # a new buffer comes as a file descriptor, through a socket of its own
            answer = Unreceived(f"{type(err).__name__}: {err}")
        else:
            if task is None:
                return
            try:
                answer = _do(task)
            except Exception as err:  # the parent raises it in the reading thread
                answer = err
        try:
            conn.send(answer)
        except Exception:  # an error or a result that does not pickle: its text does
            conn.send(DataError(f"{type(answer).__name__}: {answer}"))


def _start_worker(parent: int) -> None:
    # On a CPU run the step's threads use every core: a worker at the same priority preempts one of them,
    # and the others wait for it at their next synchronisation (a loader-fed step took 1.13x the in-memory
    # step on two cores; the decode alone is 5 % of it). Where cores are free, niceness changes nothing.
    os.nice(WORKER_NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's graceful-stop handler is not ours
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    torch.set_num_threads(1)  # the worker decodes; a forked copy of the parent's thread pool would compete


def _exit_with(parent: int) -> None:
    # A worker waits on a pipe that its own copy keeps open, so it would outlive a killed parent (and hold
    # the parent's stdout open). A fork server's children keep the server alive, so neither would exit.
    # poll, not select: a process with more than 1,024 open files gets descriptors select cannot take.
    try:
        watch = select.poll()
        watch.register(os.pidfd_open(parent), select.POLLIN)  # readable once the parent has exited
        watch.poll()
    except (AttributeError, OSError):  # no pidfd (not Linux): the parent is gone or we were re-parented
        started_by = os.getppid()
        while os.getppid() == started_by and _alive(parent):
            time.sleep(0.5)
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _do(task: tuple[Any, ...]) -> Returned | None:
    kind, *arguments = task
    if kind == "call":
        fn, args = arguments
        return Returned(fn(*args))
    _read(*arguments)
    return None


def _read(
    number: int,
    buffer: torch.Tensor | None,
    path: Path,
    slide_mpp: float | None,
    table_mpp: float | None,
    plan: ReadPlan,
    coords: np.ndarray,
    offset: int,
    total: int,
) -> None:
    """Squares `coords` into rows offset.. of the buffer viewed as `total` squares (a part of an item)."""
    if buffer is not None:  # a new buffer, or a grown one replacing its old one; else the one held
        _BUFFERS[number] = buffer
    buffer = _BUFFERS[number]
    shape = (total, plan.size, plan.size, 3)
    slides = process_slides(slide_mpp)
    slides.state({path: table_mpp})  # None: this run's table gives none (an earlier one may have)
    with slides.opened(path) as slide:
        read_squares(slide, plan, coords, into=_squares(buffer, shape)[offset : offset + len(coords)])


def _squares(buffer: torch.Tensor, shape: tuple[int, ...]) -> np.ndarray:
    """The front of a shared byte buffer viewed as channels-last squares of `shape` (N, H, W, 3)."""
    return buffer[: math.prod(shape)].numpy().reshape(shape)
