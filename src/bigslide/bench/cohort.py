"""Cohort scale: thousands of slides on one workstation, under the common limit of 1,024 open files.

Writes one small JPEG SVS slide (the `bench io` slide: `--size` px square at 0.5 µm/px, 256 px JPEG tiles)
and, for each size in `--slides` (default 500 and 2,000), that many copies of it and a table listing
them all in the train split. Each run is `bigslide train` in a fresh process whose open-file limit is
`--limit` (default 1,024): abmil_acc on the test_resnet encoder, tiles of 64 px at 2 µm/px (16 per slide),
bags of 32, `--workers` decode processes, its tile cache a folder of the bench's own. Per size:

- cold: the tile cache emptied, the run stopped after its first step (`--repeats` times);
- cached: the same run again, its tile grids in the cache (a second run, a cv fold, a napari Start);
- epoch: one whole epoch (cached): the epoch's slides/s (first step to the epoch's end).

Every row gives the main process's peak resident memory, a decode worker's (peak resident, shared pages
counted, and proportional at the epoch's end), and the open descriptors of the main process (most seen,
sampled every 25 steps) and of a worker (at the epoch's end), the most over the row's runs.

Time to the first step is given from the process's start (Python and torch imports included: what a
user waits) and from `train()` being called (what tiling and the cache change). With two sizes, the main
process's memory growth per 1,000 slides is the difference of the epoch runs' resident memory at the
epoch's end (and of their peaks) over the difference of their sizes.

Targets (exit status 1 when one is missed; `--no-targets` only reports): every run finishes under the
limit; the main process keeps at most a quarter of the limit open; the cached time to the first step
(median, from `train()`) is at most a quarter of the cold one at the largest size; with two sizes, the main
process grows by at most 64 MB per 1,000 slides.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bigslide.bench.io_slide import ensure_slide
from bigslide.bench.targets import Targets, add_target_argument, machine_line, min_median

CHILD = (
    "import sys; from bigslide.bench.cohort import child; child(sys.argv[1], sys.argv[2], int(sys.argv[3]))"
)
MB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slides", default="500,2000", help="cohort sizes, comma-separated (default 500,2000)"
    )
    parser.add_argument("--size", type=int, default=1024, help="slide side in level-0 px (default 1024)")
    parser.add_argument("--limit", type=int, default=1024, help="open-file limit of each run (default 1024)")
    parser.add_argument("--workers", type=int, default=2, help="decode processes (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="cold and cached first-step runs (default 3)")
    add_target_argument(parser)
    parser.add_argument(
        "--cache", default=str(Path(tempfile.gettempdir()) / "bigslide-bench"), help="folder for the slides"
    )


def run(args: argparse.Namespace) -> int:
    print(machine_line(), flush=True)
    sizes = sorted(int(n) for n in args.slides.split(","))
    print(f"command: bigslide bench cohort {' '.join(_argv(args, sizes))}", flush=True)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < args.limit:
        print(f"this machine allows at most {hard} open files; use --limit {hard} or less", file=sys.stderr)
        return 2
    targets = Targets.from_args(args)
    root = Path(args.cache) / f"cohort_{args.size}"
    source = ensure_slide(root, args.size, args.size)
    print(
        f"slides: copies of {source.name} ({source.stat().st_size / 1e6:.2f} MB, {args.size} x {args.size} "
        f"px, JPEG); abmil_acc, test_resnet, 64 px tiles at 2 µm/px, bags of 32, "
        f"{args.workers} decode workers, "
        f"ulimit -n {args.limit}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print(
        "\n| slides | run | first step from process start, s (min / median) | from train(), s (min / median) "
        "| epoch slides/s | main peak RSS, MB | worker peak RSS / PSS, MB | open files, main / worker |"
    )
    print("|---|---|---|---|---|---|---|---|")
    results: dict[int, dict[str, list[dict[str, Any]]]] = {}
    failed = 0
    for n in sizes:
        table = _cohort(root, source, n)
        tiles = root / f"tiles_{n}"
        runs: dict[str, list[dict[str, Any]]] = {"cold": [], "cached": [], "epoch": []}
        for kind in ("cold", "cached", "epoch"):
            for _ in range(1 if kind == "epoch" else args.repeats):
                if kind == "cold":
                    shutil.rmtree(tiles, ignore_errors=True)
                got = _child_run(root, table, tiles, args, whole_epoch=kind == "epoch")
                failed += "error" in got
                runs[kind].append(got)
            print(_row(n, kind, runs[kind]), flush=True)
        results[n] = runs
    print("(RSS: resident set, shared pages counted; PSS: a worker's share of the pages it shares)")
    before = [
        r["imports_rss"] / MB
        for runs in results.values()
        for rs in runs.values()
        for r in rs
        if "error" not in r
    ]
    if before:
        print(
            "main process RSS once Python, torch and bigslide are imported, before any slide: "
            "{:.0f} / {:.0f} MB (min / median)".format(*min_median(before))
        )
    _check(targets, results, sizes, failed, args.limit)
    return targets.exit_code()


def _cohort(root: Path, source: Path, n: int) -> Path:
    """`n` copies of `source` (made once, kept) and a table listing them, every slide in the train split."""
    folder = root / "slides"
    folder.mkdir(parents=True, exist_ok=True)
    rows = ["slide,label,split"]
    for i in range(n):
        copy = folder / f"s{i:05d}.svs"
        if not copy.is_file():
            shutil.copyfile(source, copy)
        rows.append(f"{copy},{'ab'[i % 2]},train")
    table = root / f"table_{n}.csv"
    table.write_text("\n".join(rows) + "\n")
    return table


def _child_run(root: Path, table: Path, tiles: Path, args: argparse.Namespace, *, whole_epoch: bool) -> dict:
    config = root / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "data": {
                    "csv": str(table),
                    "target_mpp": 2.0,
                    "tile_size": 64,
                    "workers": args.workers,
                    "tile_cache": str(tiles),
                },
                "model": {"backbone": "test_resnet"},
                "method": {"name": "abmil_acc"},
                "optim": {"epochs": 1, "max_steps": None if whole_epoch else 1},
                "run": {"device": "cpu", "tensorboard": False, "out_dir": str(root / "run")},
            }
        )
    )
    result = root / "result.json"
    result.unlink(missing_ok=True)
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(config), str(result), str(args.limit)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode or not result.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"run failed (exit status {done.returncode}): {last}", flush=True)
        return {"error": last}
    got = json.loads(result.read_text())
    got["from_start"] = got["first_step_at"] - started
    return got


def child(config_path: str, result_path: str, limit: int) -> None:
    """One measured run (in its own process, at most `limit` files open, as after `ulimit -n`): writes
    what it measured to `result_path` as JSON."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from bigslide.engine import Loss, Metrics, TrainConfig, train

    config = TrainConfig.from_yaml(config_path)
    out: dict[str, Any] = {"open_main": 0, "imports_rss": _status("self", "VmRSS")}
    called = time.time()
    steps = 0
    for event in train(config):
        if isinstance(event, Loss):
            steps += 1
            if steps == 1:
                out["first_step_at"] = time.time()
                out["from_train"] = out["first_step_at"] - called
            if steps % 25 == 1:
                out["open_main"] = max(out["open_main"], _open_files("self"))
        elif isinstance(event, Metrics) and event.split == "train":
            out["epoch_s"] = time.time() - out["first_step_at"]
            out["steps"] = steps
            out["open_main"] = max(out["open_main"], _open_files("self"))
            workers = _children()
            out["worker_rss"] = max((_status(w, "VmHWM") for w in workers), default=0)
            out["worker_pss"] = max((_pss(w) for w in workers), default=0)
            out["open_worker"] = max((_open_files(w) for w in workers), default=0)
            out["main_rss_end"] = _status("self", "VmRSS")
    out["main_rss"] = _status("self", "VmHWM")
    Path(result_path).write_text(json.dumps(out))


def _children() -> list[str]:
    found = []
    for task in Path("/proc/self/task").iterdir():
        found += (task / "children").read_text().split()
    return found


def _status(pid: str, key: str) -> int:
    """A /proc/PID/status figure in bytes (0 when the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith(f"{key}:")), 0)


def _pss(pid: str) -> int:
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith("Pss:")), 0)


def _open_files(pid: str) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _row(n: int, kind: str, runs: list[dict[str, Any]]) -> str:
    good = [r for r in runs if "error" not in r]
    if not good:
        return f"| {n} | {kind} | failed | | | | | |"
    start = "{:.1f} / {:.1f}".format(*min_median([r["from_start"] for r in good]))
    train = "{:.1f} / {:.1f}".format(*min_median([r["from_train"] for r in good]))
    rate = f"{good[0]['steps'] / good[0]['epoch_s']:.1f}" if kind == "epoch" else ""
    main = max(r["main_rss"] for r in good) / MB
    worker = "{:.0f} / {:.0f}".format(*(max(r[k] for r in good) / MB for k in ("worker_rss", "worker_pss")))
    files = "{} / {}".format(*(max(r[k] for r in good) for k in ("open_main", "open_worker")))
    return f"| {n} | {kind} | {start} | {train} | {rate} | {main:.0f} | {worker} | {files} |"


def _check(targets: Targets, results: dict, sizes: list[int], failed: int, limit: int) -> None:
    targets.check(f"runs that failed under ulimit -n {limit}", failed, 0)
    good = [r for by_kind in results.values() for runs in by_kind.values() for r in runs if "error" not in r]
    targets.check("open files of the main process, most seen", max(r["open_main"] for r in good), limit / 4)
    cold = [r["from_train"] for r in results[sizes[-1]]["cold"] if "error" not in r]
    cached = [r["from_train"] for r in results[sizes[-1]]["cached"] if "error" not in r]
    ratio = statistics.median(cached) / statistics.median(cold) if cold and cached else float("nan")
    targets.check(
        f"cached / cold time to the first step from train() at {sizes[-1]} slides (median)", ratio, 0.25
    )
    if len(sizes) > 1:
        small, large = (results[n]["epoch"][0] for n in (sizes[0], sizes[-1]))
        if "error" in small or "error" in large:
            targets.fail("main process memory per 1,000 slides")
            return
        growth = {
            key: (large[key] - small[key]) / MB / (sizes[-1] - sizes[0]) * 1000
            for key in ("main_rss", "main_rss_end")
        }
        print(
            f"main process, {sizes[0]} -> {sizes[-1]} slides: RSS at the epoch's end "
            f"{small['main_rss_end'] / MB:.0f} -> {large['main_rss_end'] / MB:.0f} MB "
            f"({growth['main_rss_end']:+.1f} MB per 1,000 slides); peak "
            f"{small['main_rss'] / MB:.0f} -> {large['main_rss'] / MB:.0f} MB ({growth['main_rss']:+.1f})"
        )
        targets.check(
            "main process RSS growth per 1,000 slides at the epoch's end, MB", growth["main_rss_end"], 64
        )


def _argv(args: argparse.Namespace, sizes: list[int]) -> list[str]:
    return [
        *("--slides", ",".join(map(str, sizes))),
        *("--size", str(args.size), "--limit", str(args.limit)),
        *("--workers", str(args.workers), "--repeats", str(args.repeats)),
    ]
