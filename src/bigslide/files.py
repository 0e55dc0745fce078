"""Files written whole or not at all: a reader (or a resumed run) never sees half a file."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temporary_beside(path: Path, suffix: str = ".tmp") -> tuple[int, str]:
    """(descriptor, name) of a new file in `path`'s folder, to be renamed over `path`, readable as a file
    the user creates is (mkstemp's own 0600 would survive the rename: colleagues could not read results)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    return fd, tmp


def _umask() -> int:
    try:  # Linux says it without changing it (setting it to read it races with other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temporary_beside(path)
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
    fd, tmp = temporary_beside(path, f".tmp{path.suffix}")
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


def expand_home(path: str | None) -> str | None:
    """`path` with a leading `~` made the user's home folder, as a shell would: a config written by hand
    naming `~/slides.csv` was otherwise read as a folder named `~` in the working folder (and one made)."""
    return os.path.expanduser(path) if isinstance(path, str) and path.startswith("~") else path
