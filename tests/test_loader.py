"""The prefetching loader: the same batches with 0 or N workers, clean shutdown, errors naming the tile."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bigslide.data import decode_worker, worker_pool
from bigslide.data import processes as processes_module
from bigslide.data import slides as slides_module
from bigslide.data.bags import BagDataset
from bigslide.data.images import SlideImageDataset
from bigslide.data.loader import BatchLoader
from bigslide.data.processes import DecodeProcesses
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.engine import Loss, TrainConfig, run_to_end, train
from bigslide.errors import SlideError
from bigslide.synthetic.slide_set import make_slide_set
from tests.conftest import broken_tile_slide


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("loader-slides"), n_slides=4, size=(768, 768), seed=5)


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("bigslide-")]


def small_config(csv: Path, out: Path, workers: int) -> TrainConfig:
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size, config.data.bag_size, config.data.workers = 32, 6, workers
    config.model.backbone = "resnet18"
    config.method.name = "frozen_abmil"
    config.optim.epochs, config.optim.lr = 1, 1e-3
    config.run.out_dir, config.run.device, config.run.deterministic = str(out), "cpu", True
    return config


def test_the_same_bags_with_0_1_and_2_workers(slide_csv: Path) -> None:
    table = SlideTable.from_csv(slide_csv)
    batches = [[2], [0], [3], [1], [2]]
    got = {}
    for workers in (0, 1, 2):  # 0: in this thread; else in worker processes
        bags = BagDataset(table, tile_size=32, bag_size=7, augment=True, seed=3)
        bags.set_epoch(1)
        with BatchLoader(bags, workers=workers, prefetch=2) as loader:
            loader.plan(batches)
            got[workers] = [loader.take(b)[0] for b in batches]
            got[workers].append(loader.take([0])[0])  # off plan: read directly, still the same
        bags.slides.close()
    for workers in (1, 2):
        for a, b in zip(got[0], got[workers], strict=True):
            assert a.slide == b.slide
            np.testing.assert_array_equal(a.coords, b.coords)
            assert torch.equal(a.x, b.x)
    assert not loader_threads()


def test_the_same_slide_images_with_0_and_2_workers(slide_csv: Path) -> None:
    table = SlideTable.from_csv(slide_csv)
    got = {}
    for workers in (0, 2):
        images = SlideImageDataset(table, image_size=96, target_mpp=4.0, augment=True, seed=1)
        with BatchLoader(images, workers=workers) as loader:
            loader.plan([[1, 3], [0, 2]])
            got[workers] = loader.take([1, 3]) + loader.take([0, 2])
        images.slides.close()
    for a, b in zip(got[0], got[2], strict=True):
        assert (a.slide, a.origin) == (b.slide, b.origin)
        assert torch.equal(a.x, b.x)
    assert len({s.x.float().mean().item() for s in got[0]}) == 4  # four different slides


def test_training_is_identical_with_0_and_2_workers(slide_csv: Path, tmp_path: Path) -> None:
    results = [run_to_end(train(small_config(slide_csv, tmp_path / str(w), w))) for w in (0, 2)]
    logs = [(r.out_dir / "losses.csv").read_text() for r in results]
    assert logs[0] == logs[1]
    assert len(logs[0].splitlines()) >= 3  # header + the steps
    assert not loader_threads()


def test_stop_and_ctrl_c_shut_the_loader_down(slide_csv: Path, tmp_path: Path) -> None:
    for stop in ("close", "interrupt"):
        run = train(small_config(slide_csv, tmp_path / stop, 2))
        while not isinstance(next(run), Loss):
            pass
        assert loader_threads(), "the loader should be reading ahead"
        if stop == "close":  # the GUI's Stop
            run.close()
        else:  # Ctrl-C reaches the training thread inside the generator
            with pytest.raises(KeyboardInterrupt):
                run.throw(KeyboardInterrupt)
        assert not loader_threads(), stop
        assert not multiprocessing.active_children(), stop
    assert (tmp_path / "close" / "checkpoints" / "last.pt").is_file()  # Stop saved where it stopped


@pytest.mark.parametrize("workers", [1, 2])
def test_a_broken_tile_names_its_slide_and_tile(tmp_path: Path, workers: int) -> None:
    path = broken_tile_slide(tmp_path / "broken.svs")
    bags = BagDataset(SlideTable([SlideEntry(path, "a")], ["a"]), tile_size=64, bag_size=0)
    with BatchLoader(bags, workers=workers) as loader:
        loader.plan([[0], [0]])
        with pytest.raises(
            SlideError, match=r"broken\.svs: cannot decode file tile \(row 1, col 1\) of level 0"
        ):
            loader.take([0])
    bags.slides.close()
    assert not loader_threads()


@pytest.mark.parametrize(("workers", "prefetch", "depth"), [(2, 4, 4), (2, 1, 3)])
def test_reading_ahead_is_bounded_by_the_prefetch_depth(workers: int, prefetch: int, depth: int) -> None:
    class Counting:
        def __init__(self) -> None:
            self.loaded: list[int] = []

        def __getitem__(self, i: int) -> int:
            self.loaded.append(i)
            return i

    data = Counting()
    with BatchLoader(data, workers=workers, prefetch=prefetch) as loader:  # type: ignore[arg-type]
        assert loader.depth == depth  # at least one batch more than workers
        loader.plan([[i] for i in range(50)])
        threading.Event().wait(0.3)
        assert sorted(data.loaded) == list(range(depth))
        assert loader.take([0]) == [0]
        threading.Event().wait(0.3)
        assert sorted(data.loaded) == list(range(depth + 1))


def test_tiles_are_decoded_in_worker_processes_that_close_with_the_loader(slide_csv: Path) -> None:
    bags = BagDataset(SlideTable.from_csv(slide_csv), tile_size=32, bag_size=5)
    with BatchLoader(bags, workers=2) as loader:
        loader.plan([[0], [1], [2]])
        loader.take([0])
        assert len(multiprocessing.active_children()) == 2
    assert not multiprocessing.active_children()
    assert not loader_threads()
    bags.slides.close()


def test_workers_are_forked_before_item_threads_take_locks(
    slide_csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process forked while another thread holds a lock starts with that lock held for ever. Item
    threads take locks while loading (opening a slide takes a cached_property's on Python 3.11), so the
    workers must exist before the first item thread runs; forked by the first read, this run hung."""
    gate = threading.Lock()  # a lock item threads take in the parent and decode workers in the child
    open_slide = slides_module.open_with_mpp

    def gated_open(*args: Any) -> Any:
        with gate:
            return open_slide(*args)

    monkeypatch.setattr(slides_module, "open_with_mpp", gated_open)

    class Gated(BagDataset):
        def load(self, i: int, pool: Any) -> Any:
            with gate:
                time.sleep(0.3)  # item 1 holds the gate while item 0 is read
            return super().load(i, pool)

    bags = Gated(SlideTable.from_csv(slide_csv), tile_size=32, bag_size=5)
    loader = BatchLoader(bags, workers=1, prefetch=3)
    done = threading.Event()

    def read() -> None:
        loader.plan([[0], [1], [2]])
        for i in range(3):
            loader.take([i])
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=30)
    if not done.is_set():
        for child in multiprocessing.active_children():
            os.kill(child.pid, signal.SIGKILL)  # frees the reader with an error, so the test ends
    reader.join(timeout=10)
    loader.close()
    bags.slides.close()
    assert done.is_set(), "a decode worker waited on a lock held in the parent when it was forked"


def test_an_item_is_read_in_parts_by_the_idle_workers_as_one_process_reads_it(
    slide_csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processes_module, "_START_METHOD", "fork")
    table = SlideTable.from_csv(slide_csv)
    bags = BagDataset(table, tile_size=16, bag_size=0)
    grid = bags.grids[0]
    assert len(grid) >= 3 * processes_module.MIN_PART_TILES
    truth = bags.read_bag(0, np.arange(len(grid))).x.numpy()
    parts: list[int] = []
    processes = DecodeProcesses(3)
    try:
        assert processes._split(len(grid)) == 3  # every worker idle: one part each
        monkeypatch.setattr(processes, "_run", _recording(processes._run, parts))
        got = processes.read(table.entries[0].path, None, grid.plan, grid.coords)
        np.testing.assert_array_equal(got, truth)
        assert sorted(parts) == sorted(len(p) for p in np.array_split(np.arange(len(grid)), 3))
    finally:
        processes.close()
        bags.slides.close()


def test_items_read_at_once_by_as_many_workers_are_each_read_whole_and_one_alone_in_parts(
    slide_csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # parts of the first item over both workers would leave one idle at the last
    monkeypatch.setattr(processes_module, "_START_METHOD", "fork")
    bags = BagDataset(SlideTable.from_csv(slide_csv), tile_size=16, bag_size=0)
    sizes = [len(g) for g in bags.grids]
    assert min(sizes) >= 2 * processes_module.MIN_PART_TILES
    processes = DecodeProcesses(2)
    assert processes._split(sizes[0]) == 2
    with worker_pool.among_reads(lambda: 2):
        assert processes._split(sizes[0]) == 1
    parts: list[int] = []
    seen: list[int] = []  # items in flight as each read chose its parts
    split = processes._split
    monkeypatch.setattr(processes, "_split", lambda n: seen.append(worker_pool.reads_at_once()) or split(n))
    monkeypatch.setattr(processes, "_run", _recording(processes._run, parts))
    loader = BatchLoader(bags, processes=processes)
    try:
        order = [[0], [1], [2]]  # the loader's depth: all three start at once
        loader.plan(order)
        assert [len(b) for b in (loader.take(batch)[0].x for batch in order)] == sizes[:3]
        assert seen[0] == 3  # the first read knew of the other two ...
        assert parts[0] in sizes[:3]  # ... and was read whole
        parts.clear()
        loader.plan([[3]])
        loader.take([3])
        assert sorted(parts) == sorted(len(p) for p in np.array_split(np.arange(sizes[3]), 2))
        assert loader._in_flight.count == 0
    finally:
        loader.close()
        processes.close()
        bags.slides.close()


def _recording(run: Any, parts: list[int]) -> Any:
    """`DecodeProcesses._run` noting the tiles of each read task it runs."""

    def recorded(task: tuple[Any, ...], *args: Any, **kwargs: Any) -> Any:
        if task[0] == "read":
            parts.append(len(task[7]))  # the coords of ("read", number, buffer, path, mpps x2, plan, coords…)
        return run(task, *args, **kwargs)

    return recorded


def test_squares_are_handed_out_uncopied_and_a_buffer_is_reused_only_when_let_go(slide_csv: Path) -> None:
    table = SlideTable.from_csv(slide_csv)
    bags = BagDataset(table, tile_size=32, bag_size=0)
    path, plan, coords = table.entries[0].path, bags.grids[0].plan, bags.grids[0].coords
    parts = [coords[:8], coords[8:16], coords[16:40]]
    truth = [
        bags.read_bag(0, np.arange(len(coords))).x.numpy()[s]
        for s in (slice(0, 8), slice(8, 16), slice(16, 40))
    ]
    processes = DecodeProcesses(1, buffers=1)
    try:
        held = processes.read(path, None, plan, parts[0])
        kept = torch.from_numpy(held)[2:5]  # a view of a view still holds the buffer
        address = held.ctypes.data
        del held
        second = processes.read(path, None, plan, parts[1])
        assert second.ctypes.data != address  # the first buffer is still referred to: not reused
        np.testing.assert_array_equal(kept.numpy(), truth[0][2:5])  # and not overwritten
        np.testing.assert_array_equal(second, truth[1])
        del kept
        third = processes.read(path, None, plan, parts[2])  # larger: the idle buffer is grown
        np.testing.assert_array_equal(third, truth[2])
        np.testing.assert_array_equal(second, truth[1])
        del third
        fourth = processes.read(path, None, plan, parts[0])
        np.testing.assert_array_equal(fourth, truth[0])
        assert len(processes._buffers) == 2  # one per view still held, plus none idle to spare
    finally:
        processes.close()
        bags.slides.close()


@pytest.mark.parametrize("server", [False, True], ids=["forked", "from-server"])
def test_worker_processes_exit_when_the_training_process_is_killed(slide_csv: Path, server: bool) -> None:
    script = (
        "import multiprocessing, sys, time\n"
        "from multiprocessing import forkserver\n"
        "from bigslide.data import processes\n"
        "from bigslide.data.bags import BagDataset\n"
        "from bigslide.data.loader import BatchLoader\n"
        "from bigslide.data.table import SlideTable\n"
        f"if {server}: processes.fork_from_server()\n"
        f"bags = BagDataset(SlideTable.from_csv({str(slide_csv)!r}), tile_size=32, bag_size=5)\n"
        "loader = BatchLoader(bags, workers=2)\n"
        "loader.plan([[0], [1]]); loader.take([0])\n"
        "print(*[p.pid for p in multiprocessing.active_children()], flush=True)\n"
        "print(forkserver._forkserver._forkserver_pid or '', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    assert len(workers) == 2
    started_by = proc.stdout.readline().split()
    assert bool(started_by) == server  # the fork server, which must go too
    workers += [int(pid) for pid in started_by]
    proc.kill()  # SIGKILL: no cleanup runs in the parent
    proc.wait()
    deadline = time.monotonic() + 10
    while any(map(running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if running(pid)]


def running(pid: int) -> bool:
    """Whether the process runs (a zombie has exited; a container's first process may never reap it)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_workers_from_a_server_read_the_same_bags(slide_csv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = SlideTable.from_csv(slide_csv)
    here = BagDataset(table, tile_size=32, bag_size=7, seed=3)
    monkeypatch.setattr(processes_module, "_START_METHOD", processes_module._START_METHOD)
    processes_module.fork_from_server()
    assert processes_module._START_METHOD == "forkserver"
    bags = BagDataset(table, tile_size=32, bag_size=7, seed=3)
    with BatchLoader(bags, workers=2) as loader:
        loader.plan([[1], [2]])
        got = [loader.take([i])[0] for i in (1, 2)]
        assert loader._processes is not None
        assert loader._processes._context.get_start_method() == "forkserver"
    for item, i in zip(got, (1, 2), strict=True):
        assert torch.equal(item.x, here[i].x)
    assert not multiprocessing.active_children()
    for b in (bags, here):
        b.slides.close()


def test_bags_come_channels_last_and_workers_yield_to_the_training_process(slide_csv: Path) -> None:
    bags = BagDataset(SlideTable.from_csv(slide_csv), tile_size=32, bag_size=5)
    here = bags[0].x
    assert here.shape == (5, 3, 32, 32)
    # rows of RGB pixels are copied as they are decoded; convolutions take this layout as it is
    assert here.is_contiguous(memory_format=torch.channels_last)
    with BatchLoader(bags, workers=1) as loader:
        loader.plan([[0]])
        from_worker = loader.take([0])[0].x
        assert from_worker.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(from_worker, here)
        assert loader._processes is not None
        niceness = [os.getpriority(os.PRIO_PROCESS, pid) for pid in loader._processes.pids()]
    assert niceness == [os.nice(0) + decode_worker.WORKER_NICENESS]
    bags.slides.close()


def test_a_read_ahead_waits_for_a_worker_after_the_reads_needed_now() -> None:
    """Threads in the background (the next epoch's bags while an epoch validates) get an idle worker only
    when no other thread waits for one."""
    idle = worker_pool.IdleWorkers()
    order: list[str] = []

    def take(name: str, background: bool) -> None:
        idle.get(background=background)
        order.append(name)

    ahead = threading.Thread(target=take, args=("read ahead", True))
    ahead.start()
    time.sleep(0.2)  # the read-ahead waits first
    needed = threading.Thread(target=take, args=("validation", False))
    needed.start()
    time.sleep(0.2)
    idle.put(None)  # one worker comes free: validation's
    needed.join(timeout=10)
    assert order == ["validation"]
    idle.put(None)
    ahead.join(timeout=10)
    assert order == ["validation", "read ahead"]
