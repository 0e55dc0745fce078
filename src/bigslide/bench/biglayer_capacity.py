"""Big-Layer capacity: the largest input side a ResNet trains at under a fixed CUDA memory cap, native vs big.

The cap is set with `torch.cuda.set_per_process_memory_fraction`, so the caching allocator raises
out-of-memory past it. For each configuration (native, then 1..N big stages) the side grows by doubling
until a training iteration (forward, backward, Adam step) fails, then a bisection to `--granularity`
pixels finds the largest side that trains. It then times iterations at the native model's largest side,
for every configuration, alternating repeat by repeat. Target: the deepest big configuration trains a
side >= 4x the native maximum; the command exits 1 when it does not (`--no-targets`: report only).
Needs CUDA: on the CPU there is no device memory to cap.
"""

from __future__ import annotations

import argparse
import copy
import gc
import time

import timm
import torch
from torch import nn

from bigslide.bench.targets import Targets, add_target_argument, machine_line, min_median
from bigslide.errors import ConfigError
from bigslide.nn.big import make_big


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="resnet18", help="timm ResNet-family model (default resnet18)")
    parser.add_argument("--cap-gb", type=float, default=2.0, help="CUDA memory cap in GiB (default 2)")
    parser.add_argument("--stages", default="1,2,3", help="numbers of big stages to compare with native")
    parser.add_argument("--budget-mb", type=float, default=256.0, help="device budget per partition (MiB)")
    parser.add_argument("--start", type=int, default=512, help="first side tried (px)")
    parser.add_argument("--max-side", type=int, default=8192, help="largest side tried (px; host RAM)")
    parser.add_argument("--granularity", type=int, default=128, help="bisection resolution (px)")
    parser.add_argument("--repeats", type=int, default=3, help="timed iterations at the native maximum")
    add_target_argument(parser)


SIDE_TARGET = 4.0  # deepest big configuration's largest side / native's


def _trains(model: nn.Module, side: int, native: bool, device: torch.device) -> bool:
    """One forward + backward + Adam step at `side`²; False on CUDA out-of-memory."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-6)
    try:
        x = torch.rand(1, 3, side, side).contiguous(memory_format=torch.channels_last).pin_memory()
        out = model(x.to(device, non_blocking=True) if native else x)
        out.float().square().mean().backward()
        optimizer.step()
        torch.cuda.synchronize(device)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        model.zero_grad(set_to_none=True)
        del optimizer
        gc.collect()
        torch.cuda.empty_cache()


def largest_side(
    model: nn.Module, native: bool, device: torch.device, start: int, limit: int, granularity: int
) -> tuple[int, bool]:
    """Largest side ≤ `limit` that trains, to `granularity` (0 if even `start` does not), and whether
    the search stopped at `limit` rather than at an out-of-memory."""
    low, high = 0, None
    side = start
    while side <= limit:
        if not _trains(model, side, native, device):
            high = side
            break
        low, side = side, side * 2
    if high is None:
        return low, True
    while high - low > granularity:
        mid = (low + high) // 2 // granularity * granularity
        if mid in (low, high):
            break
        if _trains(model, mid, native, device):
            low = mid
        else:
            high = mid
    return low, False


def _time(model: nn.Module, side: int, native: bool, device: torch.device) -> float:
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    ok = _trains(model, side, native, device)
    seconds = time.perf_counter() - start
    return seconds if ok else float("nan")


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise ConfigError("bench biglayer_capacity needs CUDA: the cap is on device memory")
    device = torch.device("cuda", torch.cuda.current_device())  # the cap needs an index
    stage_counts = [int(s) for s in args.stages.split(",") if s.strip()]
    cap = int(args.cap_gb * 2**30)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    torch.manual_seed(0)
    # as training runs them on CUDA (run.channels_last auto): channels-last, inputs pinned
    base = timm.create_model(args.model, num_classes=0).train().to(memory_format=torch.channels_last)
    configs: dict[str, tuple[nn.Module, bool]] = {"native": (copy.deepcopy(base).to(device), True)}
    for stages in stage_counts:
        big = make_big(copy.deepcopy(base), stages, int(args.budget_mb * 2**20)).to(device)
        configs[f"big{stages}"] = (big, False)
    print(machine_line())
    print(
        f"{args.model}, batch 1, CUDA cap {args.cap_gb:g} GiB of {total / 2**30:.0f}, "
        f"partition budget {args.budget_mb:g} MiB, {torch.cuda.get_device_name(device)}, "
        f"torch {torch.__version__}"
    )
    sides: dict[str, int] = {}
    for name, (model, native) in configs.items():
        started = time.perf_counter()
        sides[name], limited = largest_side(
            model, native, device, args.start, args.max_side, args.granularity
        )
        print(
            f"{name:>7}: largest trainable side {'>= ' if limited else ''}{sides[name]:>6} px "
            f"({sides[name] / max(sides['native'], 1):.2f}x native; "
            f"search {time.perf_counter() - started:.0f} s)",
            flush=True,
        )
    reference = sides["native"]
    if reference:
        print(
            f"\nseconds per iteration at the native maximum ({reference} px), min / median, ratio to native "
            "(configurations alternate each repeat):"
        )
        times: dict[str, list[float]] = {name: [] for name in configs}
        for repeat in range(args.repeats + 1):  # the first round warms up
            for name, (model, native) in configs.items():
                seconds = _time(model, reference, native, device)
                if repeat:
                    times[name].append(seconds)
        for name, values in times.items():
            low, mid = min_median(values)
            print(
                f"{name:>7}: {low:.3f} / {mid:.3f}  ({mid / min_median(times['native'])[1]:.2f}x)", flush=True
            )
    for name, (model, native) in configs.items():
        if name != "native" and sides[name]:
            seconds = _time(model, sides[name], native, device)
            print(f"{name:>7} at its maximum {sides[name]} px: {seconds:.3f} s per iteration", flush=True)
    return check_capacity(sides, f"big{max(stage_counts)}", Targets.from_args(args)) if stage_counts else 0


def check_capacity(sides: dict[str, int], deepest: str, targets: Targets) -> int:
    """The deepest big configuration's largest side against SIDE_TARGET x native's; the exit code."""
    if not sides.get("native"):
        targets.fail(f"{deepest} / native largest side (native trains no side)")
    else:
        targets.check(
            f"{deepest} / native largest side", sides[deepest] / sides["native"], SIDE_TARGET, at_most=False
        )
    return targets.exit_code()
