"""`bigslide bench patchgd`: PatchGD against full-image GD and against the upstream loop, time and memory.

Every measurement runs in a fresh worker process, and the sides of a comparison alternate (`--rounds`
rounds, order rotated each round) so that load on a shared machine hits both; each side's steps of all
rounds are pooled into min and median. Both sides of a comparison get the same inputs (same seed), the same
backbone, precision (`--amp`), device and thread count.

Memory is what one training step adds to the process, counting its inputs: the worker records the memory
held before the step's images exist (the model, and the optimizer state of a warm-up step; gradient
buffers are not there, as each optimizer step frees them), then creates the images on the host, runs the
step (which moves them to the device) and reads the peak:
- CPU: host resident set (VmHWM, reset through /proc/self/clear_refs), with large blocks mmapped so that
  freed tensors leave the resident set. Timed steps follow with glibc's usual heap reuse.
- CUDA: `torch.cuda.max_memory_allocated` above the allocation before the step (the device copy of the
  images included), and the process's peak reserved by the caching allocator.

Tables: per image size, full-image GD vs PatchGD with the paper's sampling, a fixed k, and the paper's
sampling with grad chunks (target: PatchGD's memory <= 0.10 of GD's at 2048² and above); then bigslide's
PatchGD against the upstream training loop (`bigslide.bench.patchgd_reference`) at the reference
configuration (patch 128, batch 2, 1/8 sampling (k 2 at 512²), ζ 8, ε 8, latent 256, CNN head, Adam 1e-3)
at each `--reference-sizes` side (targets: memory <= the upstream loop's at every size, step time <= 0.9 of
it at 512²). The command exits 1 when a target is missed (`--no-targets`: report only).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bigslide.bench.memory import (
    MEASURE_MEMORY,
    MEASURE_TIME,
    peak_rss_bytes,
    reset_peak,
    rss_bytes,
    set_mmap_threshold,
    trim_heap,
)
from bigslide.bench.patchgd_report import MB, print_reference, print_sizes
from bigslide.bench.targets import Targets, add_target_argument, machine_line, min_median


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="*", default=[512, 1024, 2048], help="square image sizes")
    parser.add_argument("--patch", type=int, default=128, help="PatchGD patch size for the size table")
    parser.add_argument(
        "--sampling", type=float, default=0.125, help="PatchGD sampling fraction (paper: 1/8)"
    )
    parser.add_argument(
        "--fixed-k", type=int, default=2, help="also run PatchGD with this fixed k per image (0 = skip)"
    )
    parser.add_argument(
        "--grad-chunk",
        type=int,
        default=8,
        help="also run the sampling variant with this grad_chunk and frozen encoder BatchNorm (0 = skip)",
    )
    parser.add_argument("--epsilon", type=int, default=8, help="PatchGD inner iterations per optimizer step")
    parser.add_argument("--batch", type=int, default=1, help="images per batch in the size table")
    parser.add_argument(
        "--fill-batch-size", type=int, default=32, help="patches per Z-filling call (size table)"
    )
    parser.add_argument("--backbone", default="resnet18", help="encoder of both sides of every comparison")
    parser.add_argument("--repeats", type=int, default=3, help="measured steps per process and round")
    parser.add_argument("--large-repeats", type=int, default=1, help="measured steps for sizes >= 2048")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of fresh processes")
    parser.add_argument(
        "--reference-sizes",
        type=int,
        nargs="*",
        default=[512, 2048],
        help="sides for the comparison with the upstream loop (none: skip it)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--amp", choices=["none", "bf16"], default="none", help="mixed precision (CUDA only)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = torch's default")
    add_target_argument(parser)
    parser.add_argument("--worker", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.worker:
        print(json.dumps(_measure(json.loads(args.worker))))
        return 0
    print(machine_line(), flush=True)
    targets = Targets.from_args(args)
    common = {"device": args.device, "amp": args.amp, "threads": args.threads, "backbone": args.backbone}
    # (label, k, grad_chunk, encoder_bn)
    variants = [(f"sampling {args.sampling:g}", 0, 0, "train")]
    if args.fixed_k:
        variants.append((f"k = {args.fixed_k}", args.fixed_k, 0, "train"))
    if args.grad_chunk:
        variants.append((f"{args.sampling:g}, chunk {args.grad_chunk}", 0, args.grad_chunk, "frozen"))
    rows: list[tuple[int, dict[str, dict[str, Any]]]] = []
    for size in args.sizes:
        repeats = args.large_repeats if size >= 2048 else args.repeats
        shared = {**common, "size": size, "batch": args.batch, "repeats": repeats}
        configs = {"full-image GD": {**shared, "method": "full_image"}}
        for label, k, grad_chunk, encoder_bn in variants:
            configs[f"PatchGD, {label}"] = {
                **shared,
                "method": "patchgd",
                "patch": args.patch,
                "sampling": args.sampling,
                "k": k,
                "grad_chunk": grad_chunk,
                "encoder_bn": encoder_bn,
                "zeta": 0,
                "epsilon": args.epsilon,
                "fill_batch_size": args.fill_batch_size,
            }
        rows.append((size, alternate(configs, args.rounds)))
    if rows:
        print_sizes(args, rows, targets)
    for size in args.reference_sizes:
        repeats = args.large_repeats if size >= 2048 else args.repeats
        reference = {
            **common,
            "size": size,
            "batch": 2,
            "patch": 128,
            "sampling": 0.125,
            "zeta": 8,
            "epsilon": 8,
            "repeats": repeats,
        }
        configs = {
            "bigslide PatchGD": {
                **reference,
                "method": "patchgd",
                "k": 0,
                "grad_chunk": 0,
                "encoder_bn": "train",
                "fill_batch_size": 256,
            },
            "upstream loop": {**reference, "method": "reference_loop"},
        }
        print_reference(args, size, alternate(configs, args.rounds), targets)
    return targets.exit_code()


def alternate(configs: dict[str, dict[str, Any]], rounds: int) -> dict[str, dict[str, Any]]:
    """Each configuration in a fresh process per round, order rotated every round; results pooled."""
    names = list(configs)
    pooled: dict[str, dict[str, Any]] = {name: {} for name in names}
    for r in range(max(1, rounds)):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            result = _spawn(name, configs[name])
            into = pooled[name]
            if "error" in result or "error" in into:
                into.setdefault("error", result.get("error"))
                continue
            for key, value in result.items():
                if isinstance(value, list):
                    into.setdefault(key, []).extend(value)
                else:
                    into[key] = value
    return pooled


def _spawn(name: str, config: dict[str, Any]) -> dict[str, Any]:
    code = "import sys; from bigslide.bench.patchgd import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "--worker", json.dumps(config)],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=False,
    )
    what = f"{name} {config['size']}²"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        print(f"  {what}: failed: {last}", file=sys.stderr, flush=True)
        return {"error": last}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    low, mid = min_median(result["times"])
    peak = min_median(result["memory"])[1] / MB
    print(f"  {what}: {low:.3f} / {mid:.3f} s, {peak:.0f} MB", file=sys.stderr, flush=True)
    return result


def _build_step(config: dict[str, Any]) -> tuple[Callable[[Any, Any], int], Callable[[], dict[str, int]]]:
    """The worker's step function (images, labels) -> optimizer steps, and what it re-encoded (k, ζ)."""
    import torch

    from bigslide.bench.patchgd_reference import reference_step
    from bigslide.memory.stepper import OptimStepper
    from bigslide.methods.base import Batch, ModelSpec
    from bigslide.methods.full_image import FullImage, FullImageParams
    from bigslide.methods.patchgd import PatchGD, PatchGDParams

    torch.manual_seed(0)
    if config["method"] == "reference_loop":
        per_side = config["size"] // config["patch"]
        loop = reference_step(
            backbone=config["backbone"],
            patch=config["patch"],
            per_side=per_side,
            batch=config["batch"],
            sampling=config["sampling"],
            zeta=config["zeta"],
            epsilon=config["epsilon"],
            device=config["device"],
            amp=config["amp"],
        )
        k = math.ceil(per_side**2 * config["sampling"])
        zeta = min(config["zeta"], math.ceil(per_side**2 / k))
        return loop, lambda: {"k": k, "zeta": zeta}
    device = torch.device(config["device"])
    spec = ModelSpec(config["backbone"], num_classes=10)
    method: FullImage | PatchGD
    if config["method"] == "full_image":
        method = FullImage(FullImageParams(), spec, device)
    else:
        params = PatchGDParams(
            patch_size=config["patch"],
            sampling=config["sampling"],
            k=config["k"],
            inner_iterations=config["zeta"],
            epsilon=config["epsilon"],
            latent_dim=256,
            head="cnn",
            fill_batch_size=config["fill_batch_size"],
            grad_chunk=config["grad_chunk"],
            encoder_bn=config["encoder_bn"],
        )
        method = PatchGD(params, spec, device)
    method.model.train()
    amp = None if config["amp"] == "none" else config["amp"]
    stepper = OptimStepper(torch.optim.Adam(method.model.parameters(), lr=1e-3), amp=amp, device=device)

    def step(images: Any, labels: Any) -> int:
        return method.train_step(Batch(images, labels, []), stepper).optimizer_steps

    def sampled() -> dict[str, int]:
        if isinstance(method, PatchGD) and method.last_positions is not None:
            zeta, _, k = method.last_positions.shape
            return {"k": k, "zeta": zeta}
        return {}

    return step, sampled


def _measure(config: dict[str, Any]) -> dict[str, Any]:
    import torch

    if config["threads"]:
        torch.set_num_threads(config["threads"])
    device = torch.device(config["device"])
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = cuda  # fixed image sizes: as training (run.cudnn_benchmark auto)
    size, batch = config["size"], config["batch"]

    def inputs() -> tuple[torch.Tensor, torch.Tensor]:
        """The same images and labels for every side: host tensors, moved to the device by the step."""
        g = torch.Generator().manual_seed(size)
        images = torch.rand(batch, 3, size, size, generator=g)
        return (images.pin_memory() if cuda else images), torch.randint(0, 10, (batch,), generator=g)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    step, sampled = _build_step(config)
    # Memory first, with large blocks mmapped so the resident set follows live tensors; then timings
    # with glibc's usual heap reuse (mmapping every tensor would time page faults, not the method).
    set_mmap_threshold(MEASURE_MEMORY)
    steps = step(*inputs())  # warm-up: Adam's state, gradient buffers, kernels
    memory, reserved = [], []
    for _ in range(config["repeats"]):
        gc.collect()
        sync()
        trim_heap()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        else:
            before = rss_bytes()
            reset_peak()
        images, labels = inputs()
        step(images, labels)
        sync()
        del images, labels
        if cuda:
            memory.append(torch.cuda.max_memory_allocated(device) - before)
            reserved.append(torch.cuda.max_memory_reserved(device))
        else:
            memory.append(peak_rss_bytes() - before)
    set_mmap_threshold(MEASURE_TIME)
    step(*inputs())  # warm the heap for the timed steps
    times = []
    for _ in range(config["repeats"]):
        images, labels = inputs()
        sync()
        start = time.perf_counter()
        steps = step(images, labels)
        sync()
        times.append(time.perf_counter() - start)
    out: dict[str, Any] = {"times": times, "memory": memory, "steps": steps, **sampled()}
    if cuda:
        out["reserved"] = reserved
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bigslide bench patchgd", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
