"""Atomic, safe checkpoints.

Saving: written to a temporary file in the same folder, fsynced, then renamed over the old one, so a crash
or kill during a save leaves the previous checkpoint loadable.

Loading: checkpoints are shared between labs, so they are read with `torch.load(weights_only=True)`, which
only rebuilds tensors and plain data and never runs code from the file. Everything bigslide saves is made
of those (RNG states included); anything else is refused with one line naming the file.
"""

from __future__ import annotations

import os
import pickle
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bigslide.engine.run_folder import LAST
from bigslide.errors import TrainingError
from bigslide.files import temporary_beside

FORMAT = 2
# What every checkpoint holds; `load_checkpoint(require=...)` adds what resuming needs.
MODEL_KEYS = ("config", "classes", "method", "model")
RESUME_KEYS = ("optimizer", "schedule", "position", "rng", "stepper")


def plain(value: Any) -> Any:
    """`value` with numpy scalars and arrays turned into Python numbers, lists and tensors."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed while saving
        stale.unlink(missing_ok=True)
    fd, tmp = temporary_beside(path)
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


def load_checkpoint(path: str | Path, *, require: Sequence[str] = ()) -> dict[str, Any]:
    """The checkpoint at `path`, read without running any code from it.

    `require` names keys the caller needs besides the ones every checkpoint has (e.g. `RESUME_KEYS`).
    """
    path = Path(path).expanduser()  # as a table's slide paths are: ~ is the home folder
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
