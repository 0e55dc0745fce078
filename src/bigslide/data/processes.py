"""Decode tiles in worker processes: the loader's way to use every core.

Threads decoding JPEG tiles share one interpreter, and on this project's own measurements two threads
gave 1.2x one thread's rate where two processes gave 1.8x (`bigslide bench io`). So the loader hands
each item's squares to a pool of forked processes: a process opens its own copy of the slide (the
parent's open files share their offsets and locks with a forked child), decodes every file tile the item
touches once (`read_squares`), and writes the squares into a shared buffer. The parent hands out a view
of that buffer, not a copy, and reuses the buffer once nothing refers to the view any more (a weak
reference to the array every handed-out view derives from says so): a copy into fresh memory cost the
parent a page fault per 4 KiB and a pass over the bag, which on two cores took the time of a third of a
worker. Buffers are kept (one per item in flight or still held, grown to the largest item): fresh shared
memory would cost the workers the same faults. Worker processes ignore Ctrl-C (the parent catches it and
shuts the pool down), drop the signal handlers they inherit, and exit on their own when the parent dies,
even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import torch

from bigslide.data.decode import channels_first, read_squares
from bigslide.data.slides import SlideCache, open_with_mpp
from bigslide.errors import DataError
from bigslide.resolution import ReadPlan
from bigslide.slide import Slide

# How decode workers start: forked from this process (default), or from a server process
# (`fork_from_server`, for multi-threaded GUI processes).
_START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"

# In a worker process: the slides it has opened, by (path, fallback mpp), least recently read first, and the
# shared buffers it was given, by number (holding one keeps it mapped: torch finds it again when the buffer
# next comes). A cohort reads hundreds of slides once each: beyond MAX_OPEN_SLIDES the oldest is closed, so
# a worker's open files stay bounded.
_OPEN: dict[tuple[Path, float | None], Slide] = {}
MAX_OPEN_SLIDES = 32
_BUFFERS: dict[int, torch.Tensor] = {}


class DecodeProcesses:
    """`workers` processes reading squares of slides; `read` blocks the calling thread only.

    `buffers` reads may be under way at once (more wait): one more than `workers` keeps every worker
    busy while the parent hands an item over.
    """

    def __init__(self, workers: int, buffers: int | None = None) -> None:
        # fork: workers start in milliseconds and need no importable __main__ (scripts, notebooks)
        context = multiprocessing.get_context(_START_METHOD)
        self.workers = workers
        self._pool = ProcessPoolExecutor(
            workers, mp_context=context, initializer=_start_worker, initargs=(os.getpid(),)
        )
        # Fork every worker now, on the thread making the loader: forked later from an item thread, a worker
        # would copy the locks that other item threads hold at that instant held (e.g. a cached_property's
        # on Python 3.11, taken while opening a slide) and wait on them for ever.
        with main_script_left_alone():
            self._pool.submit(os.getpid).result()
        self._reads = threading.BoundedSemaphore(buffers or workers + 1)
        self._lock = threading.Lock()
        # by number: (buffer, the array last lent from it, alive while any view of it is)
        self._buffers: list[tuple[torch.Tensor, weakref.ref[np.ndarray] | None]] = []
        self._reading: set[int] = set()

    def read(self, path: Path, slide_mpp: float | None, plan: ReadPlan, coords: np.ndarray) -> np.ndarray:
        """`read_squares` of the slide at `path`, done in a worker process: a view of a shared buffer that
        is reused once nothing refers to it (keep a copy to hold the squares for long, e.g. in a cache)."""
        shape = (len(coords), plan.size, plan.size, 3)
        with self._reads:  # waits while `buffers` reads are under way
            number, buffer = self._lend(math.prod(shape))
            try:
                task = (number, buffer, Path(path), slide_mpp, plan, np.asarray(coords))
                self._pool.submit(_read, *task).result()
                lent = buffer.numpy()  # a new array object: every view handed out keeps it alive
                with self._lock:
                    self._buffers[number] = (buffer, weakref.ref(lent))
                return channels_first(lent[: math.prod(shape)].reshape(shape))
            except BrokenProcessPool:
                raise DataError(
                    f"{path}: a decode worker process died while reading {len(coords)} tiles "
                    "(out of memory, or a crash in the slide's decoder; "
                    "data.workers: 0 reads in this process)"
                ) from None
            finally:
                with self._lock:
                    self._reading.discard(number)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _lend(self, size: int) -> tuple[int, torch.Tensor]:
        """A buffer of at least `size` bytes that no read and no handed-out view uses: an idle one that
        fits, else an idle one grown, else a new one."""
        with self._lock:
            idle = [
                n
                for n, (_buffer, lent) in enumerate(self._buffers)
                if n not in self._reading and (lent is None or lent() is None)
            ]
            fits = [n for n in idle if self._buffers[n][0].numel() >= size]
            if fits:
                number = fits[0]
            else:
                number = idle[0] if idle else len(self._buffers)
                buffer = torch.empty(size, dtype=torch.uint8).share_memory_()
                entry: tuple[torch.Tensor, weakref.ref[np.ndarray] | None] = (buffer, None)
                if number == len(self._buffers):
                    self._buffers.append(entry)
                else:
                    self._buffers[number] = entry  # the worker drops the smaller one when this comes
            self._reading.add(number)
            return number, self._buffers[number][0]


Pool = Executor | DecodeProcesses | None


def read_slide_squares(
    slides: SlideCache, path: Path, plan: ReadPlan, coords: np.ndarray, pool: Pool = None
) -> np.ndarray:
    """`read_squares` of the slide at `path`: in worker processes, on threads, or on this thread."""
    if isinstance(pool, DecodeProcesses):
        return pool.read(path, slides.slide_mpp, plan, coords)
    return read_squares(slides.open(path), plan, coords, pool)


WORKER_NICENESS = 10  # the training process comes first; decoding fills the time it leaves


def fork_from_server() -> None:
    """Start decode workers from a small server process, and start that server now.

    For a multi-threaded GUI process (napari): forking it holds the interpreter lock while the kernel
    copies its page tables (60-120 ms of frozen viewer per worker on two cores, tests/gui/test_train.py)
    and copies locks that its other threads hold. The server imports this module once (torch with it)
    in the background, so the first run does not wait for it; it imports no `__main__`.
    """
    global _START_METHOD
    if "forkserver" not in multiprocessing.get_all_start_methods() or _START_METHOD == "forkserver":
        return
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload([__name__])
    forkserver.ensure_running()
    _START_METHOD = "forkserver"


@contextlib.contextmanager
def main_script_left_alone() -> Iterator[None]:
    """Start processes that do not run the parent's main script again.

    A process started from the fork server (or spawned) first imports the script the parent runs, as
    spawn does, so that functions defined there can be unpickled. A decode worker only runs this module's
    functions, and a script without an `if __name__ == "__main__":` guard (a napari script that opens a
    viewer and trains) would run again in every worker. Python imports it only when the main module has a
    file: while the workers start, it has none.
    """
    main = sys.modules.get("__main__")
    by_path = main is not None and getattr(main, "__spec__", None) is None and hasattr(main, "__file__")
    script = main.__dict__.pop("__file__") if by_path and main is not None else None
    try:
        yield
    finally:
        if script is not None and main is not None:
            main.__file__ = script


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
    try:
        select.select([os.pidfd_open(parent)], [], [])  # readable once the parent has exited
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
    number: int, buffer: torch.Tensor, path: Path, slide_mpp: float | None, plan: ReadPlan, coords: np.ndarray
) -> None:
    _BUFFERS[number] = buffer  # a grown buffer replaces its old one
    key = (path, slide_mpp)
    slide = _OPEN.pop(key, None) or open_with_mpp(path, slide_mpp)
    _OPEN[key] = slide  # the most recently read goes last
    while len(_OPEN) > MAX_OPEN_SLIDES:
        _OPEN.pop(next(iter(_OPEN))).close()
    shape = (len(coords), plan.size, plan.size, 3)
    read_squares(slide, plan, coords, into=_squares(buffer, shape))


def _squares(buffer: torch.Tensor, shape: tuple[int, ...]) -> np.ndarray:
    """The front of a shared byte buffer viewed as channels-last squares of `shape` (N, H, W, 3)."""
    return buffer[: math.prod(shape)].numpy().reshape(shape)
