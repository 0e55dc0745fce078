"""`bigslide bench acc`: time and peak memory of one ABMIL-ACC training step against the full-bag step.

Time: one worker process builds both methods from the same weights and alternates their steps
(after a warm-up step each), so machine load hits both alike; min and median over the repeats.
On a CPU shared with other jobs, `--threads 1` gives steadier ratios: with more threads than free
cores, every operator's thread barrier waits for descheduled threads, which penalises the many
smaller operator calls of a chunked step more than the full bag's few large ones.

Memory: a fresh worker process per method. After a warm-up step on the same bag, the kernel's
resident-set high-water mark is reset (`/proc/self/clear_refs`), and the step's memory is the new
high-water mark minus the resident set just before the step (model, optimizer state and the bag are
already there). glibc is told to serve large blocks with mmap (`MALLOC_MMAP_THRESHOLD_`) so freed
tensors leave the resident set at once instead of lingering in the heap. Without /proc, the
`ru_maxrss` increase is used (less exact: it cannot be reset after the warm-up). On CUDA,
`torch.cuda.max_memory_allocated` above the pre-step allocation is reported as well.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HWM_FILE = Path("/proc/self/status")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backbone", default="resnet18", help="timm encoder (default resnet18)")
    parser.add_argument("--aggregator", default="abmil", help="MIL head (default abmil)")
    parser.add_argument("--bag", type=int, default=200, help="tiles per bag (default 200)")
    parser.add_argument(
        "--big-bag", type=int, default=2000, help="second ACC bag size; 0 skips (default 2000)"
    )
    parser.add_argument("--tile", type=int, default=64, help="tile side in pixels (default 64)")
    parser.add_argument("--chunk", type=int, default=25, help="ACC replay chunk (default 25)")
    parser.add_argument(
        "--forward-chunk", type=int, default=0, help="ACC no-grad chunk; 0 = the method's default"
    )
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per method (default 10)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto)")
    parser.add_argument("--amp", default="", help="bf16 or fp16 mixed precision on CUDA")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads per worker; 0 = torch's default"
    )


def run(args: argparse.Namespace) -> int:
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    base = {
        "backbone": args.backbone,
        "aggregator": args.aggregator,
        "tile": args.tile,
        "chunk": args.chunk,
        "forward_chunk": args.forward_chunk,
        "device": device,
        "amp": args.amp,
        "threads": args.threads,
    }
    print(
        f"ABMIL-ACC vs full bag: {args.backbone} + {args.aggregator}, tiles 3x{args.tile}x{args.tile}, "
        f"chunk {args.chunk}, no-grad chunk {args.forward_chunk or 4 * args.chunk}, {device}, "
        f"{args.threads or torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    timing = _spawn({**base, "mode": "time", "bag": args.bag, "repeats": args.repeats})
    memory_full = _spawn({**base, "mode": "memory", "method": "full_bag", "bags": [args.bag]})
    acc_bags = [args.bag] + ([args.big_bag] if args.big_bag else [])
    memory_acc = _spawn({**base, "mode": "memory", "method": "abmil_acc", "bags": acc_bags})

    rows = []
    for method, mem in (("full_bag", memory_full), ("abmil_acc", memory_acc)):
        times = timing[method]
        for bag, measured in zip(mem["bags"], mem["memory"]):
            timed = bag == args.bag
            rows.append(
                (
                    method,
                    bag,
                    f"{min(times):.2f}" if timed else "-",
                    f"{statistics.median(times):.2f}" if timed else "-",
                    f"{measured['rss_mb']:.0f}",
                    f"{measured['cuda_mb']:.0f}" if measured.get("cuda_mb") is not None else "-",
                )
            )
    header = ("method", "bag", "time min s", "time median s", "step RSS MB", "CUDA MB")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(v).rjust(w) for v, w in zip(row, widths)))

    t_acc, t_full = timing["abmil_acc"], timing["full_bag"]
    full_mb = memory_full["memory"][0]["rss_mb"]
    acc_mb = [m["rss_mb"] for m in memory_acc["memory"]]
    paired = statistics.median(a / f for a, f in zip(t_acc, t_full))
    print(
        f"time ACC/full: min {min(t_acc) / min(t_full):.3f}, median "
        f"{statistics.median(t_acc) / statistics.median(t_full):.3f}, median of paired rounds "
        f"{paired:.3f} (target <= 1.35)"
    )
    print(f"step memory full/ACC at bag {args.bag}: {full_mb / acc_mb[0]:.2f}x (target >= 2.5)")
    if len(acc_mb) > 1:
        ratio = acc_mb[1] / acc_mb[0]
        print(f"ACC step memory bag {args.big_bag} / bag {args.bag}: {ratio:.3f} (target <= 1.2)")
    if memory_full["memory"][0].get("cuda_mb") is not None:
        cuda = [m["cuda_mb"] for m in memory_acc["memory"]]
        print(f"CUDA step memory full/ACC: {memory_full['memory'][0]['cuda_mb'] / cuda[0]:.2f}x")
    return 0


def _spawn(config: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    if config["mode"] == "memory":
        env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    code = (
        "import sys, json; from bigslide.bench.acc import worker; "
        "print(json.dumps(worker(json.loads(sys.argv[1]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(config)], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench worker {config} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def worker(config: dict[str, Any]) -> dict[str, Any]:
    """One measurement process (run by `run` in a subprocess)."""
    import torch

    device = torch.device(config["device"])
    if config.get("threads"):
        torch.set_num_threads(config["threads"])
    if config["mode"] == "time":
        methods = {name: _build(name, config, device) for name in ("full_bag", "abmil_acc")}
        batch = _batch(config["bag"], config["tile"], device)
        times: dict[str, list[float]] = {name: [] for name in methods}
        for repeat in range(config["repeats"] + 1):
            for name, (method, stepper) in methods.items():
                start = time.perf_counter()
                method.train_step(batch, stepper)
                _sync(device)
                if repeat:  # the first round is the warm-up
                    times[name].append(time.perf_counter() - start)
        return times

    method, stepper = _build(config["method"], config, device)
    batches = [_batch(n, config["tile"], device) for n in config["bags"]]
    method.train_step(batches[0], stepper)  # warm-up: kernels, optimizer state, gradient buffers
    results = []
    for batch in batches:
        gc.collect()
        _trim_heap()
        before = _rss_mb()
        _reset_high_water_mark()
        cuda_before = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            cuda_before = torch.cuda.memory_allocated(device)
        method.train_step(batch, stepper)
        _sync(device)
        measured: dict[str, float | None] = {"rss_mb": _peak_rss_mb() - before, "cuda_mb": None}
        if device.type == "cuda":
            measured["cuda_mb"] = (torch.cuda.max_memory_allocated(device) - cuda_before) / 2**20
        results.append(measured)
    return {"bags": config["bags"], "memory": results}


def _build(name: str, config: dict[str, Any], device: Any) -> tuple[Any, Any]:
    import torch

    import bigslide.methods.abmil_acc
    import bigslide.methods.mil_baselines  # noqa: F401  (registers the methods)
    from bigslide.engine.stepper import OptimStepper
    from bigslide.methods.base import ModelSpec, get_method, make_params

    values: dict[str, Any] = {"aggregator": config["aggregator"]}
    if name == "abmil_acc":
        values.update(chunk_size=config["chunk"], forward_chunk_size=config["forward_chunk"])
    spec = ModelSpec(backbone=config["backbone"], num_classes=2)
    torch.manual_seed(0)  # both methods start from the same weights
    method = get_method(name)(make_params(name, values), spec, device)
    method.model.train()
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=1e-6)
    return method, OptimStepper(optimizer, amp=config["amp"] or None, device=device)


def _batch(n: int, tile: int, device: Any) -> Any:
    import torch

    from bigslide.methods.base import Batch, Sample

    bag = torch.rand(n, 3, tile, tile, generator=torch.Generator().manual_seed(n)).to(device)
    return Batch(x=bag, y=torch.tensor([1], device=device), samples=[Sample(x=bag, y=1, slide="bench")])


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _status_mb(field: str) -> float | None:
    try:
        for line in HWM_FILE.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _rss_mb() -> float:
    value = _status_mb("VmRSS")
    return value if value is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_high_water_mark() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss_mb() -> float:
    value = _status_mb("VmHWM")
    return value if value is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
