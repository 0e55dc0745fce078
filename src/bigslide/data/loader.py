"""Read the next batches while the current one trains: a bounded, ordered, thread-based prefetcher.

The engine plans an epoch's batches (`plan`), then takes them one by one (`take`). With workers, a
producer thread reads the planned batches in order, `prefetch` ahead at most, and each item decodes its
file tiles on a pool of `workers` threads (one worker: the producer thread itself; imagecodecs and PIL
release the GIL, so threads run in parallel and share the open slides). Items depend only on (seed,
epoch, index), never on timing, so the batches are the same with 0 or N workers and a resumed run reads
exactly what the stopped one would have. `close` (also on Stop, Ctrl-C or an error) stops the producer
and joins every thread it started.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Protocol

from bigslide.data.sample import Sample

MAX_DEFAULT_WORKERS = 8
_POLL_S = 0.05


class ItemDataset(Protocol):
    def __getitem__(self, i: int) -> Sample: ...


def default_workers() -> int:
    """min(cores this process may use, 8)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


def load_item(dataset: ItemDataset, i: int, pool: Executor | None) -> Sample:
    """Item i, decoded on `pool` when the dataset can use one (bags and slide images can)."""
    load = getattr(dataset, "load", None)
    return load(i, pool) if load is not None else dataset[i]


class BatchLoader:
    """Batches of `dataset` items read ahead of the step; `workers=None` picks `default_workers()`."""

    def __init__(self, dataset: ItemDataset, *, workers: int | None = None, prefetch: int = 2) -> None:
        self.dataset = dataset
        self.workers = default_workers() if workers is None else int(workers)
        self.prefetch = max(1, int(prefetch))
        # One worker is the producer thread itself: handing each file tile to a one-thread pool costs
        # a fifth of the decode time in thread switches.
        self.pool = (
            ThreadPoolExecutor(self.workers, thread_name_prefix="bigslide-decode")
            if self.workers > 1
            else None
        )
        self._planned: deque[tuple[int, ...]] = deque()
        self._queue: queue.Queue[tuple[list[Sample] | None, BaseException | None]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the engine's side ------------------------------------------------------------------------
    def plan(self, batches: Sequence[Iterable[int]]) -> None:
        """The batches that will be taken next, in order; reading starts now (with workers)."""
        self._halt()
        self._planned = deque(tuple(int(i) for i in b) for b in batches)
        if self.workers == 0 or not self._planned:
            return
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(
            target=self._produce,
            args=(list(self._planned), self._queue, self._stop),
            name="bigslide-prefetch",
            daemon=True,
        )
        self._thread.start()

    def take(self, batch: Iterable[int]) -> list[Sample]:
        """The items of `batch`; read ahead when it is the next planned batch, else read now."""
        key = tuple(int(i) for i in batch)
        if not self._planned or self._planned[0] != key:
            self._halt()  # off plan (nothing planned, or the caller skipped): read directly
            return [load_item(self.dataset, i, self.pool) for i in key]
        self._planned.popleft()
        if self._queue is None:
            return [load_item(self.dataset, i, None) for i in key]
        items, error = self._queue.get()
        if error is not None:
            self._halt()
            raise error
        assert items is not None
        return items

    def close(self) -> None:
        """Stop reading and join every thread; safe to call twice."""
        self._halt()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def __enter__(self) -> BatchLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the producer thread ----------------------------------------------------------------------
    def _produce(
        self,
        batches: list[tuple[int, ...]],
        out: queue.Queue[tuple[list[Sample] | None, BaseException | None]],
        stop: threading.Event,
    ) -> None:
        for batch in batches:
            if stop.is_set():
                return
            result: tuple[list[Sample] | None, BaseException | None]
            try:
                result = ([load_item(self.dataset, i, self.pool) for i in batch], None)
            except BaseException as err:  # handed to the training thread, which raises it
                result = (None, err)
            while not stop.is_set():
                try:
                    out.put(result, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if result[1] is not None:
                return

    def _halt(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            self._drain()
            self._thread.join(timeout=_POLL_S)
        self._drain()
        self._thread = None
        self._queue = None
        self._planned.clear()

    def _drain(self) -> None:
        if self._queue is None:
            return
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
