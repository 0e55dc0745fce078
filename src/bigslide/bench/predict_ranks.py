"""Cohort prediction across torchrun ranks, for `bigslide bench predict --ranks`.

`--ranks 1,2` times the whole `bigslide predict` command (a process of its own, its start included, the
tile cache cold) with one process, then under `torchrun --nproc_per_node r`, each rank with one decode
worker; target: r ranks >= 0.8 x r x one rank's slides/s (median over repeats of paired ratios). Each rank,
its decode worker with it, is held to one core of its own (`os.sched_setaffinity`), as on a machine with a
core or a GPU per rank: what the ratio shows is what sharing the cohort costs, not how many cores one
process can use (unheld, one rank and its worker already keep two cores busy).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bigslide.bench.targets import Targets

if TYPE_CHECKING:
    from bigslide.data.table import SlideTable

RANK_SCRIPT = """import os, sys
# one core per rank (torchrun's LOCAL_RANK; 0 for one process), held before anything starts a thread or a
# worker, which inherit it
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[int(os.environ.get("LOCAL_RANK", "0"))]})
from bigslide.bench.predict import register_16_pixels
register_16_pixels()  # the bench's encoder, known to this process too
from bigslide.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def time_ranks(
    args: argparse.Namespace, cache: Path, ckpt: Path, targets: Targets, table: SlideTable, n_tiles: int
) -> None:
    """`bigslide predict` as a command on the `--rank-slides` slides of `table` (`n_tiles` tissue tiles),
    one process and under torchrun, one decode worker and one core per rank."""
    counts = [int(r) for r in args.ranks.split(",")]
    cores = len(os.sched_getaffinity(0))
    if max(counts) > cores:
        raise SystemExit(
            f"--ranks {args.ranks}: each rank gets a core of its own, and this machine has {cores}"
        )
    script = cache / "predict_rank.py"
    script.write_text(RANK_SCRIPT)
    csv = table.to_csv(cache / "predict_cohort.csv")
    times: dict[int, list[float]] = {r: [] for r in counts}
    for _ in range(args.repeats):  # interleaved, so the machine's load hits every count alike
        for r in counts:
            out = Path(tempfile.mkdtemp(prefix="bench-ranks-", dir=cache))  # a cold tile cache
            launch = [sys.executable]
            if r > 1:
                launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(r)]
            command = [*launch, str(script), "predict", "--slides", str(csv), "--checkpoint", str(ckpt)]
            command += ["--out", str(out), "--workers", "1", "--device", args.device, "--quiet"]
            command += ["--no-heatmaps"] if args.no_heatmaps else []
            start = time.perf_counter()
            done = subprocess.run(
                command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
            )
            times[r].append(time.perf_counter() - start)
            shutil.rmtree(out, ignore_errors=True)
            if done.returncode != 0:
                targets.fail(f"predict with {r} rank(s) failed: {done.stderr.strip().splitlines()[-1:]}")
    print(
        f"\nthe predict command on {args.rank_slides} slides ({n_tiles} tissue tiles), its start included, "
        "tile cache cold; each rank and its decode worker on a core of its own"
    )
    header = "predict command"
    print(f"\n| {header} | slides/s, min | slides/s, median | tiles/s, median | x 1 rank (median) |")
    print("|---|---|---|---|---|")
    first = statistics.median(times[counts[0]])
    for r in counts:
        rates = [args.rank_slides / t for t in times[r]]
        median = statistics.median(times[r])
        name = f"{r} rank{'s' if r > 1 else ''} x 1 worker"
        print(
            f"| {name} | {min(rates):.2f} | {statistics.median(rates):.2f} | {n_tiles / median:.0f} | "
            f"{first / median:.2f}x |"
        )
    base = times[counts[0]]
    for r in counts[1:]:
        paired = [b / (r * t) for b, t in zip(base, times[r])]
        targets.check(
            f"predict, {r} ranks >= 0.8 x {r} x 1 rank (median of paired repeats; min {min(paired):.2f})",
            statistics.median(paired),
            0.8,
            at_most=False,
        )
