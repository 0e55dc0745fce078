"""`bigslide plan`: calibrate the methods on this machine, predict each candidate setting's peak at the
requested size and recommend the fastest one that fits the memory limit with a safety margin."""

from __future__ import annotations

import argparse
import time

import torch

from bigslide.errors import ConfigError
from bigslide.memory.meter import format_bytes, parse_size
from bigslide.memory.targets import CUDA_CONTEXT_BYTES, Candidate, Settings, Target
from bigslide.methods.base import available_methods, get_method
from bigslide.plan.arguments import add_arguments

__all__ = ["Candidate", "Target", "add_arguments", "plan_candidates", "recommend", "run"]


def methods_for(target: Target) -> list[str]:
    """The registered methods the target is about: one by name, or every method of the kinds asked for."""
    if target.method != "auto":
        needs_image = get_method(target.method).kind == "image"
        if needs_image and target.image <= 0:
            raise ConfigError(
                f"--image: {target.method} is an image method; give the image side, e.g. --image 4096"
            )
        if not needs_image and target.bag <= 0:
            raise ConfigError(
                f"--bag: {target.method} is a bag method; give the tiles per bag, e.g. --bag 512"
            )
        return [target.method]
    if target.image <= 0 and target.bag <= 0:
        raise ConfigError("plan: give --image SIDE (image methods) and/or --bag TILES (bag methods)")
    kinds = {"image"} if target.image > 0 else set()
    kinds |= {"bag"} if target.bag > 0 else set()
    return [name for name in available_methods() if get_method(name).kind in kinds]


def settings_for(target: Target) -> Settings:
    device = target.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device: cuda was asked for but torch sees no CUDA device")
    if target.dtype not in ("fp32", "bf16"):
        raise ConfigError(f"--dtype: {target.dtype!r} is not one of fp32, bf16")
    cap = target.cap_px or (1024 * 1024 if device == "cuda" else 256 * 256)
    dtype = torch.bfloat16 if target.dtype == "bf16" else None
    return Settings(backbone=target.backbone, device=device, autocast_dtype=dtype, cap_px=cap)


NO_CALIBRATION = "no calibration: this method does not describe its memory, so no peak is predicted"


def plan_candidates(target: Target, settings: Settings) -> list[Candidate]:
    """Calibrate each method in question and predict the peak of its candidate settings at the target."""
    out: list[Candidate] = []
    for name in methods_for(target):
        planned = get_method(name).plan(target, settings)
        if planned is None:
            out.append(Candidate(name, {}, 0, note=NO_CALIBRATION, rank=99))
        else:
            out += planned
    usable = target.usable_bytes
    for c in out:
        c.fits = c.peak <= usable
    return out


def recommend(candidates: list[Candidate]) -> Candidate | None:
    """The preferred method that fits; within it the fastest setting (fewest iterations / chunks / stages),
    and among equals the one with the largest budget (fewer partitions)."""
    fitting = [c for c in candidates if c.fits and c.peak > 0]
    if not fitting:
        return None
    return min(
        fitting,
        key=lambda c: (
            get_method(c.method).plan_preference,
            c.rank,
            -float(c.params.get("budget_mb", 0)),
        ),
    )


def override_string(candidate: Candidate, target: Target) -> str:
    parts = [f"--method {candidate.method}"]
    parts += [f"--set method.params.{k}={v}" for k, v in candidate.params.items()]
    if get_method(candidate.method).kind == "bag":
        parts += [f"--set data.tile_size={target.tile}", f"--set data.bag_size={target.bag}"]
    else:
        parts += [f"--set data.image_size={target.image}", f"--set data.batch_size={target.batch}"]
    if target.dtype == "bf16":
        parts.append("--set run.amp=bf16")
    return " ".join(parts)


def format_table(candidates: list[Candidate], target: Target) -> str:
    rows = [("method", "settings", "predicted peak", "fits", "note")]
    for c in candidates:
        note = c.note + (f" ({format_bytes(c.host)})" if c.host else "")
        peak = format_bytes(c.peak) if c.peak else "-"
        rows.append((c.method, c.describe(), peak, "yes" if c.fits else "no", note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def target_from_args(args: argparse.Namespace) -> Target:
    for name in ("image", "bag", "tile", "batch"):
        if getattr(args, name) < 0 or (name in ("tile", "batch") and getattr(args, name) < 1):
            raise ConfigError(f"--{name}: {getattr(args, name)} is not a valid size")
    if not 0 <= args.margin < 1:
        raise ConfigError(f"--margin: {args.margin} must be in [0, 1)")
    target = Target(
        gpu_bytes=parse_size(args.gpu_mem),
        backbone=args.backbone,
        image=args.image,
        batch=args.batch,
        tile=args.tile,
        bag=args.bag,
        method=args.method,
        dtype=args.dtype,
        device=args.device,
        margin=args.margin,
        cap_px=args.cap_px,
    )
    if target.usable_bytes <= 0:
        raise ConfigError(f"--gpu-mem: {args.gpu_mem} leaves nothing after the margin and the CUDA context")
    return target


def run(args: argparse.Namespace) -> int:
    target = target_from_args(args)
    settings = settings_for(target)
    methods_for(target)  # argument errors before the slow part
    start = time.perf_counter()
    candidates = plan_candidates(target, settings)
    elapsed = time.perf_counter() - start
    print(
        f"{target.backbone}, {target.dtype}, calibrated on {settings.device} in {elapsed:.0f} s; "
        f"limit {format_bytes(target.gpu_bytes)}, usable {format_bytes(target.usable_bytes)} "
        f"(margin {target.margin:.0%}, {format_bytes(CUDA_CONTEXT_BYTES)} CUDA context)"
    )
    print(format_table(candidates, target))
    best = recommend(candidates)
    if best is None:
        print("recommendation: nothing fits; use a smaller image/bag, bf16, or a device with more memory")
        return 1
    print(f"recommendation: {best.method} ({best.describe()}), predicted peak {format_bytes(best.peak)}")
    print(f"config: {override_string(best, target)}")
    return 0
