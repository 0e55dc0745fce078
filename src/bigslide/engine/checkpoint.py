"""Atomic, safe checkpoints.

Saving: written to a temporary file in the same folder, fsynced, then renamed over the old one, so a crash
or kill during a save leaves the previous checkpoint loadable. A run writes on a thread of its own
(`CheckpointWriter`) from a host copy of its state, so training goes on while the file is written.

Loading: checkpoints are shared between labs, so they are read with `torch.load(weights_only=True)`, which
only rebuilds tensors and plain data and never runs code from the file. Everything bigslide saves is made
of those (RNG states included); anything else is refused with one line naming the file.
"""

from __future__ import annotations

import os
import pickle
import random
import tempfile
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigslide.engine.run_folder import LAST
from bigslide.errors import TrainingError

FORMAT = 2
# What every checkpoint holds; `load_checkpoint(require=...)` adds what resuming needs.
MODEL_KEYS = ("config", "classes", "method", "model")
RESUME_KEYS = ("optimizer", "schedule", "position", "rng", "stepper")


def plain(value: Any) -> Any:
    """`value` with numpy scalars and arrays turned into Python numbers, lists and tensors."""
    return _leaves(value, _plain_leaf)


def host_copy(value: Any) -> Any:
    """`value` with its containers and tensors copied (tensors to the host): what training does next to
    the live weights, optimizer state or history does not reach it."""
    return _leaves(value, _copied_leaf)


def _leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value`'s dicts, tuples and lists rebuilt, with `leaf` applied to everything else in them."""
    if isinstance(value, Mapping):
        return {k: _leaves(v, leaf) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_leaves(v, leaf) for v in value)
    if isinstance(value, list):
        return [_leaves(v, leaf) for v in value]
    return leaf(value)


def _plain_leaf(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    return value


def _copied_leaf(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed while saving
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **plain(state)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise TrainingError(f"could not write checkpoint {path}: {err.strerror or err}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class CheckpointWriter:
    """Checkpoints written on a thread of their own, one at a time, each from a host copy of the state
    taken when it is asked for; `finished` hands back those on disk, in order (a failed write's error is
    raised there). At most one copy waits beside the live state: a write waits for the one before."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="bigslide-checkpoint")
        self.writes: deque[tuple[Future[Path], int]] = deque()

    def write(self, state: dict[str, Any], path: Path, step: int) -> None:
        self.wait()  # the last write done (or its error raised) before this one's copy is made
        self.writes.append((self.pool.submit(save_checkpoint, host_copy(state), path), step))

    def wait(self) -> None:
        """Until every write asked for is on disk (a failed one's error raised); `finished` still hands
        them back."""
        for future, _step in self.writes:
            future.result()

    def announce(self, path: Path, step: int) -> None:
        """A checkpoint another process writes (distributed rank 0): finished at once here."""
        done: Future[Path] = Future()
        done.set_result(path)
        self.writes.append((done, step))

    def finished(self, *, wait: bool = False) -> list[tuple[Path, int]]:
        """(path, step) of every write on disk since the last call; `wait`: of every write asked for."""
        out = []
        while self.writes and (wait or self.writes[0][0].done()):
            future, step = self.writes.popleft()
            out.append((future.result(), step))
        return out

    def close(self) -> None:
        """Wait for the writes asked for (a failed one's error raised)."""
        try:
            self.finished(wait=True)
        finally:
            self.pool.shutdown()


def load_checkpoint(path: str | Path, *, require: Sequence[str] = ()) -> dict[str, Any]:
    """The checkpoint at `path`, read without running any code from it.

    `require` names keys the caller needs besides the ones every checkpoint has (e.g. `RESUME_KEYS`).
    """
    path = Path(path)
    if path.is_dir():
        raise TrainingError(
            f"{path}: a folder, not a checkpoint (a run keeps its latest as {LAST} in its folder)"
        )
    if not path.is_file():
        raise TrainingError(f"{path}: no such checkpoint")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "unsupported global" not in str(err).lower():  # not a pickle of ours at all
            raise TrainingError(
                f"{path}: not a readable bigslide checkpoint (damaged, cut short, or not a checkpoint file)"
            ) from None
        raise TrainingError(
            f"{path}: refused: it holds Python objects besides tensors and plain data, which could run "
            "code when loaded; bigslide checkpoints never do"
        ) from None
    except Exception:
        raise TrainingError(
            f"{path}: not a readable bigslide checkpoint (damaged, cut short, or not a checkpoint file)"
        ) from None
    if not isinstance(state, dict) or "format" not in state:
        raise TrainingError(f"{path}: not a bigslide checkpoint (no format field)")
    if state["format"] != FORMAT:
        raise TrainingError(
            f"{path}: checkpoint format {state['format']!r} is not this version's ({FORMAT}); "
            "retrain, or load it with the bigslide version that wrote it"
        )
    missing = [key for key in (*MODEL_KEYS, *require) if key not in state]
    if missing:
        raise TrainingError(f"{path}: not a complete bigslide checkpoint: missing {', '.join(missing)}")
    classes = state["classes"]
    classifier = (state.get("endpoint") or {}).get("task", "classification") == "classification"
    if (
        not isinstance(classes, list)
        or not all(isinstance(c, str) for c in classes)
        or not (classes or not classifier)
    ):
        raise TrainingError(f"{path}: 'classes' must be a non-empty list of class names")
    if not isinstance(state["model"], dict):
        raise TrainingError(f"{path}: 'model' is not a state dict")
    return state


def rng_state() -> dict[str, Any]:
    """Every random stream's state as tensors and plain data (loadable with weights_only=True)."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            **np_state,
            "state": {**np_state["state"], "key": torch.from_numpy(np_state["state"]["key"])},
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state["numpy"])
    np_state["state"] = {**np_state["state"], "key": np.asarray(np_state["state"]["key"], dtype=np.uint32)}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
