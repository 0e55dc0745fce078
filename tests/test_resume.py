"""Exact resume: a `bigslide train` process stopped by SIGINT, SIGTERM or kill -9 and resumed with `--resume`
logs the same per-step losses (`losses.csv`) as an uninterrupted run; a kill during a checkpoint save leaves
the previous checkpoint loadable."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bigslide.engine import TrainConfig
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.logfile import LossLog, read_losses
from bigslide.synthetic.slide_set import make_slide_set

pytestmark = pytest.mark.slow
TIMEOUT = 240


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("resume")
    config = TrainConfig()
    config.data.csv = str(make_slide_set(folder / "slides", n_slides=6, size=(512, 512), seed=4))
    config.data.tile_size = 32
    config.data.bag_size = 4
    config.method.name = "full_bag"
    config.method.params = {"hidden": 16, "attention_dim": 8}
    config.model.backbone = "resnet18"
    config.optim.epochs = 2
    config.optim.lr = 1e-3
    config.run.device = "cpu"
    config.run.deterministic = True
    config.run.checkpoint_every = 1
    config.optim.accumulate = 2  # a stop can land between the two bags of one optimizer step
    return config.to_yaml(folder / "config.yaml")


def start(config: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # same float reductions in every process
    cmd = [sys.executable, "-m", "bigslide", "train", str(config), "--out", str(out), "--quiet", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """(exit status, stderr, stdout)."""
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, err, out


def wait_for_steps(proc: subprocess.Popen[str], losses: Path, steps: int) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if losses.is_file() and len(read_losses(losses)) >= steps:
            return
        if proc.poll() is not None:
            raise AssertionError(
                f"the run ended before step {steps}: {proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.05)
    raise AssertionError(f"no step {steps} within {TIMEOUT} s")


@pytest.fixture(scope="module")
def reference(config_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, int, float]]:
    out = tmp_path_factory.mktemp("reference")
    code, err, _ = finish(start(config_path, out))
    assert code == 0, err
    rows = read_losses(out / "losses.csv")
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    assert len(rows) == 4  # two epochs of two bags
    assert {r[1] for r in rows} == {0, 1}
    return rows


@pytest.mark.parametrize(
    ("how", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 130), (signal.SIGKILL, -signal.SIGKILL)],
    ids=["sigint", "sigterm", "kill-9"],
)
def test_stopped_run_resumes_with_the_same_losses(
    how: signal.Signals, code: int, config_path: Path, reference: list[tuple[int, int, float]], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    losses = out / "losses.csv"
    stop_after = 3  # odd: mid-accumulation when the stop saves
    proc = start(config_path, out)
    wait_for_steps(proc, losses, stop_after)
    proc.send_signal(how)
    returncode, err, said = finish(proc)
    assert returncode == code, err
    if how != signal.SIGKILL:
        assert err.strip().splitlines()[-1] == "bigslide: stopped; the last checkpoint is kept"
        # the way to interrupt at once is the signal that asked to stop, sent again
        again = "Ctrl-C again" if how == signal.SIGINT else "a second SIGTERM"
        assert f"stopping after this step ({again} to interrupt at once)" in said

    saved = load_checkpoint(out / "checkpoints" / "last.pt")["position"]["step"]
    assert stop_after - 1 <= saved < len(reference)  # stopped mid-run, at a checkpoint of step >= 1
    logged = len(read_losses(losses))
    assert logged >= saved  # a killed run may have logged steps past its checkpoint

    returncode, err, _ = finish(start(config_path, out, "--resume"))
    assert returncode == 0, err
    resumed = read_losses(losses)
    assert [r[:2] for r in resumed] == [r[:2] for r in reference]
    assert [r[2] for r in resumed] == pytest.approx([r[2] for r in reference], rel=1e-6, abs=1e-7)


def test_loss_log_is_cut_back_to_the_resumed_step(tmp_path: Path) -> None:
    path = tmp_path / "losses.csv"
    log = LossLog(path)
    log.start(resume_step=None)
    for step in range(1, 6):
        log.write(step, step // 3, 1.0 / step)
    log.close()
    with path.open("a") as f:
        f.write("6,2,0.1")  # a row cut short by a kill
    log.start(resume_step=3)
    log.write(4, 1, 0.5)
    log.close()
    assert read_losses(path) == [(1, 0, 1.0), (2, 0, 0.5), (3, 1, 1 / 3), (4, 1, 0.5)]


SAVER = textwrap.dedent(
    """
    import sys, torch
    from bigslide.engine.checkpoint import save_checkpoint
    path, marker = sys.argv[1], sys.argv[2]
    for i in range(1, 10_000):
        state = {"config": {}, "classes": ["a"], "method": "m", "model": {}}
        save_checkpoint({**state, "i": i, "w": torch.full((2_000_000,), float(i))}, path)  # 8 MB
        with open(marker, "w") as f:
            f.write(str(i))
    """
)


def test_kill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints" / "last.pt"
    marker = tmp_path / "saved"
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(ckpt), str(marker)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + TIMEOUT
    while not marker.is_file() or marker.read_text() in ("", "1"):  # at least two saves done
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.01)
    started = time.monotonic()
    while marker.read_text() in ("", "2"):  # measure how long one save takes
        time.sleep(0.005)
    save_time = time.monotonic() - started
    time.sleep(random.Random(0).uniform(0.2, 0.9) * save_time)  # most likely inside a save
    proc.kill()
    proc.wait(timeout=TIMEOUT)

    state = load_checkpoint(ckpt)
    assert state["i"] >= 2
    assert bool((state["w"] == float(state["i"])).all())
    assert [p.name for p in ckpt.parent.iterdir() if not p.name.startswith(".")] == ["last.pt"]
