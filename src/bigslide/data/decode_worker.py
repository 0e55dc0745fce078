"""What a decode worker process runs: read squares of slides into the shared buffers the parent sends.

A worker takes tasks from its pipe until None comes (or the pipe or the parent goes): each names a shared
buffer (sent once, then held by number), a slide and the squares to read into it, and is answered with
None or the error raised. The worker ignores Ctrl-C, drops the signal handlers it inherits, runs at a lower
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

import numpy as np
import torch

from bigslide.data.decode import read_squares
from bigslide.data.slides import open_slides_limit, open_with_mpp
from bigslide.errors import DataError
from bigslide.resolution import ReadPlan
from bigslide.slide import Slide

# In a worker process: the slides it has opened, by (path, fallback mpp), least recently read first, and the
# shared buffers it was given, by number (holding one keeps it mapped: torch finds it again when the buffer
# next comes). A cohort reads hundreds of slides once each: beyond `open_slides_limit()` the oldest is
# closed, so a worker's open files stay bounded.
_OPEN: dict[tuple[Path, float | None], Slide] = {}
_BUFFERS: dict[int, torch.Tensor] = {}
WORKER_NICENESS = 10  # the training process comes first; decoding fills the time it leaves


class Unreceived(Exception):  # noqa: N818 - an answer, not an error of the worker's own
    """A worker's answer when the task did not arrive whole (its buffer's descriptor did not come)."""


def serve(conn: Connection, parent: int) -> None:
    """A worker's life: tasks from its pipe until None comes, or the pipe or the parent goes."""
    _start_worker(parent)
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        answer: BaseException | None = None
        try:
            task = ForkingPickler.loads(message)
        except Exception as err:  # a new buffer comes as a file descriptor, through a socket of its own
            answer = Unreceived(f"{type(err).__name__}: {err}")
        else:
            if task is None:
                return
            try:
                _read(*task)
            except Exception as err:  # the parent raises it in the reading thread
                answer = err
        try:
            conn.send(answer)
        except Exception:  # an error that does not pickle: its text does
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


def _read(
    number: int,
    buffer: torch.Tensor | None,
    path: Path,
    slide_mpp: float | None,
    plan: ReadPlan,
    coords: np.ndarray,
) -> None:
    if buffer is not None:  # a new buffer, or a grown one replacing its old one; else the one held
        _BUFFERS[number] = buffer
    buffer = _BUFFERS[number]
    key = (path, slide_mpp)
    slide = _OPEN.pop(key, None) or open_with_mpp(path, slide_mpp)
    _OPEN[key] = slide  # the most recently read goes last
    while len(_OPEN) > open_slides_limit():
        _OPEN.pop(next(iter(_OPEN))).close()
    shape = (len(coords), plan.size, plan.size, 3)
    read_squares(slide, plan, coords, into=_squares(buffer, shape))


def _squares(buffer: torch.Tensor, shape: tuple[int, ...]) -> np.ndarray:
    """The front of a shared byte buffer viewed as channels-last squares of `shape` (N, H, W, 3)."""
    return buffer[: math.prod(shape)].numpy().reshape(shape)
