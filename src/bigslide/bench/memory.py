"""Peak host memory of a piece of work: the rise of the process's resident-set high-water mark.

On Linux the mark can be reset (`/proc/self/clear_refs`), so one process can measure several steps in
turn; freed heap is returned to the system first so that earlier work does not hide a later peak.
"""

from __future__ import annotations

import contextlib
import ctypes
import resource
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
STATUS = Path("/proc/self/status")


def _status_bytes(field: str) -> int | None:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def trim_heap() -> None:
    """Give freed malloc arenas back to the system so the resident set reflects live memory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_bytes() -> int:
    value = _status_bytes("VmRSS")
    return value if value is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> None:
    trim_heap()
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    value = _status_bytes("VmHWM")
    return value if value is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_delta(work: Callable[[], T]) -> tuple[T, int]:
    """Run `work` and return its result with how far the resident set rose above where it started."""
    reset_peak()
    start = rss_bytes()
    result = work()
    return result, max(0, peak_rss_bytes() - start)


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def set_mmap_threshold(nbytes: int) -> None:
    """Blocks above `nbytes` are mmapped and go back to the system when freed.

    Low for memory measurements (the resident set then follows live tensors), high for timings
    (mmapping every large tensor costs a page fault per page and shows up as system time).
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, int(nbytes))


MEASURE_MEMORY = 64 * 1024
MEASURE_TIME = 32 * 2**20  # glibc's own dynamic ceiling on 64-bit systems
