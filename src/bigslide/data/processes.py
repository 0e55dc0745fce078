"""Decode tiles in worker processes: the loader's way to use every core.

Threads decoding JPEG tiles share one interpreter, and on this project's own measurements two threads
gave 1.2x one thread's rate where two processes gave 1.8x (`bigslide bench io`). So the loader hands
each item's squares to forked processes: a process opens its own copy of the slide (the parent's open
files share their offsets and locks with a forked child), decodes every file tile the item touches once
(`read_squares`), and writes the squares into a shared buffer. The parent hands out a view of that
buffer, not a copy, and reuses the buffer once nothing refers to the view any more (a weak reference to
the array every handed-out view derives from says so): a copy into fresh memory cost the parent a page
fault per 4 KiB and a pass over the bag, which on two cores took the time of a third of a worker. Buffers
are kept (one per item in flight or still held, grown to the largest item): fresh shared memory would
cost the workers the same faults.

Each worker reads one item at a time over a pipe of its own, so a worker that dies (killed, out of
memory, a crash in a decoder) is known with the item it was reading: it is replaced and the item read
again, once; an item that kills a second worker is an error naming its slide. Replacements come from a
fork server (a process forked from this one while other threads hold locks would wait on them for ever).
What a worker runs is `bigslide.data.decode_worker`: it ignores Ctrl-C (the parent catches it and shuts
the workers down) and exits on its own when the parent dies, even by SIGKILL.

Reading squares is one kind of task; `call` is the other: any function of a slide's pixels (a tile grid
with its tissue, ink and focus measures, a tissue mask, a tissue-check thumbnail) runs in a worker, so the
process that steps the model never decodes a pixel, and several slides are tiled at once. A run keeps one
`DecodeProcesses` from its first grid to its last map: forking workers again costs seconds on many cores.
"""

from __future__ import annotations

import contextlib
import errno
import math
import multiprocessing
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from bigslide.data.decode import channels_first, read_squares
from bigslide.data.decode_worker import Returned, Unreceived, serve
from bigslide.data.slides import SlideCache
from bigslide.data.worker_pool import IdleWorkers, Worker, is_background, reads_at_once
from bigslide.errors import DataError
from bigslide.files import open_files_limit, out_of_files, too_many_open_files
from bigslide.wsi.resolution import ReadPlan

# How decode workers start: forked from this process (default), or from a server process
# (`fork_from_server`, for multi-threaded GUI processes).
_START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"

ATTEMPTS = 2
"""Workers an item may take down before it is an error naming its slide: the first may have been killed
for another reason (the out-of-memory killer picks the largest process, not the guilty one)."""
MIN_PART_TILES = 64
"""Tiles in the smallest part of an item read by several idle workers at once."""
T = TypeVar("T")


class DecodeProcesses:
    """`workers` processes reading squares of slides; `read` blocks the calling thread only.

    `buffers` reads may be under way at once (more wait): one more than `workers` keeps every worker
    busy while the parent hands an item over. `replaced` counts the workers started in place of dead ones.
    """

    def __init__(self, workers: int, buffers: int | None = None) -> None:
        self.workers = workers
        self.replaced = 0
        # fork: workers start in milliseconds and need no importable __main__ (scripts, notebooks)
        self._context = multiprocessing.get_context(_START_METHOD)
        # Every worker is forked now, on the thread making the loader: forked later from an item thread, a
        # worker would copy the locks that other item threads hold at that instant held (e.g. a
        # cached_property's on Python 3.11, taken while opening a slide) and wait on them for ever.
        self._all = [_start(self._context) for _ in range(workers)]
        # idle workers; None stands for one that could not be replaced yet: the next thread needing it tries
        self._idle = IdleWorkers()
        for worker in self._all:
            self._idle.put(worker)
        self._reads = threading.BoundedSemaphore(buffers or workers + 1)
        self._lock = threading.Lock()
        # by number: (buffer, the array last lent from it, alive while any view of it is, its generation)
        self._buffers: list[tuple[torch.Tensor, weakref.ref[np.ndarray] | None, int]] = []
        self._made = 0  # buffers made so far: the generation of the next
        self._reading: set[int] = set()
        self._parts = ThreadPoolExecutor(workers, thread_name_prefix="bigslide-part")  # a read's other parts

    def pids(self) -> list[int]:
        """The worker processes' ids (replacements included)."""
        with self._lock:
            return [w.process.pid for w in self._all if w.process.pid is not None]

    def read(
        self,
        path: Path,
        slide_mpp: float | None,
        plan: ReadPlan,
        coords: np.ndarray,
        table_mpp: float | None = None,
    ) -> np.ndarray:
        """`read_squares` of the slide at `path` (`open_with_mpp`'s µm/px), done in a worker process: a view
        of a shared buffer that is reused once nothing refers to it (keep a copy to hold the squares for
        long, e.g. in a cache)."""
        shape = (len(coords), plan.size, plan.size, 3)
        coords = np.asarray(coords)
        with self._reads:  # waits while `buffers` reads are under way
            number, buffer, generation = self._lend(math.prod(shape))
            try:
                what = f"{path}: a decode worker process died while reading {len(coords)} tiles"
                # parts read at once by the workers idle now (none idle, or reading ahead: one worker)
                background = is_background()  # the parts' threads wait as this one does
                split = 1 if background else self._split(len(coords))
                parts = np.array_split(np.arange(len(coords)), split)
                tasks = [
                    (
                        "read",
                        number,
                        buffer,
                        Path(path),
                        slide_mpp,
                        table_mpp,
                        plan,
                        coords[p],
                        int(p[0]),
                        len(coords),
                    )
                    for p in parts
                    if len(p)
                ]
                others = [
                    self._parts.submit(self._run, t, what, (number, generation), background=background)
                    for t in tasks[1:]
                ]
                try:
                    self._run(tasks[0], what, (number, generation))
                finally:
                    wait(others)  # no worker writes into the buffer once it is handed out (or lent again)
                for part in others:
                    part.result()
                lent = buffer.numpy()  # a new array object: every view handed out keeps it alive
                with self._lock:
                    self._buffers[number] = (buffer, weakref.ref(lent), generation)
                return channels_first(lent[: math.prod(shape)].reshape(shape))
            finally:
                with self._lock:
                    self._reading.discard(number)

    def _split(self, tiles: int) -> int:
        """Parts to read `tiles` in: one per idle worker, none under MIN_PART_TILES (a part boundary
        decodes the file tiles it cuts through twice); one while the loader reads as many items at once as
        there are workers (each item whole on one worker: parts of the first leave workers idle at the
        last; `bigslide bench io`'s 4 bags on 2 workers took 0.87 of the time split, 8 paired timings)."""
        if reads_at_once() >= self.workers:
            return 1
        return max(1, min(self._idle.qsize(), tiles // MIN_PART_TILES))

    def call(self, fn: Callable[..., T], *args: Any, what: str) -> T:
        """`fn(*args)` run in a worker process and its result (pickled back); `what` says what was under
        way when workers die on it (e.g. "<slide>: a decode worker process died while tiling it")."""
        answer = self._run(("call", fn, args), what)
        assert isinstance(answer, Returned)
        return answer.value  # type: ignore[no-any-return]

    def _run(
        self,
        task: tuple[Any, ...],
        what: str,
        buffer: tuple[int, int] | None = None,
        *,
        background: bool | None = None,
    ) -> Any:
        """Run `task` on an idle worker and return its answer; a worker that dies on it is replaced and
        the task tried again. `buffer`: the (number, generation) of a read's shared buffer, sent once to
        each worker and held there after."""
        deaths: list[str] = []
        while len(deaths) < ATTEMPTS:
            if background is None:
                background = is_background()
            worker = self._idle.get(background=background)
            if worker is None:
                worker = self._replacement()
            held = buffer is not None and worker.holds.get(buffer[0]) == buffer[1]
            try:
                answered, outcome = worker.run((*task[:2], None, *task[3:]) if held else task)
            except BaseException:  # interrupted (Ctrl-C): the worker may still be writing into the buffer
                self._drop(worker)
                self._idle.put(None)
                raise
            if answered:
                if buffer is not None and outcome is None:
                    worker.holds[buffer[0]] = buffer[1]
                self._idle.put(worker)
                if isinstance(outcome, Unreceived):
                    if _out_of_files():  # this process could not hand the buffer over
                        raise OSError(errno.EMFILE, too_many_open_files())
                    raise DataError(
                        f"{what.split(': ')[0]}: a decode worker could not receive its task ({outcome})"
                    )
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome
            deaths.append(outcome)
            self._drop(worker)
            self._idle.put(self._replacement())
            if len(deaths) < ATTEMPTS:
                warnings.warn(f"{what} ({outcome}); replaced, reading again", RuntimeWarning, stacklevel=3)
        raise DataError(
            f"{what}, twice ({' then '.join(deaths)}): out of memory, or a crash in the slide's decoder "
            "(data.skip_bad_slides: true leaves such slides out of training; data.workers: 0 reads in "
            "this process)"
        )

    def _drop(self, worker: Worker) -> None:
        """Kill `worker` if it still runs, and forget it."""
        worker.stop(now=True)
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)

    def _replacement(self) -> Worker:
        try:
            worker = _start(multiprocessing.get_context(_replacement_method()))
        except BaseException as err:
            self._idle.put(None)  # still to be replaced, by the next thread that needs a worker
            if isinstance(err, OSError):
                raise DataError(
                    f"cannot start a decode worker process in place of a dead one ({err})"
                ) from None
            raise
        with self._lock:
            self._all.append(worker)
            self.replaced += 1
        return worker

    def close(self) -> None:
        self._parts.shutdown(wait=True)
        with self._lock:
            workers, self._all = self._all, []
        for worker in workers:
            worker.stop()

    def _lend(self, size: int) -> tuple[int, torch.Tensor, int]:
        """(number, buffer, generation): a buffer of at least `size` bytes that no read and no handed-out
        view uses: an idle one that fits, else an idle one grown, else a new one."""
        with self._lock:
            idle = [
                n
                for n, (_buffer, lent, _made) in enumerate(self._buffers)
                if n not in self._reading and (lent is None or lent() is None)
            ]
            fits = [n for n in idle if self._buffers[n][0].numel() >= size]
            if fits:
                number = fits[0]
            else:
                number = idle[0] if idle else len(self._buffers)
                buffer = _shared_bytes(size)
                entry: tuple[torch.Tensor, weakref.ref[np.ndarray] | None, int] = (buffer, None, self._made)
                self._made += 1
                if number == len(self._buffers):
                    self._buffers.append(entry)
                else:
                    self._buffers[number] = entry  # the worker drops the smaller one when this comes
            self._reading.add(number)
            buffer, _lent, generation = self._buffers[number]
            return number, buffer, generation


Pool = Executor | DecodeProcesses | None


def read_slide_squares(
    slides: SlideCache, path: Path, plan: ReadPlan, coords: np.ndarray, pool: Pool = None
) -> np.ndarray:
    """`read_squares` of the slide at `path`: in worker processes (`pool`, else the slides' own), on
    threads, or on this thread."""
    if pool is None and isinstance(slides.workers, DecodeProcesses):
        pool = slides.workers
    if isinstance(pool, DecodeProcesses):
        return pool.read(path, slides.slide_mpp, plan, coords, slides.table_mpp(path))
    with slides.opened(path) as slide:
        return read_squares(slide, plan, coords, pool)


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
    _server_context()
    _START_METHOD = "forkserver"


def _server_context() -> BaseContext:
    """The fork server's context, its server started (importing this module, and no `__main__`)."""
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload([__name__])  # used when the server starts, not by a running one
    forkserver.ensure_running()
    return multiprocessing.get_context("forkserver")


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


def _replacement_method() -> str:
    """How a worker that died is replaced: from the fork server where there is one (this process's other
    threads hold locks at any moment), else as the first ones were started."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        _server_context()
        return "forkserver"
    return _START_METHOD


def _start(context: BaseContext) -> Worker:
    ours, theirs = context.Pipe()
    process = context.Process(target=serve, args=(theirs, os.getpid()), daemon=True)  # type: ignore[attr-defined]
    with main_script_left_alone():
        process.start()
    theirs.close()
    return Worker(process, ours)


def _shared_bytes(size: int) -> torch.Tensor:
    """A uint8 tensor of `size` bytes in shared memory, made there (sharing a fresh tensor copies it: a
    slide's 180 MB took 0.13 s against 0.04 s)."""
    try:
        storage = torch.UntypedStorage._new_shared(size)
    except (AttributeError, TypeError):  # a torch without it
        return torch.empty(size, dtype=torch.uint8).share_memory_()
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _out_of_files() -> bool:
    """Whether this process is at (or a few descriptors short of) its limit of open files."""
    limit = open_files_limit()
    try:
        count = len(os.listdir("/proc/self/fd"))
    except OSError as err:  # listing them takes a descriptor too
        return out_of_files(err)
    return limit is not None and count >= limit - 8
