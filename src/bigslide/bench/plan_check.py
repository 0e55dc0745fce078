"""Memory planner check: `bigslide plan`'s predicted peaks against the measured peaks of the real steps.

Each method is calibrated on small inputs (up to `--cap-px` pixels with grad), exactly as `bigslide plan`
does, then its real training step runs at the target size and its peak is measured the same way
(`torch.cuda.max_memory_allocated` above the step's start on CUDA; live tensor bytes on the CPU). For
Big-Layer on CUDA the device peak is compared (the big activations live in host RAM).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from bigslide.plan.calibrate import (
    Settings,
    bag_batch,
    calibrate_abmil_acc,
    calibrate_biglayer,
    calibrate_full_bag,
    calibrate_full_image,
    calibrate_patchgd,
    image_batch,
    measured_peak,
    runner,
)

TOLERANCE = 0.15


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto)")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument(
        "--image", type=int, default=0, help="target image side (default: 2048 CUDA, 768 CPU)"
    )
    parser.add_argument("--tile", type=int, default=0, help="bag tile side (default: 224 CUDA, 64 CPU)")
    parser.add_argument("--bag", type=int, default=0, help="tiles per bag (default: 512 CUDA, 96 CPU)")
    parser.add_argument("--patch", type=int, default=0, help="PatchGD patch (default: 256 CUDA, 128 CPU)")
    parser.add_argument("--k", type=int, default=8, help="PatchGD patches per inner iteration")
    parser.add_argument(
        "--chunk", type=int, default=0, help="ABMIL-ACC replay chunk (default: 32 CUDA, 8 CPU)"
    )
    parser.add_argument("--cap-px", type=int, default=0, help="largest calibration input (default as plan)")


def _row(name: str, target: str, predicted: int, measured: int) -> bool:
    error = abs(predicted - measured) / measured
    ok = error <= TOLERANCE
    print(
        f"{name:<16} {target:<28} {predicted / 2**20:>11.1f} {measured / 2**20:>11.1f} "
        f"{100 * error:>7.1f} %  {'ok' if ok else 'MISSED'}",
        flush=True,
    )
    return ok


def run(args: argparse.Namespace) -> int:
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device == "cuda"
    image = args.image or (2048 if gpu else 768)
    tile = args.tile or (224 if gpu else 64)
    bag = args.bag or (512 if gpu else 96)
    patch = args.patch or (256 if gpu else 128)
    chunk = args.chunk or (32 if gpu else 8)
    settings = Settings(
        backbone=args.backbone, device=device, cap_px=args.cap_px or (1024 * 1024 if gpu else 128 * 128)
    )
    name = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"{args.backbone}, fp32, {name}, torch {torch.__version__}, calibration cap {settings.cap_px} px")
    print(f"{'method':<16} {'target':<28} {'predicted MiB':>11} {'measured MiB':>11} {'error':>9}")
    input_image = 12 * image * image
    input_bag = 12 * bag * tile * tile
    checks: list[tuple[str, str, Callable[[], tuple[int, int]]]] = [
        (
            "full_image",
            f"{image}² image",
            lambda: (
                calibrate_full_image(settings, image).peak(input_bytes=input_image, px=image * image),
                measured_peak("full_image", {}, settings, image_batch(1, image, image, device)),
            ),
        ),
        (
            "full_bag",
            f"{bag} tiles of {tile}²",
            lambda: (
                calibrate_full_bag(settings, tile, bag).peak(input_bytes=input_bag, tiles=bag),
                measured_peak("full_bag", {}, settings, bag_batch(bag, tile, device)),
            ),
        ),
        (
            f"abmil_acc c{chunk}",
            f"{bag} tiles of {tile}²",
            lambda: (
                calibrate_abmil_acc(settings, tile, chunk).peak(
                    tiles=bag, chunk=chunk, input_bytes=input_bag
                ),
                measured_peak("abmil_acc", {"chunk_size": chunk}, settings, bag_batch(bag, tile, device)),
            ),
        ),
        ("patchgd", f"{image}², patch {patch}, k {args.k}", lambda: _patchgd(settings, image, patch, args.k)),
        ("biglayer_image 2", f"{image}² image", lambda: _biglayer(settings, image)),
    ]
    missed = 0
    for method, target, check in checks:
        try:
            predicted, measured = check()
        except torch.OutOfMemoryError:
            print(f"{method:<16} {target:<28} out of device memory while measuring")
            continue
        missed += not _row(method, target, predicted, measured)
        if gpu:
            torch.cuda.empty_cache()
    print(f"tolerance {100 * TOLERANCE:.0f} %: {'all within' if not missed else f'{missed} outside'}")
    return 0


def _patchgd(settings: Settings, image: int, patch: int, k: int) -> tuple[int, int]:
    model = calibrate_patchgd(settings, patch, k)
    fill = 64
    cells = (image // patch) ** 2
    values = {"patch_size": patch, "k": k, "fill_batch_size": fill, "inner_iterations": 2}
    measured = measured_peak("patchgd", values, settings, image_batch(1, image, image, settings.device))
    predicted = model.peak(images=1, cells=cells, k=k, fill_batch=fill, input_bytes=12 * image * image)
    return predicted, measured


def _biglayer(settings: Settings, image: int) -> tuple[int, int]:
    budget = 64 * 2**20
    model = calibrate_biglayer(settings, "biglayer_image", 2, image, params={"budget_mb": 64.0})
    batch = image_batch(1, image, image, "cpu")
    run = runner("biglayer_image", {"stages": 2, "budget_mb": 64.0}, settings)
    peaks = run.step(batch)
    if settings.device == "cuda":
        return model.device_peak(px=image * image, budget_bytes=budget), run.state + peaks.total
    return model.total_peak(
        px=image * image, input_bytes=12 * image * image
    ), run.state + 12 * image**2 + peaks.total
