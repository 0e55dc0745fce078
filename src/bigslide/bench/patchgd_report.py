"""The PatchGD bench's tables: per image size against full-image GD, and against the upstream loop."""

from __future__ import annotations

import argparse
from typing import Any

from bigslide.bench.targets import Targets, min_median

MEMORY_TARGET = 0.10  # PatchGD / GD step memory at 2048² and above
TIME_TARGET = 0.9  # bigslide / upstream loop step time at the reference configuration (512²)
MEMORY_VS_REFERENCE = 1.0  # bigslide / upstream loop step memory, every reference size
MB = 2**20


def memory_label(device: str) -> str:
    if device.startswith("cuda"):
        return "CUDA peak allocated above the step's start, images included (MB)"
    return "host resident-set peak above the step's start, images included (MB)"


def print_sizes(
    args: argparse.Namespace, rows: list[tuple[int, dict[str, dict[str, Any]]]], targets: Targets
) -> None:
    where = f"{args.device}, amp {args.amp}" + (f", {args.threads} threads" if args.threads else "")
    print(
        f"\nPatchGD (patch {args.patch}, ε {args.epsilon}, fill batch {args.fill_batch_size}) vs "
        f"full-image GD: {args.backbone}, batch {args.batch}, Adam, {where}; {args.rounds} alternating "
        f"rounds of fresh processes; mem = {memory_label(args.device)}, median"
    )
    head = (
        f"{'size':>5} | {'method':<26} | {'s/step min / med':>17} | {'k x ζ':>8} | {'time / GD':>9} | "
        f"{'mem MB':>7} | {'mem / GD':>8}"
    )
    print(head)
    print("-" * len(head))
    for size, results in rows:
        gd = results.pop("full-image GD")
        if "error" in gd:
            print(f"{size:>5} | full-image GD failed: {gd['error']}")
            for label in results:
                if size >= 2048:
                    targets.fail(f"{label} memory / GD at {size}²")
            continue
        gd_t, gd_m = min_median(gd["times"]), min_median(gd["memory"])
        print(
            f"{size:>5} | {'full-image GD':<26} | {gd_t[0]:>7.2f} / {gd_t[1]:>7.2f} | {'':>8} | {1:>9.2f} | "
            f"{gd_m[1] / MB:>7.0f} | {1:>8.3f}"
        )
        ratios = []
        for label, result in results.items():
            if "error" in result:
                print(f"{size:>5} | {label} failed: {result['error']}")
                if size >= 2048:
                    targets.fail(f"{label} memory / GD at {size}²")
                continue
            t, m = min_median(result["times"]), min_median(result["memory"])
            print(
                f"{size:>5} | {label:<26} | {t[0]:>7.2f} / {t[1]:>7.2f} | "
                f"{result['k']:>3} x {result['zeta']:<4}| {t[1] / gd_t[1]:>9.2f} | {m[1] / MB:>7.0f} | "
                f"{m[1] / gd_m[1]:>8.3f}"
            )
            ratios.append((label, m[1] / gd_m[1]))
        if size >= 2048:
            for label, ratio in ratios:
                targets.check(f"{label} memory / GD at {size}²", ratio, MEMORY_TARGET)


def print_reference(
    args: argparse.Namespace, size: int, results: dict[str, dict[str, Any]], targets: Targets
) -> None:
    print(
        f"\nReference configuration at {size}²: patch 128, batch 2, sampling 1/8, ζ 8, ε 8, "
        f"{args.backbone}, latent 256, CNN head, Adam, {args.device}, amp {args.amp}; bigslide's PatchGD "
        f"beside the upstream training loop, {args.rounds} alternating rounds of fresh processes; "
        f"mem = {memory_label(args.device)}"
    )
    ours, loop = results["bigslide PatchGD"], results["upstream loop"]
    if "error" in ours or "error" in loop:
        print(f"failed: {ours.get('error') or loop.get('error')}")
        targets.fail(f"bigslide / upstream step memory at {size}²")
        if size == 512:
            targets.fail("bigslide / upstream step time at 512²")
        return
    print(
        f"{'side':<17} | {'s/step min / med':>17} | {'k x ζ':>8} | {'mem MB min / med':>17} | optimizer steps"
    )
    for name, result in results.items():
        t, m = min_median(result["times"]), min_median(result["memory"])
        line = (
            f"{name:<17} | {t[0]:>7.3f} / {t[1]:>7.3f} | {result['k']:>3} x {result['zeta']:<4}| "
            f"{m[0] / MB:>7.1f} / {m[1] / MB:>7.1f} | {result['steps']}"
        )
        if "reserved" in result:
            line += f" | CUDA reserved peak {min_median(result['reserved'])[1] / MB:.0f} MB"
        print(line)
    t_ours, t_loop = min_median(ours["times"]), min_median(loop["times"])
    m_ours, m_loop = min_median(ours["memory"]), min_median(loop["memory"])
    print(
        f"ratio bigslide / upstream: time min {t_ours[0] / t_loop[0]:.3f}, "
        f"median {t_ours[1] / t_loop[1]:.3f}; "
        f"memory min {m_ours[0] / m_loop[0]:.3f}, median {m_ours[1] / m_loop[1]:.3f}"
    )
    targets.check(
        f"bigslide / upstream step memory (median) at {size}²", m_ours[1] / m_loop[1], MEMORY_VS_REFERENCE
    )
    if size == 512:
        targets.check("bigslide / upstream step time (median) at 512²", t_ours[1] / t_loop[1], TIME_TARGET)
