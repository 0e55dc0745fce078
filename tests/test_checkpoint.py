import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bigslide.engine.checkpoint import (
    FORMAT,
    RESUME_KEYS,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    seed_everything,
    set_rng_state,
)
from bigslide.errors import TrainingError

MINIMAL = {"config": {}, "classes": ["a", "b"], "method": "m"}


def test_round_trip(tmp_path: Path) -> None:
    state = {**MINIMAL, "model": {"w": torch.arange(3)}, "step": 4}
    path = save_checkpoint(state, tmp_path / "c" / "last.pt")
    state = load_checkpoint(path)
    assert state["step"] == 4
    assert torch.equal(state["model"]["w"], torch.arange(3))
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary file left


def test_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_checkpoint({**MINIMAL, "model": {}, "step": 1}, tmp_path / "last.pt")

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(TrainingError, match=r"could not write checkpoint .*last.pt: No space left on device"):
        save_checkpoint({**MINIMAL, "model": {}, "step": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", b"PK\x03\x04garbage"])
def test_unreadable_checkpoint_is_named(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(TrainingError, match=r"bad\.pt: not a readable bigslide checkpoint") as refused:
        load_checkpoint(path)
    assert "Error" not in str(refused.value)  # in words, not the unpickler's exception name


class _RunsCode:
    """Unpickling this calls os.system: what a crafted checkpoint does to `torch.load(weights_only=False)`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "shared.pt"
    state = {"format": FORMAT, "config": {}, "classes": ["a", "b"], "method": "x", "model": {}}
    torch.save({**state, "payload": _RunsCode(marker)}, path)
    with pytest.raises(TrainingError, match=r"shared\.pt: refused: it holds Python objects") as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value)
    assert not marker.exists(), "loading the checkpoint ran its code"


def test_old_format_and_missing_keys_are_refused_with_one_line(tmp_path: Path) -> None:
    old = tmp_path / "old.pt"
    torch.save({"format": 1, "model": {}}, old)
    with pytest.raises(TrainingError, match=r"old\.pt: checkpoint format 1 is not this version's \(2\)"):
        load_checkpoint(old)
    partial = tmp_path / "partial.pt"
    torch.save({"format": FORMAT, "config": {}, "method": "abmil_acc", "model": {}}, partial)
    with pytest.raises(
        TrainingError, match=r"partial\.pt: not a complete bigslide checkpoint: missing classes"
    ):
        load_checkpoint(partial)
    no_resume = save_checkpoint(
        {"config": {}, "classes": ["a"], "method": "m", "model": {}}, tmp_path / "m.pt"
    )
    with pytest.raises(TrainingError, match=r"missing optimizer, schedule, position, rng"):
        load_checkpoint(no_resume, require=RESUME_KEYS)


def test_rng_states_survive_a_weights_only_round_trip(tmp_path: Path) -> None:
    seed_everything(7)
    np.random.standard_normal()  # leave a cached Gaussian in numpy's state
    path = save_checkpoint(
        {"config": {}, "classes": ["a"], "method": "m", "model": {}, "rng": rng_state()}, tmp_path / "r.pt"
    )
    expected = (random.random(), np.random.standard_normal(3), torch.rand(3))
    set_rng_state(load_checkpoint(path)["rng"])
    assert random.random() == expected[0]
    np.testing.assert_array_equal(np.random.standard_normal(3), expected[1])
    assert torch.equal(torch.rand(3), expected[2])


def test_numpy_values_in_a_state_are_saved_as_plain_data(tmp_path: Path) -> None:
    history = [{"auc": np.float64(0.75), "confusion": np.array([[1, 2], [3, 4]])}]
    path = save_checkpoint(
        {"config": {}, "classes": ["a"], "method": "m", "model": {}, "history": history}, tmp_path / "h.pt"
    )
    loaded = load_checkpoint(path)["history"][0]
    assert loaded["auc"] == 0.75
    assert type(loaded["auc"]) is float
    assert loaded["confusion"].tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_files_written_whole_are_as_readable_as_the_users_own(tmp_path: Path, umask: int) -> None:
    """Written through a temporary file and a rename, yet with the permissions the user's umask gives a
    new file (a colleague on a shared server reads the results), not the temporary file's 0600."""
    from bigslide.files import atomic_path, atomic_write_text

    old = os.umask(umask)
    try:
        written = [
            atomic_write_text(tmp_path / "predictions.csv", "slide,p\n"),
            save_checkpoint({"epoch": 1}, tmp_path / "last.pt"),
        ]
        with atomic_path(tmp_path / "map.npz") as tmp:
            np.savez(tmp, scores=np.zeros(2))
        written.append(tmp_path / "map.npz")
    finally:
        os.umask(old)
    assert [oct(p.stat().st_mode & 0o777) for p in written] == [oct(0o666 & ~umask)] * 3
