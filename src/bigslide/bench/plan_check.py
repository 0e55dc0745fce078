"""Memory planner check: `bigslide plan`'s predicted peaks against the measured peaks of the real steps.

Each method is calibrated on small inputs (up to `--cap-px` pixels with grad), exactly as `bigslide plan`
does, then its real training step runs at the target size and its peak is measured the same way
(`torch.cuda.max_memory_allocated` above the step's start on CUDA; live tensor bytes on the CPU). For
Big-Layer on CUDA the device peak is compared (the big activations live in host RAM). The command exits 1
when a prediction is off by more than the tolerance or a check could not be measured (`--no-targets`:
report only).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from bigslide.bench.targets import Targets, add_target_argument, machine_line
from bigslide.memory.model import BigLayerModel
from bigslide.methods.base import Batch
from bigslide.methods.calibration import (
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
    add_target_argument(parser)


def relative_error(predicted: int, measured: int) -> float:
    return abs(predicted - measured) / measured if measured > 0 else float("inf")


def _row(name: str, target: str, predicted: int, measured: int) -> float:
    error = relative_error(predicted, measured)
    print(
        f"{name:<16} {target:<28} {predicted / 2**20:>11.1f} {measured / 2**20:>11.1f} "
        f"{100 * error:>7.1f} %  {'ok' if error <= TOLERANCE else 'MISSED'}",
        flush=True,
    )
    return error


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
    print(machine_line())
    print(f"{args.backbone}, fp32, {name}, torch {torch.__version__}, calibration cap {settings.cap_px} px")
    print(f"{'method':<16} {'target':<28} {'predicted MiB':>11} {'measured MiB':>11} {'error':>9}")
    checks: list[tuple[str, str, Callable[[], tuple[int, int]]]] = [
        ("full_image", f"{image}² image", lambda: full_image_check(settings, image)),
        ("full_bag", f"{bag} tiles of {tile}²", lambda: full_bag_check(settings, tile, bag)),
        (
            f"abmil_acc c{chunk}",
            f"{bag} tiles of {tile}²",
            lambda: abmil_acc_check(settings, tile, bag, chunk),
        ),
        (
            "patchgd",
            f"{image}², patch {patch}, k {args.k}",
            lambda: patchgd_check(settings, image, patch, args.k, fill=64),
        ),
        ("biglayer_image 2", f"{image}² image", lambda: biglayer_image_check(settings, image, 2, 64.0)[:2]),
    ]
    errors: dict[str, float] = {}
    for method, target, check in checks:
        try:
            predicted, measured = check()
        except torch.OutOfMemoryError:
            print(f"{method:<16} {target:<28} out of device memory while measuring")
            errors[method] = float("nan")
            continue
        errors[method] = _row(method, target, predicted, measured)
        if gpu:
            torch.cuda.empty_cache()
    return verdicts(errors, Targets.from_args(args))


def verdicts(errors: dict[str, float], targets: Targets) -> int:
    """Each method's relative planner error against the tolerance (NaN: not measured, a miss); exit code."""
    for method, error in errors.items():
        targets.check(f"{method} planner error", error, TOLERANCE)
    return targets.exit_code()


# Each check calibrates like `bigslide plan`, then measures the real step at the target: (predicted,
# measured) peak bytes. The test suite runs the same checks at smaller targets.


def full_image_check(settings: Settings, image: int) -> tuple[int, int]:
    model = calibrate_full_image(settings, image, name="full_image")
    batch = image_batch(1, image, image, settings.device)
    predicted = model.peak(input_bytes=_bytes(batch), px=image * image)
    return predicted, measured_peak("full_image", {}, settings, batch)


def full_bag_check(settings: Settings, tile: int, bag: int) -> tuple[int, int]:
    model = calibrate_full_bag(settings, tile, bag, name="full_bag")
    batch = bag_batch(bag, tile, settings.device)
    predicted = model.peak(input_bytes=_bytes(batch), tiles=bag)
    return predicted, measured_peak("full_bag", {}, settings, batch)


def abmil_acc_check(settings: Settings, tile: int, bag: int, chunk: int) -> tuple[int, int]:
    model = calibrate_abmil_acc(settings, tile, chunk, name="abmil_acc")
    batch = bag_batch(bag, tile, settings.device)
    predicted = model.peak(tiles=bag, chunk=chunk, input_bytes=_bytes(batch))
    return predicted, measured_peak("abmil_acc", {"chunk_size": chunk}, settings, batch)


def patchgd_check(settings: Settings, image: int, patch: int, k: int, fill: int) -> tuple[int, int]:
    """Two inner iterations at the target, so the step also writes into an already filled Z."""
    model = calibrate_patchgd(settings, patch, k, name="patchgd")
    batch = image_batch(1, image, image, settings.device)
    cells = (image // patch) ** 2
    predicted = model.peak(images=1, cells=cells, k=k, fill_batch=fill, input_bytes=_bytes(batch))
    values = {"patch_size": patch, "k": k, "fill_batch_size": fill, "inner_iterations": 2}
    return predicted, measured_peak("patchgd", values, settings, batch)


def biglayer_image_check(
    settings: Settings, image: int, stages: int, budget_mb: float
) -> tuple[int, int, BigLayerModel]:
    """On CUDA the device peak (the input and the big activations stay on the host); on the CPU host +
    device together. The calibrated model comes back too, for a look at its fits."""
    values = {"stages": stages, "budget_mb": budget_mb}
    model = calibrate_biglayer(settings, "biglayer_image", stages, image, params={"budget_mb": budget_mb})
    batch = image_batch(1, image, image, "cpu")
    px = image * image
    if settings.device == "cuda":
        run = runner("biglayer_image", values, settings)
        measured = run.state + run.step(batch).total
        return model.device_peak(px=px, budget_bytes=int(budget_mb * 2**20)), measured, model
    measured = measured_peak("biglayer_image", values, settings, batch)
    return model.total_peak(px=px, input_bytes=_bytes(batch)), measured, model


def _bytes(batch: Batch) -> int:
    return batch.x.numel() * batch.x.element_size()
