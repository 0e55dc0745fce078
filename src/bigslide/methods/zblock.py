"""The Z-block: one latent vector per image patch (PatchGD, Algorithm 2), and maps explaining it.

Geometry. An image of H x W pixels is cut into patches of `patch_size` pixels every `stride` pixels
(stride < patch = overlapping patches). Cell (r, c) of the Z-block covers image pixels rows
[r*stride, r*stride + patch) and columns [c*stride, c*stride + patch): one cell is `stride` image pixels
on a side, which is what a caller needs to place Z-block maps on the slide (multiply by the image's
downsample for level-0 pixels). An image whose size does not fit the grid exactly is padded at the bottom
and right, up to the next full patch, with `pad_value` (default 1.0 = white, the background of
brightfield slides), so no pixel is left out.

Layout. `Z[b, :, r, c]` is the encoding of the patch at row r, column c of image b: rows first, as the
image, never transposed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bigslide.errors import ConfigError
from bigslide.nn.backbones import normalised_in_place


@dataclass(frozen=True)
class PatchGrid:
    """Where the patches of an image lie: `rows` x `cols` patches of `patch` pixels every `stride` pixels."""

    patch: int
    stride: int
    rows: int
    cols: int

    @property
    def count(self) -> int:
        return self.rows * self.cols

    @property
    def padded_size(self) -> tuple[int, int]:
        """(height, width) the image is padded to so that every cell holds a full patch."""
        return (self.rows - 1) * self.stride + self.patch, (self.cols - 1) * self.stride + self.patch

    @classmethod
    def for_image(cls, height: int, width: int, patch_size: int, stride: int | None = None) -> PatchGrid:
        stride = stride or patch_size
        if patch_size < 1:
            raise ConfigError(f"method.params.patch_size: must be >= 1, got {patch_size}")
        if not 1 <= stride <= patch_size:
            raise ConfigError(
                f"method.params.stride: must be in [1, patch_size={patch_size}] (0 = patch size), "
                f"got {stride}; "
                "a stride above the patch size would leave pixels no patch sees"
            )
        rows = 1 + math.ceil(max(height - patch_size, 0) / stride)
        cols = 1 + math.ceil(max(width - patch_size, 0) / stride)
        return cls(patch_size, stride, rows, cols)


def pad_to_grid(images: torch.Tensor, grid: PatchGrid, pad_value: float = 1.0) -> torch.Tensor:
    """`images` (B, C, H, W) padded at the bottom and right to `grid.padded_size` (a no-op when it fits)."""
    height, width = grid.padded_size
    extra_h, extra_w = height - images.shape[-2], width - images.shape[-1]
    if extra_h == 0 and extra_w == 0:
        return images
    return F.pad(images, (0, extra_w, 0, extra_h), value=pad_value)


def patch_view(images: torch.Tensor, grid: PatchGrid) -> torch.Tensor:
    """A (B, rows, cols, C, p, p) view of padded `images` (no copy; overlapping patches share memory)."""
    p, s = grid.patch, grid.stride
    return images.unfold(2, p, s).unfold(3, p, s).permute(0, 2, 3, 1, 4, 5)


def gather_patches(
    patches: torch.Tensor, image_index: torch.Tensor, position: torch.Tensor, *, channels_last: bool = False
) -> torch.Tensor:
    """The patches at flat grid `position` (r * cols + c) of images `image_index`, as (N, C, p, p)."""
    cols = patches.shape[2]
    out = patches[image_index, position // cols, position % cols]
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out


@contextlib.contextmanager
def module_mode(module: nn.Module, training: bool | None) -> Iterator[None]:
    """Temporarily put `module` (all submodules) in train or eval mode; None leaves it as it is."""
    if training is None:
        yield
        return
    saved = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield
    finally:
        for m, mode in saved:
            m.training = mode


def encode_grid(
    encoder: nn.Module,
    patches: torch.Tensor,
    *,
    batch_size: int = 256,
    channels_last: bool = False,
) -> torch.Tensor:
    """Encode every patch of a `patch_view` without grad: (B, rows * cols, s), flat position r * cols + c.

    Patches are copied out of the view `batch_size` at a time, so memory stays at one encoder batch.
    Half-precision outputs (autocast) are stored in float32.
    """
    if batch_size < 1:
        raise ConfigError(f"method.params.fill_batch_size: must be >= 1, got {batch_size}")
    images, rows, cols = patches.shape[:3]
    per_image = rows * cols
    total = images * per_image
    flat = torch.arange(total, device=patches.device)
    out: torch.Tensor | None = None
    with torch.no_grad():
        for start in range(0, total, batch_size):
            index = flat[start : start + batch_size]
            batch = gather_patches(
                patches, index // per_image, index % per_image, channels_last=channels_last
            )
            module, batch = normalised_in_place(encoder, batch)  # the gathered copy is ours
            z = module(batch)
            del batch
            if out is None:
                dtype = torch.float32 if z.dtype in (torch.float16, torch.bfloat16) else z.dtype
                out = torch.empty(total, z.shape[1], dtype=dtype, device=z.device)
            out[start : start + len(index)] = z
    assert out is not None
    return out.view(images, per_image, -1)


def fill_z(
    encoder: nn.Module,
    images: torch.Tensor,
    patch_size: int,
    stride: int | None = None,
    *,
    batch_size: int = 256,
    pad_value: float = 1.0,
    channels_last: bool = False,
) -> torch.Tensor:
    """Z-filling (Algorithm 2): the encoding of every patch of `images` (B, C, H, W), as Z (B, s, rows, cols).

    `Z[b, :, r, c]` encodes image b's patch at rows [r*stride, r*stride + patch_size) and columns
    [c*stride, c*stride + patch_size); `stride` None or 0 means `patch_size` (no overlap). Images whose size
    does not fit the grid are padded at the bottom/right with `pad_value` (see the module docstring).
    Runs without grad, `batch_size` patches per encoder call, with the encoder in whatever mode it is in
    (callers choose: PatchGD fills in eval mode by default). The result is a channels-last view.
    """
    grid = PatchGrid.for_image(images.shape[-2], images.shape[-1], patch_size, stride)
    patches = patch_view(pad_to_grid(images, grid, pad_value), grid)
    flat = encode_grid(encoder, patches, batch_size=batch_size, channels_last=channels_last)
    return flat.view(images.shape[0], grid.rows, grid.cols, -1).permute(0, 3, 1, 2)


EVIDENCE_STEPS = 32  # steps of the path integral (integrated gradients); the head is small next to the fill


def zblock_maps(
    head: nn.Module,
    Z: torch.Tensor,
    target: int | None = None,
    score: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, np.ndarray]:
    """Explanations of one image's Z-block (s, rows, cols) or (1, s, rows, cols) for classifier `head`.

    - "norm" (rows, cols): L2 norm of each cell's latent vector.
    - "pca" (rows, cols, 3): the first three principal components of the cells' vectors as RGB, each
      scaled to [0, 1]; each component's sign puts its most extreme cell on the bright side.
    - "evidence" (rows, cols): integrated gradients of logit[target] with respect to Z, from a baseline
      Z-block whose every cell is the image's typical cell (the per-channel median of its cells), summed
      over channels. The cells' evidence adds up to logit(Z) - logit(baseline): what this image holds
      beyond uniform typical tissue, shared among the cells that hold it (plain gradient x input spreads a
      lesion's evidence over the grid: pooling lets any one lesion cell stand in for another, so no single
      cell's gradient is large). `target` None = predicted class; `score(logits) -> (B,)` explains that
      instead (a survival risk); no parameter gradients are left behind.
    Runs the head in the mode it is in (callers use eval mode).
    """
    block = Z.detach()
    if block.dim() == 3:
        block = block[None]
    if block.dim() != 4 or block.shape[0] != 1:
        raise ValueError(
            f"zblock_maps: expected Z of shape (s, rows, cols) or (1, s, rows, cols), got {tuple(Z.shape)}"
        )
    with torch.no_grad():
        cls = int(head(block)[0].argmax()) if target is None else int(target)

    def explained(logits: torch.Tensor) -> torch.Tensor:
        return score(logits)[0] if score is not None else logits[0, cls]

    baseline = block.flatten(2).median(dim=2).values[..., None, None].expand_as(block)
    difference = block - baseline
    mean_grad = torch.zeros_like(block)
    with torch.enable_grad():
        for step in range(EVIDENCE_STEPS):  # the midpoint rule: error falls as 1/steps²
            leaf = (baseline + difference * ((step + 0.5) / EVIDENCE_STEPS)).requires_grad_(True)
            (grad,) = torch.autograd.grad(explained(head(leaf)), leaf)
            mean_grad += grad / EVIDENCE_STEPS
    values = block[0].double()
    evidence = (difference[0].double() * mean_grad[0].double()).sum(0)
    return {
        "norm": values.norm(dim=0).cpu().numpy(),
        "pca": pca_rgb(values.cpu().numpy()),
        "evidence": evidence.cpu().numpy(),
    }


def pca_rgb(values: np.ndarray) -> np.ndarray:
    """(s, rows, cols) latent vectors -> (rows, cols, 3) in [0, 1]: top three principal components as RGB."""
    channels, rows, cols = values.shape
    samples = values.reshape(channels, rows * cols).T
    rgb = np.zeros((rows * cols, 3))
    n_components = min(3, rows * cols - 1, channels)
    if n_components >= 1:
        from sklearn.decomposition import PCA  # here: sklearn takes a second to import

        projected = PCA(n_components=n_components, svd_solver="full").fit_transform(samples)
        extreme = projected[np.abs(projected).argmax(axis=0), np.arange(n_components)]
        projected = projected * np.where(extreme < 0, -1.0, 1.0)
        low, high = projected.min(axis=0), projected.max(axis=0)
        span = np.where(high > low, high - low, 1.0)
        rgb[:, :n_components] = (projected - low) / span
    return rgb.reshape(rows, cols, 3)
