"""Calibration: run the real methods' training steps (and their pieces) on a few small inputs of the
requested backbone, measure their peaks with `PeakMeter`, and fit the models of `bigslide.memory.model`.

Calibration inputs grow up to `cap_px` pixels through the encoder with grad (the largest that runs in
seconds), but never past the target: the fit is then an interpolation whenever the target is small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bigslide.data.sample import Batch, Sample
from bigslide.memory.meter import MeasuringStepper, PeakMeter, PhasePeaks, state_bytes
from bigslide.memory.model import AccModel, BigLayerModel, LinearFit, PatchGDModel, StepModel
from bigslide.memory.targets import Settings
from bigslide.methods.base import Method, ModelSpec, get_method, make_params
from bigslide.nn.big.convert import split_stages


@dataclass
class Runner:
    """A method with its optimizer and measuring stepper, warmed up once (optimizer state exists)."""

    method: Method
    stepper: MeasuringStepper
    meter: PeakMeter
    warm: bool = False

    @property
    def state(self) -> int:
        return state_bytes(self.method.model, self.stepper.optimizer)

    def step(self, batch: Batch) -> PhasePeaks:
        self.method.model.train()
        if not self.warm:
            self.method.train_step(batch, self.stepper)
            self.warm = True
        with self.meter.measure() as peaks:
            self.method.train_step(batch, self.stepper)
        return peaks


def runner(name: str, values: dict[str, Any], settings: Settings) -> Runner:
    device = torch.device(settings.device)
    torch.manual_seed(0)
    spec = ModelSpec(backbone=settings.backbone, num_classes=settings.num_classes)
    method = get_method(name)(make_params(name, values), spec, device)
    optimizer = torch.optim.AdamW(method.trainable_parameters(), lr=1e-7)  # the engine's default optimizer
    meter = PeakMeter(device)
    return Runner(method, MeasuringStepper(optimizer, meter, settings.autocast_dtype), meter)


def image_batch(images: int, height: int, width: int, device: str) -> Batch:
    x = torch.rand(images, 3, height, width, generator=torch.Generator().manual_seed(height)).to(device)
    return Batch(x=x, y=torch.arange(images, device=device) % 2, samples=[])


def bag_batch(tiles: int, tile: int, device: str) -> Batch:
    x = torch.rand(tiles, 3, tile, tile, generator=torch.Generator().manual_seed(tiles)).to(device)
    return Batch(
        x=x, y=torch.ones(1, dtype=torch.long, device=device), samples=[Sample(x=x, y=1, slide="plan")]
    )


def calibration_points(target: int, cap: int, low: int = 1) -> list[int]:
    """Three (or more) distinct sizes up to min(target, cap), in the upper half where the input's own
    memory outweighs the fixed gradients (the regime the target is in)."""
    top = max(low, min(target, cap))
    points = sorted({max(low, math.ceil(top * f)) for f in (0.5, 0.75, 1.0)})
    while len(points) < 3:
        points.append(points[-1] + 1)
    return points


def fit_steps(
    run: Runner,
    unit: str,
    sizes: Sequence[int],
    batch_of: Callable[[int], Batch],
    units_of: Callable[[int], int],
) -> StepModel:
    peaks = [run.step(batch_of(size)) for size in sizes]
    compute = LinearFit.fit([{unit: units_of(s)} for s in sizes], [p.compute for p in peaks])
    return StepModel(run.state, compute, max(p.update for p in peaks))


def calibrate_full_image(
    settings: Settings, side: int, params: dict[str, Any] | None = None, *, name: str
) -> StepModel:
    """Method `name` trained on whole images in one graph. Units px: pixels per batch."""
    run = runner(name, dict(params or {}), settings)
    cap_side = max(32, int(math.sqrt(settings.cap_px)) // 32 * 32)
    sides = calibration_points(side, cap_side, low=32)
    return fit_steps(run, "px", sides, lambda s: image_batch(1, s, s, settings.device), lambda s: s * s)


def calibrate_full_bag(
    settings: Settings, tile: int, tiles: int, params: dict[str, Any] | None = None, *, name: str
) -> StepModel:
    """Method `name` trained on whole bags in one graph. Units tiles: tiles in the bag."""
    run = runner(name, dict(params or {}), settings)
    sizes = calibration_points(tiles, max(1, settings.cap_px // tile**2))
    return fit_steps(run, "tiles", sizes, lambda n: bag_batch(n, tile, settings.device), lambda n: n)


def _head_fit(
    head: nn.Module, shape_of: Callable[[int], tuple[int, ...]], sizes: Sequence[int], device: str
) -> LinearFit:
    """Forward + backward of a head alone on inputs that require grad (like Z in both methods)."""
    meter, peaks = PeakMeter(torch.device(device)), []
    for n in sizes:
        z = torch.randn(shape_of(n), device=device, requires_grad=True)
        with meter.measure() as peak:
            out = head(z)
            (out[0] if isinstance(out, tuple) else out).float().sum().backward()
        head.zero_grad(set_to_none=True)
        peaks.append(peak.total)
    return LinearFit.fit([{"n": n} for n in sizes], peaks)


def calibrate_abmil_acc(
    settings: Settings, tile: int, chunk: int, params: dict[str, Any] | None = None, *, name: str
) -> AccModel:
    """A chunked-replay MIL method `name` (params `chunk_size`, modules `encoder` and `aggregator`):
    replay peak per chunk from real steps on one-chunk bags; head peak per tile from the aggregator."""
    values = dict(params or {})
    sizes = calibration_points(chunk, max(1, settings.cap_px // tile**2))
    run = runner(name, values, settings)
    replays = []
    for c in sizes:
        run.method.params.chunk_size = c  # type: ignore[attr-defined]
        replays.append(run.step(bag_batch(c, tile, settings.device)))
    compute = LinearFit.fit([{"chunk": c} for c in sizes], [p.compute for p in replays])
    replay = StepModel(run.state, compute, max(p.update for p in replays))
    encoder = run.method.model.get_submodule("encoder")
    dim = int(getattr(encoder, "dim"))  # noqa: B009
    head = _head_fit(
        run.method.model.get_submodule("aggregator"), lambda n: (n, dim), (256, 512, 1024), settings.device
    )
    return AccModel(replay, LinearFit(head.fixed, {"tiles": head.slopes["n"]}), dim)


def calibrate_patchgd(
    settings: Settings, patch: int, k: int, params: dict[str, Any] | None = None, *, name: str
) -> PatchGDModel:
    """A Z-block method `name` (modules `encoder` and `head`). Inner-iteration peak per patch from real
    steps (one inner iteration, fill batch 1) on small grids;
    the fill's no-grad peak per patch from the real Z-filling; the head's peak per Z cell."""
    from bigslide.methods.zblock import PatchGrid, encode_grid, patch_view

    sizes = calibration_points(k, max(1, settings.cap_px // patch**2))
    values = {**(params or {}), "patch_size": patch, "inner_iterations": 1, "fill_batch_size": 1, "stride": 0}
    run = runner(name, values, settings)
    inner = []
    for kk in sizes:
        side = max(2, math.ceil(math.sqrt(kk)))
        run.method.params.k = kk  # type: ignore[attr-defined]
        inner.append(run.step(image_batch(1, side * patch, side * patch, settings.device)))
    compute = LinearFit.fit([{"k": kk} for kk in sizes], [p.compute for p in inner])
    step = StepModel(run.state, compute, max(p.update for p in inner))

    model = run.method.model
    encoder, head = model.get_submodule("encoder"), model.get_submodule("head")
    latent = int(run.method.params.latent_dim)  # type: ignore[attr-defined]
    meter, fills = PeakMeter(torch.device(settings.device)), []
    fill_sizes = (1, 2, 4)
    image = torch.rand(1, 3, 2 * patch, 2 * patch, device=settings.device)
    grid = PatchGrid.for_image(2 * patch, 2 * patch, patch)
    encoder.eval()
    for fb in fill_sizes:
        with meter.measure() as peak, run.stepper.autocast():
            encode_grid(encoder, patch_view(image, grid), batch_size=fb, channels_last=True)
        fills.append(peak.total - 4 * grid.count * latent)  # the Z buffer is added back per target
    fill = LinearFit.fit([{"fill": fb} for fb in fill_sizes], fills)
    head.train()
    return PatchGDModel(step, fill, _cells_fit(head, latent, settings.device), latent)


def _cells_fit(head: nn.Module, latent: int, device: str) -> LinearFit:
    sides = (4, 8, 12)
    meter, peaks = PeakMeter(torch.device(device)), []
    for side in sides:
        z = torch.randn(2, latent, side, side, device=device, requires_grad=True)  # 2: BatchNorm needs > 1
        with meter.measure() as peak:
            head(z).float().sum().backward()
        head.zero_grad(set_to_none=True)
        peaks.append(peak.total / 2)
    return LinearFit.fit([{"cells": s * s} for s in sides], peaks)


def calibrate_biglayer(
    settings: Settings,
    name: str,
    stages: int,
    side: int,
    tiles: int = 0,
    params: dict[str, Any] | None = None,
) -> BigLayerModel:
    """A Big-Layer method `name`: of kind image (units px = image pixels, `side` the image) or bag (px =
    tiles × tile pixels, `side` the tile, `tiles` the bag). Total: real steps; tail: the native layers
    after the big stages with the aggregator or classifier, forward + backward on the big part's output."""
    values = {**(params or {}), "stages": stages}
    run = runner(name, values, settings)
    if run.method.kind == "image":
        cap_side = max(32, int(math.sqrt(settings.cap_px)) // 32 * 32)
        sizes = calibration_points(side, cap_side, low=64)
        total = fit_steps(run, "px", sizes, lambda s: image_batch(1, s, s, "cpu"), lambda s: s * s)
        shapes = [(1, s, s) for s in sizes]
    else:
        sizes = calibration_points(tiles, max(2, settings.cap_px // side**2), low=2)
        total = fit_steps(run, "px", sizes, lambda n: bag_batch(n, side, "cpu"), lambda n: n * side * side)
        shapes = [(n, side, side) for n in sizes]
    tail = _tail_fit(run, stages, shapes, settings, total.update)
    return BigLayerModel(stages, tail, total)


def _tail_fit(
    run: Runner, stages: int, shapes: Sequence[tuple[int, int, int]], settings: Settings, update: int
) -> StepModel:
    import timm

    model = run.method.model
    backbone = model.get_submodule("encoder.backbone")
    native = timm.create_model(settings.backbone, num_classes=0).to(settings.device).train()
    probe = torch.zeros(1, 3, 64, 64, device=settings.device)
    big, layers = split_stages(native, stages)
    with torch.no_grad():
        big_out = nn.Sequential(*big)(probe)
    channels, scale = big_out.shape[1], 64 // big_out.shape[-1]
    head = model.get_submodule("head") if hasattr(model, "head") else model.get_submodule("aggregator")
    pool = getattr(backbone, "global_pool")  # noqa: B009

    def tail(x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            x = layer(x)
        out = head(pool(x))
        return out[0] if isinstance(out, tuple) else out

    meter, peaks = PeakMeter(torch.device(settings.device)), []
    for n, h, w in shapes:
        with meter.measure() as peak:
            x = torch.randn(n, channels, h // scale, w // scale, device=settings.device, requires_grad=True)
            tail(x).float().sum().backward()
        native.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        peaks.append(peak.total)
    compute = LinearFit.fit([{"px": n * h * w} for n, h, w in shapes], peaks)
    return StepModel(run.state, compute, update)


def measured_peak(name: str, values: dict[str, Any], settings: Settings, batch: Batch) -> int:
    """The real method's peak on `batch`, measured like the calibration: state + input + step peak."""
    run = runner(name, values, settings)
    peaks = run.step(batch)
    return run.state + batch.x.numel() * batch.x.element_size() + peaks.total
