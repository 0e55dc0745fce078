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


def test_the_viewers_decode_workers_are_shared_and_end_with_its_window(make_napari_viewer: Any) -> None:
    viewer = make_napari_viewer()
    session = session_for(viewer)
    processes = session.decode_processes()
    assert session.decode_processes() is processes  # the same workers for every use
    assert session.slides().workers is processes
    pids = processes.pids()
    assert pids
    assert all(alive(p) for p in pids)
    viewer.close()
    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
