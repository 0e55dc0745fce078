"""One decode worker process as its parent sees it (`Worker`: a task sent, the answer or how it died), and
the queue of idle ones (`IdleWorkers`), which hands workers to reads needed now before reads ahead
(`in_background`); `among_reads` tells a read how many items its loader reads at once."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for
from multiprocessing.process import BaseProcess
from typing import Any

CLOSE_WAIT_S = 5.0


@dataclass
class Worker:
    process: BaseProcess
    conn: Connection  # the parent's end of the worker's pipe
    # the shared buffers it holds, by number: the generation of each (a buffer is sent once, not per read:
    # sending one passes its file descriptor through a socket of its own)
    holds: dict[int, int] = field(default_factory=dict)

    def run(self, task: tuple[Any, ...]) -> tuple[bool, Any]:
        """(True, what the worker answered) or (False, how it died)."""
        try:
            self.conn.send(task)
            # the pipe, or the process's exit: another worker may hold a copy of this pipe's far end
            if self.conn in wait_for([self.conn, self.process.sentinel]):
                return True, self.conn.recv()
        except (EOFError, OSError):  # the far end went away: the worker is dead or dying
            pass
        self.process.join(CLOSE_WAIT_S)
        return False, death(self.process.exitcode)

    def stop(self, *, now: bool = False) -> None:
        """Ask the worker to exit once its read is done (`now`: kill it), and wait for it."""
        if not now:
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.process.join(CLOSE_WAIT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


_BACKGROUND = threading.local()


def is_background() -> bool:
    """Whether this thread is inside `in_background`."""
    return bool(getattr(_BACKGROUND, "on", False))


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Reads and calls made by this thread in the block wait for a worker while any other read waits: a
    read-ahead (e.g. the next epoch's first bags while an epoch validates) never delays what is needed now."""
    _BACKGROUND.on = True
    try:
        yield
    finally:
        _BACKGROUND.on = False


_PEERS = threading.local()


def reads_at_once() -> int:
    """Items read at once by this thread's loader, this one included (1 outside `among_reads`)."""
    count: Callable[[], int] | None = getattr(_PEERS, "count", None)
    return count() if count is not None else 1


@contextlib.contextmanager
def among_reads(count: Callable[[], int]) -> Iterator[None]:
    """Reads made by this thread in the block are among `count()` items its loader reads at once."""
    _PEERS.count = count
    try:
        yield
    finally:
        _PEERS.count = None


class IdleWorkers:
    """The idle workers (None: one still to be replaced), handed first to threads not in the background."""

    def __init__(self) -> None:
        self._ready: deque[Worker | None] = deque()
        self._changed = threading.Condition()
        self._waiting = 0  # threads not in the background waiting for a worker

    def put(self, worker: Worker | None) -> None:
        with self._changed:
            self._ready.append(worker)
            self._changed.notify_all()

    def get(self, *, background: bool = False) -> Worker | None:
        with self._changed:
            if background:
                self._changed.wait_for(lambda: bool(self._ready) and not self._waiting)
            else:
                self._waiting += 1
                try:
                    self._changed.wait_for(lambda: bool(self._ready))
                finally:
                    self._waiting -= 1
            worker = self._ready.popleft()
            self._changed.notify_all()  # a background thread may go now
            return worker

    def qsize(self) -> int:
        return len(self._ready)


def death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"
