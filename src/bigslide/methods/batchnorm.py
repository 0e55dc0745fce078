"""Frozen BatchNorm, and the `bn_mode` choice of the image methods (training batches of one or a few
slides).

"batch" (the default) trains with batch statistics and predicts with the running ones, the usual way,
sound when a batch mixes several slides. A batch of one image normalises every slide by its own
statistics, a function the running statistics do not reproduce at inference (the learning bench's
held-out slides ranked exactly inversely); "eval" trains and predicts with the running statistics
(not updated), so the trained function is the one evaluated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

from torch import nn

from bigslide.methods.replay import batchnorm_layers, batchnorm_mode

ImageBnMode = Literal["batch", "eval"]

IMAGE_BN_MODE_HELP = (
    "BatchNorm in training: batch statistics (needs batches of several slides) or "
    "eval = running statistics, not updated (batches of one or two images)"
)


@contextlib.contextmanager
def frozen_batchnorm(module: nn.Module, frozen: bool = True) -> Iterator[None]:
    """BatchNorm layers of `module` in eval mode (running statistics, not updated) inside the block."""
    with batchnorm_mode(module, False) if frozen else contextlib.nullcontext():
        yield


def freeze_batchnorm_affine(module: nn.Module) -> None:
    """Stop training the BatchNorm scales and shifts of `module` (bn_mode "frozen" of the MIL methods)."""
    for layer in batchnorm_layers(module):
        layer.requires_grad_(False)
