"""The UltraMNIST part: PatchGD at full size against full-image GD at the size of equal training memory
and at full size."""

from __future__ import annotations

import argparse
import gc

import torch

from bigslide.bench.learning.runs import ULTRAMNIST_DIGITS, ULTRAMNIST_PATCH, base_config, train_run
from bigslide.bench.memory import MEASURE_MEMORY, MEASURE_TIME, peak_rss_delta, set_mmap_threshold, trim_heap
from bigslide.data.sample import Batch
from bigslide.engine import TrainConfig
from bigslide.engine.setup import build_method, build_optimizer
from bigslide.memory.stepper import OptimStepper


def ultramnist_config(args: argparse.Namespace, method: str, size: int, seed: int, name: str) -> TrainConfig:
    config = base_config(args, name, method, seed)
    config.model.backbone = args.ultramnist_backbone
    config.data.source = "ultramnist"
    config.data.ultramnist_count = args.canvases
    # Digit task (3-5 glyphs of the label's digit; learnable from several hundred canvases on a CPU, where
    # the paper's digit sums need tens of thousands) with digits of 4-8 px on a 256² canvas: readable at
    # full size (GD at 256² learns them), gone when the canvas is shrunk 2x. Every size sees the same
    # canvases, drawn at --canvas and shrunk to `size`.
    config.data.ultramnist_task = "digit"
    config.data.ultramnist_smallest_digit, config.data.ultramnist_largest_digit = ULTRAMNIST_DIGITS
    config.data.ultramnist_canvas = args.canvas
    config.data.image_size = size
    config.data.batch_size = 2
    config.data.augment = False
    config.optim.lr = 1e-3
    config.optim.epochs = args.ultramnist_epochs
    if method == "patchgd":
        # Patches of 32 px (a digit of 4-8 px seldom straddles two), k patches per image per inner
        # iteration, one optimizer step per batch (epsilon = the inner iterations), as GD steps once per
        # batch. The pool head: the paper's CNN head, trained from random weights on this task, fits the
        # noise its normalisation makes of the encoder's first, near-identical cells (training loss above
        # ln 10 for all 15 epochs). The backbone has no BatchNorm, so each Z cell is its patch's encoding
        # alone, as GD's image is its own.
        cells = (args.canvas // ULTRAMNIST_PATCH) ** 2
        config.method.params = {
            "patch_size": ULTRAMNIST_PATCH,
            "k": args.ultramnist_k,
            "epsilon": -(-cells // args.ultramnist_k),
            "latent_dim": 64,
            "head": "pool",
        }
    return config


def step_memory(config: TrainConfig) -> int:
    """Peak rise of the resident set (bytes) over one training step of `config`'s method on a batch of
    random images of its size, after a warm-up step (optimizer state, gradient buffers)."""
    device = torch.device("cpu")
    torch.manual_seed(0)
    method = build_method(config, [str(c) for c in range(10)], device)
    method.model.train()
    stepper = OptimStepper(build_optimizer(config, method), device=device)
    side, batch = config.data.image_size, config.data.batch_size

    def step() -> None:
        images, labels = torch.rand(batch, 3, side, side), torch.randint(0, 10, (batch,))
        method.train_step(Batch(images, labels, []), stepper)

    step()
    gc.collect()
    trim_heap()
    set_mmap_threshold(MEASURE_MEMORY)  # large blocks mmapped: the resident set follows live tensors
    try:
        return peak_rss_delta(step)[1]
    finally:
        set_mmap_threshold(MEASURE_TIME)


def matched_side(args: argparse.Namespace) -> int:
    """The largest GD side (a multiple of 16) whose training step needs no more memory than PatchGD's at
    --canvas, both measured here."""
    patchgd = step_memory(ultramnist_config(args, "patchgd", args.canvas, 0, "memory"))
    best = 16
    for side in range(16, args.canvas + 1, 16):
        gd = step_memory(ultramnist_config(args, "full_image", side, 0, "memory"))
        mb = f"gd@{side}: {gd / 2**20:.1f} MB, patchgd@{args.canvas}: {patchgd / 2**20:.1f} MB"
        print(f"ultramnist step memory: {mb}", flush=True)
        if gd > patchgd:
            break
        best = side
    return best


def ultramnist_run(
    args: argparse.Namespace, method: str, size: int, seed: int, name: str
) -> dict[str, float]:
    config = ultramnist_config(args, method, size, seed, name)
    step = step_memory(config)
    history = train_run(config).history
    val = history[-1]["val"]
    return {"accuracy": val["accuracy"], "qwk": val["qwk"], "step_mb": step / 2**20}
