"""Where a run keeps its latest checkpoint, and a run's folder standing for it (no PyTorch needed)."""

from __future__ import annotations

from pathlib import Path

LAST = Path("checkpoints", "last.pt")
"""A run's latest checkpoint, in its folder."""


def checkpoint_of(path: str | Path) -> Path:
    """`path` itself, or the latest checkpoint of the run whose folder `path` is."""
    path = Path(path)
    return path / LAST if path.is_dir() and (path / LAST).is_file() else path
