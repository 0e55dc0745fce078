"""Read the next batches while the current one trains: a bounded, ordered prefetcher on processes.

The engine plans an epoch's batches (`plan`), then takes them one by one (`take`). With workers, the
planned batches are read ahead in order, at most `depth` batches not yet taken: each item is loaded on
a thread of this process (augmentation, the sample) while its tiles are decoded in one of `workers`
processes (`DecodeProcesses`: threads decoding JPEG share one interpreter; processes use
every core). Items depend only on (seed, epoch, index), never on timing, so the batches are the same
with 0 or N workers and a resumed run reads exactly what the stopped one would have. `close` (also on
Stop, Ctrl-C or an error) cancels what has not started, waits for what has, and joins every thread
and process it started. With `skip_bad`, an item whose slide cannot be read (`SlideError`, `DataError`:
a file that does not open or decode, one that took down two decode workers) is left out of its batch,
and of every later one, and named in `bad`.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from typing import Any, Generic, Protocol, TypeVar

from bigslide.data.processes import DecodeProcesses, Pool
from bigslide.data.worker_pool import among_reads, in_background
from bigslide.errors import DataError, SlideError

MAX_DEFAULT_WORKERS = 8

Item = TypeVar("Item")  # what a dataset gives: a Sample, or e.g. a slide read with its error
Item_co = TypeVar("Item_co", covariant=True)


class ItemDataset(Protocol[Item_co]):
    def __getitem__(self, i: int) -> Item_co: ...


def usable_cores() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """min(cores this process may use, 8)."""
    return max(1, min(usable_cores(), MAX_DEFAULT_WORKERS))


def worker_count(workers: int | None, processes: DecodeProcesses | None = None) -> int:
    """The decode workers a read uses: a shared pool's, else `workers` (None: `default_workers()`)."""
    if processes is not None:
        return processes.workers
    return default_workers() if workers is None else int(workers)


def load_item(dataset: ItemDataset[Item], i: int, pool: Pool) -> Item:
    """Item i, decoded on `pool` when the dataset can use one (bags and slide images can)."""
    load = getattr(dataset, "load", None)
    return load(i, pool) if load is not None else dataset[i]


class _InFlight:
    """How many items a loader has asked for and not yet got back (read by its item threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.count += n

    def read(self, dataset: ItemDataset[Item], i: int, pool: Pool, background: bool) -> Item:
        try:
            with among_reads(lambda: self.count), in_background() if background else nullcontext():
                return load_item(dataset, i, pool)
        finally:
            self.add(-1)


Batch = tuple[int, ...]


class BatchLoader(Generic[Item]):
    """Batches of `dataset` items read ahead of the step; `workers=None` picks `default_workers()`.

    At most `depth` = max(prefetch, workers + 1) batches are read and not yet taken (each worker needs
    an item to decode while the last one is handed over): that bounds the memory the loader holds.
    `processes`: decode workers the loader shares (a run's, used by every epoch, validation and map; the
    loader does not close them); without, it starts `workers` of its own with its first read.
    """

    def __init__(
        self,
        dataset: ItemDataset[Item],
        *,
        workers: int | None = None,
        prefetch: int = 2,
        skip_bad: bool = False,
        processes: DecodeProcesses | None = None,
    ) -> None:
        self.dataset = dataset
        self.skip_bad = skip_bad
        self.bad: dict[int, str] = {}  # items left out (skip_bad), with why
        self.workers = worker_count(workers, processes)
        self.depth = max(1, int(prefetch), self.workers + 1)
        self._threads: ThreadPoolExecutor | None = None
        self._shared = processes
        self._processes: DecodeProcesses | None = None
        self._todo: deque[Batch] = deque()  # planned, not yet submitted
        self._ahead: int | None = None  # fewer read ahead until the next take
        # submitted, in plan order: each item of the batch not known to be bad, and its read
        self._pending: deque[tuple[Batch, dict[int, Future[Item]]]] = deque()
        self._in_flight = _InFlight()

    # -- the engine's side ------------------------------------------------------------------------
    def plan(self, batches: Sequence[Iterable[int]], *, ahead: int | None = None) -> None:
        """The batches that will be taken next, in order; reading starts now (with workers). `ahead`: read
        only that many before the first is taken (the workers are wanted elsewhere meanwhile)."""
        self._halt()
        if self.workers == 0:
            return
        self._todo = deque(tuple(int(i) for i in b) for b in batches)
        self._ahead = ahead
        self._fill()

    def take(self, batch: Iterable[int]) -> list[Item]:
        """The items of `batch`; read ahead when it is the next planned batch, else read now. With
        `skip_bad`, the items that cannot be read are left out (the list may be empty)."""
        key = tuple(int(i) for i in batch)
        if not self._pending or self._pending[0][0] != key:
            self._halt()  # off plan (no workers, nothing planned, or the caller skipped): read directly
            return [item for i in key if i not in self.bad for item in self._kept(i, None)]
        _, futures = self._pending.popleft()
        self._ahead = None
        try:
            items = [item for i, f in futures.items() for item in self._kept(i, f)]
        except BaseException:
            self._halt()
            raise
        self._fill()
        return items

    def _kept(self, i: int, read: Future[Item] | None) -> list[Item]:
        """Item i ([it]), or [] when it cannot be read and bad items are skipped."""
        try:
            pool = self._processes or self._shared
            return [read.result() if read is not None else load_item(self.dataset, i, pool)]
        except (SlideError, DataError) as err:
            if not self.skip_bad:
                raise
            self.bad[i] = str(err)
            return []

    def close(self) -> None:
        """Stop reading; join every thread and process; safe to call twice."""
        self._halt()
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
            self._threads = None
        if self._processes is not None:
            if self._processes is not self._shared:
                self._processes.close()
            self._processes = None

    def __enter__(self) -> BatchLoader[Item]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading ahead ----------------------------------------------------------------------------
    def _fill(self) -> None:
        room = (self._ahead or self.depth) - len(self._pending)
        keys = [self._todo.popleft() for _ in range(min(room, len(self._todo)))]
        if not keys:
            return
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self.depth, thread_name_prefix="bigslide-load")
            # datasets that decode slide tiles (stored features need no decoding processes)
            if hasattr(self.dataset, "load") and getattr(self.dataset, "decodes_tiles", True):
                self._processes = self._shared or DecodeProcesses(self.workers, buffers=self.depth)
        todos = [[i for i in key if i not in self.bad] for key in keys]
        # counted before any starts: the first read must know of the others to leave them workers
        self._in_flight.add(sum(len(t) for t in todos))
        background = bool(self._ahead)  # read ahead of time: after reads needed now
        read, pool = self._in_flight.read, self._processes
        for key, todo in zip(keys, todos):
            futures = {i: self._threads.submit(read, self.dataset, i, pool, background) for i in todo}
            self._pending.append((key, futures))

    def _halt(self) -> None:
        """Forget the plan: cancel the reads not started, wait for the running ones."""
        self._todo.clear()
        started = []
        for _, futures in self._pending:
            cancelled = [f.cancel() for f in futures.values()]
            started += [f for f, gone in zip(futures.values(), cancelled) if not gone]
            self._in_flight.add(-sum(cancelled))  # a cancelled read never runs to count itself out
        self._pending.clear()
        wait(started)
