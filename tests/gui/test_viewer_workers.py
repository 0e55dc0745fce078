"""A viewer keeps one set of decode workers for its runs, maps and tile counts; they end with its window."""

from __future__ import annotations

import os
import time
from typing import Any

from bigslide.napari._session import session_for


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pid(_slides: object) -> int:
    return os.getpid()


def test_the_viewers_decode_workers_are_shared_and_end_with_its_window(make_napari_viewer: Any) -> None:
    viewer = make_napari_viewer()
    session = session_for(viewer)
    slides = session.slides()  # what a panel hands its worker thread: it starts no process yet
    assert session._processes is None
    processes = session.decode_processes()
    assert session.decode_processes() is processes  # the same workers for every use
    pids = processes.pids()
    assert slides.run(_pid, what="a pid") in pids  # and the panels' reads go to them
    assert pids
    assert all(alive(p) for p in pids)
    viewer.close()
    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
