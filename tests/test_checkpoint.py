import os
from pathlib import Path

import pytest
import torch

from bigslide.engine.checkpoint import load_checkpoint, save_checkpoint
from bigslide.errors import TrainingError


def test_round_trip(tmp_path: Path) -> None:
    path = save_checkpoint({"model": {"w": torch.arange(3)}, "step": 4}, tmp_path / "c" / "last.pt")
    state = load_checkpoint(path)
    assert state["step"] == 4
    assert torch.equal(state["model"]["w"], torch.arange(3))
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary file left


def test_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_checkpoint({"step": 1}, tmp_path / "last.pt")

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(TrainingError, match=r"could not write checkpoint .*last.pt: No space left on device"):
        save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", b"PK\x03\x04garbage"])
def test_unreadable_checkpoint_is_named(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(TrainingError, match=r"bad\.pt: not a readable bigslide checkpoint"):
        load_checkpoint(path)
