"""Files written whole or not at all: a reader (or a resumed run) never sees half a file."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def open_files_limit() -> int | None:
    """How many files this process may have open at once (`ulimit -n`); None where it cannot tell."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # not on Unix
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def too_many_open_files() -> str:
    """What to do when a process runs out of file descriptors, naming its limit (one line)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # not on Unix
        return "too many open files: raise this system's limit on open files, or lower data.workers"
    said = f"too many open files: this process may have {soft} open at once (`ulimit -n`)"
    if hard != resource.RLIM_INFINITY and hard <= soft:
        return (
            f"{said}, and its hard limit (`ulimit -Hn`) is no higher: have it raised, or lower data.workers"
        )
    wanted = max(4096, 4 * soft) if hard == resource.RLIM_INFINITY else min(hard, max(4096, 4 * soft))
    return f"{said}; raise the limit before starting (e.g. `ulimit -n {wanted}`), or lower data.workers"


def out_of_files(err: BaseException) -> bool:
    """Whether `err` is the system refusing to open another file (EMFILE, ENFILE)."""
    return isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path`, ending in its suffix (for writers that pick the format by the name:
    PIL, numpy's .npz), renamed over `path` once the block ends without error; removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def link_or_copy(source: Path, target: Path) -> Path:
    """`target` made the same file as `source` (a hard link, else a copy), atomically."""
    with atomic_path(target) as tmp:
        tmp.unlink()
        try:
            os.link(source, tmp)
        except OSError:  # another file system, or one without links
            shutil.copyfile(source, tmp)
    return target
