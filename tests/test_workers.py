"""Decode workers that die are replaced: the item is read again once, a slide that kills two workers is
that slide's error (training stops naming it, or leaves it out; prediction reports it in its row), and
workers exit with their parent whatever the number of files it has open."""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bigslide.cli.main import main
from bigslide.data import decode_worker
from bigslide.data import processes as processes_module
from bigslide.data.bags import BagDataset
from bigslide.data.processes import DecodeProcesses
from bigslide.data.table import SlideTable
from bigslide.engine import Message, TrainConfig, run_to_end, train
from bigslide.engine.cohort import predict_cohort
from bigslide.engine.inference import load_trained
from bigslide.engine.slide_prediction import SlidePrediction
from bigslide.errors import DataError
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.words import counted


@pytest.fixture(autouse=True)
def forked_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers forked from this process, whatever an earlier test in it set (a napari session starts them
    from a fork server): they see `poison`'s decoder and are this process's children."""
    monkeypatch.setattr(processes_module, "_START_METHOD", "fork")


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("worker-slides"), n_slides=6, size=(512, 512), seed=7)


def config_for(csv: Path, out: Path, workers: int, **data: Any) -> TrainConfig:
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size, config.data.bag_size, config.data.workers = 32, 6, workers
    for key, value in data.items():
        setattr(config.data, key, value)
    config.model.backbone = "test_resnet"
    config.method.name = "abmil_acc"
    config.optim.epochs, config.optim.lr = 2, 1e-3
    config.run.out_dir, config.run.device, config.run.deterministic = str(out), "cpu", True
    config.run.tensorboard = False
    return config


def kill_a_worker() -> int:
    worker = multiprocessing.active_children()[0]
    os.kill(worker.pid, signal.SIGKILL)  # e.g. the kernel's out-of-memory killer
    return int(worker.pid)


def poison(monkeypatch: pytest.MonkeyPatch, slide: Path) -> None:
    """A decoder that kills its worker process on `slide` (replacements are forked, so they share it)."""
    read = decode_worker.read_squares

    def crashing(opened: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(opened.path) == slide:
            os.kill(os.getpid(), signal.SIGKILL)
        return read(opened, *args, **kwargs)

    monkeypatch.setattr(decode_worker, "read_squares", crashing)
    monkeypatch.setattr(processes_module, "_replacement_method", lambda: "fork")


def test_a_killed_worker_is_replaced_and_the_read_done_again(slide_csv: Path) -> None:
    table = SlideTable.from_csv(slide_csv)
    bags = BagDataset(table, tile_size=32, bag_size=5)
    path, plan, coords = table.entries[0].path, bags.grids[0].plan, bags.grids[0].coords[:5]
    truth = bags.read_bag(0, np.arange(5)).x.numpy()
    processes = DecodeProcesses(1)
    try:
        np.testing.assert_array_equal(processes.read(path, None, plan, coords), truth)
        killed = kill_a_worker()
        with pytest.warns(RuntimeWarning, match=f"{path.name}: a decode worker process died .*SIGKILL"):
            np.testing.assert_array_equal(processes.read(path, None, plan, coords), truth)
        assert processes.replaced == 1
        assert killed not in processes.pids()
        assert len(processes.pids()) == 1
    finally:
        processes.close()
        bags.slides.close()
    assert not multiprocessing.active_children()


def test_a_slide_that_kills_two_workers_is_its_error_and_others_are_read(
    slide_csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = SlideTable.from_csv(slide_csv)
    bags = BagDataset(table, tile_size=32, bag_size=5)
    bad, good = table.entries[0].path, table.entries[1].path
    poison(monkeypatch, bad)
    processes = DecodeProcesses(2)
    try:
        with pytest.warns(RuntimeWarning), pytest.raises(DataError) as caught:
            processes.read(bad, None, bags.grids[0].plan, bags.grids[0].coords[:5])
        assert str(caught.value).startswith(
            f"{bad}: a decode worker process died while reading 5 tiles, twice"
        )
        assert "killed by SIGKILL then killed by SIGKILL" in str(caught.value)
        got = processes.read(good, None, bags.grids[1].plan, bags.grids[1].coords[:5])
        np.testing.assert_array_equal(got, bags.read_bag(1, np.arange(5)).x.numpy())
        assert processes.replaced == 2
        assert len(processes.pids()) == 2
    finally:
        processes.close()
        bags.slides.close()


def test_training_goes_on_the_same_when_a_worker_is_killed_mid_run(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    undisturbed = run_to_end(train(config_for(slide_csv, tmp_path / "calm", 0)))
    table = SlideTable.from_csv(slide_csv).with_splits(seed=0)
    poison_once(
        monkeypatch, next(e.path for e in table.entries if e.split == "train"), tmp_path / "killed-once"
    )
    run = train(config_for(slide_csv, tmp_path / "killed", 2))
    with pytest.warns(RuntimeWarning, match="a decode worker process died .*replaced, reading again"):
        _events, result = drive(run)
    assert result.steps == undisturbed.steps
    # the same batches in the same order: the same losses as a run whose workers were left alone
    calm, killed = ((r.out_dir / "losses.csv").read_text() for r in (undisturbed, result))
    assert killed == calm
    assert not multiprocessing.active_children()


def test_a_slide_that_kills_workers_stops_training_naming_it_or_is_left_out(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = SlideTable.from_csv(slide_csv).with_splits(seed=0)
    train_slides = [e.path for e in table.entries if e.split == "train"]
    bad = train_slides[-1]
    poison(monkeypatch, bad)
    stopped = config_for(slide_csv, tmp_path / "stopped", 2)
    stopped.run.checkpoint_every = 1
    with pytest.warns(RuntimeWarning), pytest.raises(DataError) as caught:
        run_to_end(train(stopped))
    message = str(caught.value)
    assert message.startswith(f"{bad}: a decode worker process died while reading")
    assert "twice" in message
    assert "the run stopped while training at step" in message
    assert "data.skip_bad_slides: true" in message
    ckpt = tmp_path / "stopped" / "checkpoints" / "last.pt"
    assert ckpt.is_file()
    assert str(ckpt) in message
    assert not multiprocessing.active_children()

    with pytest.warns(RuntimeWarning):
        events, result = drive(train(config_for(slide_csv, tmp_path / "skipping", 2, skip_bad_slides=True)))
    said = [e for e in events if isinstance(e, Message) and "left out of training" in e.text]
    assert len(said) == 1
    assert str(bad) in said[0].text
    assert said[0].left_out == (str(bad),)  # named as a file too, for napari's last words
    assert result.steps == 2 * (len(train_slides) - 1)
    assert not multiprocessing.active_children()


def drive(run: Generator[Any, None, Any]) -> tuple[list[Any], Any]:
    """A run's events and result."""
    events: list[Any] = []
    while True:
        try:
            events.append(next(run))
        except StopIteration as stop:
            return events, stop.value


def poison_once(monkeypatch: pytest.MonkeyPatch, slide: Path, flag: Path) -> None:
    """A decoder that kills its worker the first time any worker reads tiles of `slide` (the `flag` file
    says it did), in the middle of the read: after its buffer has come, as the kernel's out-of-memory killer
    would strike a worker decoding."""
    read = decode_worker.read_squares

    def crashing(opened: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(opened.path) == slide:
            try:
                os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return read(opened, *args, **kwargs)

    monkeypatch.setattr(decode_worker, "read_squares", crashing)
    monkeypatch.setattr(processes_module, "_replacement_method", lambda: "fork")


def test_prediction_goes_on_when_a_worker_is_killed_and_names_a_slide_that_kills_two(
    slide_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trained_run = config_for(slide_csv, tmp_path / "run", 0)
    trained_run.optim.max_steps = 1
    ckpt = run_to_end(train(trained_run)).checkpoint
    assert ckpt is not None
    table = SlideTable.from_csv(slide_csv)
    outcomes = predict_cohort(load_trained(ckpt, device="cpu"), table, workers=2, with_grids=False)
    poison_once(monkeypatch, table.entries[1].path, tmp_path / "killed-once")
    with pytest.warns(RuntimeWarning, match="replaced, reading again"):
        got = list(outcomes)
    assert [o.index for o in got] == list(range(len(table)))
    assert all(isinstance(o.result, SlidePrediction) for o in got)

    bad = table.entries[2].path
    poison(monkeypatch, bad)
    out = tmp_path / "predictions"
    argv = ["--slides", str(slide_csv), "--checkpoint", str(ckpt), "--out", str(out), "--workers", "2"]
    with pytest.warns(RuntimeWarning):
        code = main(["predict", "--device", "cpu", "--quiet", "--no-heatmaps", *argv])
    assert code == 1
    rows = (out / "predictions.csv").read_text().splitlines()
    assert len(rows) == 1 + len(table)
    failed = [row for row in rows[1:] if "died" in row]
    assert len(failed) == 1
    assert str(bad) in failed[0]
    assert "twice" in failed[0]
    assert (
        f"{counted(len(table) - 1, 'slide')} predicted, 0 skipped (outputs present), 1 failed"
        in capsys.readouterr().out
    )


def test_workers_exit_with_their_parent_with_more_than_1024_files_open(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this machine allows {hard} open files; the test needs 2,048")
    script = (
        "import multiprocessing, os, resource, time\n"
        "from bigslide.data.processes import DecodeProcesses\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))\n"
        "held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]\n"
        "workers = DecodeProcesses(2)\n"
        # a child that holds copies of every pipe: the workers see no end of input when the parent dies
        "holder = multiprocessing.get_context('fork').Process(target=time.sleep, args=(60,))\n"
        "holder.start()\n"
        "print(*workers.pids(), holder.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    *workers, holder = (int(pid) for pid in proc.stdout.readline().split())
    try:
        time.sleep(1.0)  # each worker's exit-with-the-parent thread has started, or died
        assert all(len(os.listdir(f"/proc/{pid}/fd")) > 1100 for pid in workers)
        proc.kill()  # SIGKILL: no cleanup runs in the parent
        proc.wait()
        deadline = time.monotonic() + 10
        while any(map(running, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if running(pid)]
    finally:
        for pid in [*workers, holder]:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in proc.stderr.read()  # once the holder is gone: it holds the pipe open


def running(pid: int) -> bool:
    """Whether the process runs (a zombie has exited; a container's first process may never reap it)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
