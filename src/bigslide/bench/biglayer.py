"""Big-Layer runtime: time per training iteration versus input side, native against 1..N big stages.

Every configuration starts from the same ResNet weights and runs side by side in one process: for each
side and repeat, each configuration does one forward + backward in turn, so load changes on a shared
machine hit all of them alike. The per-configuration times are fitted with t(A) = a·A^b + c (A = side²,
as in the Big-Layers paper's Table 4) and plotted.

Targets, checked on this run's measurements: big / native median time <= 1.3 at every side and stage
count, and every partition a big layer placed on the device within `--budget-mb` (the largest set of
tensors one partition held, as recorded by `track_device_memory`).

Every configuration uses the same number of intra-op threads (`--threads`, default 1). On a small shared
machine a single thread measures compute cost; with every core requested, the threads of each parallel
region wait on cores that other jobs hold, which penalises many short kernels (partitions) over a few
long ones and makes the timings swing from run to run.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import numpy as np
import timm
import torch
from torch import nn

from bigslide.bench.targets import Targets, add_target_argument, machine_line
from bigslide.errors import ConfigError
from bigslide.nn.big import make_big, track_device_memory

TIME_TARGET = 1.3  # big / native median time per iteration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="resnet18", help="timm ResNet-family model (default resnet18)")
    parser.add_argument(
        "--sides", default="256,384,512,640,768", help="input sides in pixels, comma separated"
    )
    parser.add_argument("--stages", default="1,2,3", help="numbers of big stages to compare with native")
    parser.add_argument("--budget-mb", type=float, default=16.0, help="device budget per partition (MiB)")
    parser.add_argument("--batch", type=int, default=1, help="images per iteration")
    parser.add_argument("--repeats", type=int, default=5, help="timed iterations per side and configuration")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations per side and configuration")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads for every configuration (0: keep)"
    )
    parser.add_argument(
        "--device", default=None, help="compute device (default: cuda when present, else cpu)"
    )
    parser.add_argument("--out-dir", default="runs/bench", help="folder for the plot")
    parser.add_argument("--plot", default=None, help="plot path (default: <out-dir>/biglayer.png)")
    add_target_argument(parser)


def _parse_ints(text: str, name: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--{name}: expected comma-separated integers, got {text!r}") from None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _iteration(model: nn.Module, x: torch.Tensor, device: torch.device, native: bool) -> float:
    """Seconds for one forward + backward (the native model also pays for moving its input)."""
    _sync(device)
    start = time.perf_counter()
    out = model(x.to(device) if native else x)
    out.float().square().mean().backward()
    _sync(device)
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def power_law_fit(areas: np.ndarray, times: np.ndarray) -> dict[str, float]:
    """Fit t = a·A^b + c (a, b, c ≥ 0); R² and the doubling factor at the median area."""
    from scipy.optimize import curve_fit

    def law(a_: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
        return a * np.power(a_, b) + c

    scale = float(areas.max())
    x = areas / scale  # keeps a in a sane numeric range during the fit
    p0 = (float(times.max()), 1.0, float(times.min()) * 0.1)
    (a, b, c), _ = curve_fit(law, x, times, p0=p0, bounds=([0, 0, 0], [np.inf, 4, np.inf]), maxfev=20000)
    residual = float(np.sum((times - law(x, a, b, c)) ** 2))
    total = float(np.sum((times - times.mean()) ** 2)) or 1e-30
    median = float(np.median(x))
    return {
        "a": a / scale**b,
        "b": b,
        "c": c,
        "r2": 1 - residual / total,
        "doubling": float(law(np.array(2 * median), a, b, c) / law(np.array(median), a, b, c)),
        "n": float(len(times)),
    }


def _plot(
    path: Path,
    sides: list[int],
    results: dict[str, dict[int, list[float]]],
    fits: dict[str, dict[str, float]],
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, per_side in results.items():
        done = [s for s in sides if per_side.get(s)]
        if not done:
            continue
        low = np.array([min(per_side[s]) for s in done])
        median = np.array([statistics.median(per_side[s]) for s in done])
        high = np.array([max(per_side[s]) for s in done])
        (line,) = ax.plot(done, median, marker="o", linestyle="none", label=name)
        ax.fill_between(done, low, high, alpha=0.15, color=line.get_color())
        fit = fits.get(name)
        if fit:
            grid = np.linspace(min(done), max(done), 100)
            curve = fit["a"] * np.power(grid**2, fit["b"]) + fit["c"]
            ax.plot(grid, curve, linestyle="--", color=line.get_color(), linewidth=1)
    ax.set_xlabel("input side (px)")
    ax.set_ylabel("seconds per iteration (forward + backward)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(title="median, min-max band, fit t=aA^b+c", fontsize=8, title_fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    sides = _parse_ints(args.sides, "sides")
    stage_counts = _parse_ints(args.stages, "stages")
    if args.repeats < 1 or args.warmup < 0 or args.threads < 0:
        raise ConfigError("--repeats must be ≥ 1, --warmup and --threads ≥ 0")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    budget = int(args.budget_mb * 2**20)
    torch.manual_seed(0)
    # as training runs them (run.channels_last auto): channels-last on CUDA, inputs pinned there
    layout = torch.channels_last if device.type == "cuda" else torch.contiguous_format
    base = timm.create_model(args.model, num_classes=0).train().to(memory_format=layout)
    models: dict[str, tuple[nn.Module, bool]] = {"native": (copy.deepcopy(base).to(device), True)}
    for stages in stage_counts:
        big = make_big(copy.deepcopy(base), stages, budget).to(device)
        models[f"big{stages}"] = (big, False)
    results: dict[str, dict[int, list[float]]] = {name: {} for name in models}
    partitions: dict[str, dict[int, int]] = {name: {} for name in models if name != "native"}
    largest: dict[str, dict[int, int]] = {name: {} for name in partitions}
    title = (
        f"{args.model} on {device}, batch {args.batch}, budget {args.budget_mb:g} MiB, "
        f"{torch.get_num_threads()} thread(s), {args.repeats} repeats"
    )
    print(machine_line())
    print(title)
    for side in sides:
        x = torch.rand(args.batch, 3, side, side).contiguous(memory_format=layout)
        x = x.pin_memory() if device.type == "cuda" else x
        alive = dict(models)
        for repeat in range(args.warmup + args.repeats):
            # Rotate the order each repeat so no configuration always runs right after the same one.
            order = list(alive.items())
            shift = repeat % len(order)
            for name, (model, native) in order[shift:] + order[:shift]:
                try:
                    if repeat == 0 and name in partitions:
                        with track_device_memory() as meter:
                            seconds = _iteration(model, x, device, native)
                        partitions[name][side] = meter.partitions
                        largest[name][side] = meter.max_partition_bytes
                    else:
                        seconds = _iteration(model, x, device, native)
                except torch.OutOfMemoryError:
                    print(f"  {name} at {side}px: out of device memory")
                    del alive[name]
                    continue
                if repeat >= args.warmup:
                    results[name].setdefault(side, []).append(seconds)
    _print_table(sides, results, partitions, largest)
    fits = _print_fits(sides, results)
    plot = Path(args.plot) if args.plot else Path(args.out_dir) / "biglayer.png"
    _plot(plot, sides, results, fits, title)
    print(f"plot: {plot}")
    targets = Targets.from_args(args)
    for name in partitions:
        for side in sides:
            native_times, big_times = results["native"].get(side), results[name].get(side)
            if not native_times or not big_times:
                targets.fail(f"{name} / native time at {side}px (out of memory)")
                continue
            ratio = statistics.median(big_times) / statistics.median(native_times)
            targets.check(f"{name} / native time (median) at {side}px", ratio, TIME_TARGET)
        worst = max(largest[name].values(), default=0)
        targets.check(f"{name} largest partition on the device / budget", worst / budget, 1.0)
    return targets.exit_code()


def _print_table(
    sides: list[int],
    results: dict[str, dict[int, list[float]]],
    partitions: dict[str, dict[int, int]],
    largest: dict[str, dict[int, int]],
) -> None:
    names = list(results)
    big_names = [n for n in names if n != "native"]
    header = f"{'side':>6} " + " ".join(f"{n + ' min/med s':>18}" for n in names)
    header += " " + " ".join(f"{n + '/native min/med':>22}" for n in big_names)
    header += " " + " ".join(f"{n + ' parts':>11}" for n in big_names)
    header += " " + " ".join(f"{n + ' max MiB':>12}" for n in big_names)
    print(header)
    for side in sides:
        cells = []
        for name in names:
            times = results[name].get(side)
            cells.append(f"{min(times):8.3f}/{statistics.median(times):<8.3f}" if times else f"{'OOM':>17}")
        native = results["native"].get(side)
        for name in big_names:
            times = results[name].get(side)
            if times and native:
                ratio_min = min(times) / min(native)
                ratio_med = statistics.median(times) / statistics.median(native)
                cells.append(f"{ratio_min:11.2f}/{ratio_med:<10.2f}")
            else:
                cells.append(f"{'-':>22}")
        row = f"{side:>6} " + " ".join(f"{c:>18}" for c in cells)
        row += " " + " ".join(f"{partitions[n].get(side, 0):>11}" for n in big_names)
        row += " " + " ".join(f"{largest[n].get(side, 0) / 2**20:>12.2f}" for n in big_names)
        print(row)
    print(
        "parts: partitions the big layers ran in one forward + backward; max MiB: the largest set of tensors "
        "one partition held on the device (the meter counts a host partition as if it were copied)"
    )


def _print_fits(sides: list[int], results: dict[str, dict[int, list[float]]]) -> dict[str, dict[str, float]]:
    """Print and return the t = a·A^b + c fit of every configuration with at least three sides."""
    print(f"{'config':>8} {'n':>3} {'a':>10} {'b':>6} {'c':>10} {'R2':>6} {'F_dbl':>6}")
    fits: dict[str, dict[str, float]] = {}
    for name, per_side in results.items():
        areas = np.array([s * s for s in sides for _ in per_side.get(s, [])], dtype=float)
        times = np.array([t for s in sides for t in per_side.get(s, [])], dtype=float)
        if len({*areas}) < 3:
            print(f"{name:>8} {len(times):>3}  (fewer than 3 sides: no fit)")
            continue
        fit = fits[name] = power_law_fit(areas, times)
        print(
            f"{name:>8} {int(fit['n']):>3} {fit['a']:10.3e} {fit['b']:6.2f} {fit['c']:10.3e} "
            f"{fit['r2']:6.3f} {fit['doubling']:6.2f}"
        )
    return fits
