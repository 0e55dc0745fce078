"""PatchGD's parameters: the patch grid, how many patches each inner iteration re-encodes, the head
reading the Z-block, and the memory knobs (see `bigslide.methods.patchgd`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from bigslide.errors import ConfigError
from bigslide.methods.base import MethodParams


@dataclass
class PatchGDParams(MethodParams):
    patch_size: int = field(
        default=128, metadata={"label": "patch side (px)", "min": 1, "help": "Patch side in image pixels."}
    )
    stride: int = field(
        default=0,
        metadata={
            "label": "patch step (px, 0 = patch side)",
            "min": 0,
            "help": "Step between patches; 0 = patch size, less = overlap.",
        },
    )
    sampling: float = field(
        default=0.125,
        metadata={
            "label": "share of patches per inner step",
            "min": 1e-06,
            "max": 1.0,
            "help": "Fraction of an image's patches re-encoded per inner iteration.",
        },
    )
    k: int = field(
        default=0,
        metadata={
            "label": "patches per inner step (0 = from the share)",
            "min": 0,
            "help": "Patches re-encoded per image per inner iteration; > 0 overrides sampling.",
        },
    )
    inner_iterations: int = field(
        default=0,
        metadata={
            "label": "inner steps per batch (0 = every patch once)",
            "min": 0,
            "help": "Inner iterations ζ per batch; 0 = enough to cover every patch once.",
        },
    )
    epsilon: int = field(
        default=8,
        metadata={
            "label": "inner steps per optimizer step (ε)",
            "min": 1,
            "help": "Inner iterations ε accumulated per optimizer step.",
        },
    )
    latent_dim: int = field(
        default=256,
        metadata={"label": "Z-block width", "min": 1, "help": "Latent size s of one patch's Z vector."},
    )
    head: Literal["cnn", "transformer", "pool"] = field(
        default="cnn",
        metadata={
            "label": "head",
            "help": "Head reading the whole Z-block: the paper's CNN, one transformer layer, or pool "
            "(mean and max over the cells, then Linear; for encoders trained from random weights).",
        },
    )
    head_width: int = field(
        default=0,
        metadata={
            "label": "head width (0 = paper's)",
            "min": 0,
            "help": "Head channels; 0 = paper's (CNN 256, transformer 384).",
        },
    )
    head_dropout: float = field(
        default=0.2, metadata={"label": "head dropout", "min": 0, "max": 0.99, "help": "Dropout in the head."}
    )
    head_norm: Literal["batch", "group"] = field(
        default="batch",
        metadata={
            "label": "head normalisation",
            "help": "CNN head normalisation; 'group' also trains on 1x1 grids at batch 1.",
        },
    )
    fill_bn_mode: Literal["eval", "train"] = field(
        default="eval",
        metadata={
            "label": "encoder normalisation, filling the map",
            "help": "Encoder mode while filling Z (eval: exact per-patch encodings).",
        },
    )
    encoder_bn: Literal["train", "frozen"] = field(
        default="train",
        metadata={
            "label": "encoder normalisation, inner steps",
            "help": "Encoder BatchNorm in inner iterations; 'frozen' for small B·k.",
        },
    )
    fill_batch_size: int = field(
        default=256,
        metadata={
            "label": "patches per pass filling Z",
            "min": 1,
            "help": "Patches per encoder call when filling Z; a training step uses at most "
            "2·B·k, so its fill never needs more memory than an inner iteration.",
        },
    )
    grad_chunk: int = field(
        default=0,
        metadata={
            "label": "patches per pass with gradients (0 = all)",
            "min": 0,
            "help": "Patches per with-grad encoder call in an inner iteration; 0 = all B·k at once. "
            "Bounds memory at one extra no-grad pass; exact unless encoder BatchNorm trains.",
        },
    )
    pad_value: float = field(
        default=1.0,
        metadata={"label": "padding value", "help": "Value padding images to whole patches (1 = white)."},
    )
    channels_last: bool = field(
        default=True,
        metadata={
            "label": "channels-last memory",
            "help": "Feed patches in channels-last memory format (on the CPU, the late convolutions "
            "with large weights keep the standard layout: less memory, same speed).",
        },
    )

    def validate(self) -> None:
        checks = [
            ("patch_size", self.patch_size >= 1),
            ("stride", 0 <= self.stride <= self.patch_size),
            ("sampling", 0.0 < self.sampling <= 1.0),
            ("k", self.k >= 0),
            ("inner_iterations", self.inner_iterations >= 0),
            ("epsilon", self.epsilon >= 1),
            ("latent_dim", self.latent_dim >= 1),
            ("head_dropout", 0.0 <= self.head_dropout < 1.0),
            ("fill_batch_size", self.fill_batch_size >= 1),
            ("grad_chunk", self.grad_chunk >= 0),
        ]
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"method.params.{name}: invalid value {getattr(self, name)!r}")

    def patches_per_iteration(self, n_patches: int) -> int:
        """k for an image of `n_patches` patches (explicit k is capped at the image's patch count)."""
        k = self.k if self.k > 0 else math.ceil(self.sampling * n_patches - 1e-9)
        return max(1, min(k, n_patches))

    def training_fill_batch(self, images: int, k: int) -> int:
        """Patches per no-grad call when a training step fills Z: a no-grad pass holds a few activations
        per patch where a with-grad pass keeps them all (about 3.6x on resnet18), so 2·B·k patches stay
        below an inner iteration's peak (and a 2048² fill of 256 patches no longer sets the step's)."""
        return max(1, min(self.fill_batch_size, 2 * images * k))

    def iterations(self, n_patches: int) -> int:
        """ζ: explicit, or the fewest inner iterations covering every patch (⌈1/sampling⌉ for sampling)."""
        return self.inner_iterations or math.ceil(n_patches / self.patches_per_iteration(n_patches))
