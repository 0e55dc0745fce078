"""PatchGD (Algorithms 1 and 2 of the PatchGD paper): end-to-end training on images too large for one pass.

Per outer batch: the Z-block of every image is filled without grad; then, for zeta inner iterations, k
patches per image (sampled independently per image, without replacement across the inner iterations) are
re-encoded with grad and written into the otherwise detached Z by an out-of-place scatter, so the gradient
reaches the encoder only through those k patches; the head reads the whole Z; loss / (accumulation group
size) is backpropagated, and the optimizer steps every epsilon inner iterations and once more for a
remainder group at the end, so every outer batch takes ceil(zeta / epsilon) steps. After each inner
iteration the new encodings (detached) stay in Z, as `Z[v] <- z` does in Algorithm 1, so later inner
iterations see them without re-encoding.

Batch-norm modes. The fill runs in eval mode by default: each Z entry is then exactly the encoding of its
patch alone (independent of which patches share a fill batch), the same as at inference, and the many
no-grad fill passes do not drag the running statistics. "train" fills with batch statistics of each fill
batch and updates the running statistics (the reference code's behaviour); it matches the inner iterations'
train-mode passes better while the running statistics are still poor (an encoder trained from scratch).
`encoder_bn="frozen"` keeps the encoder's BatchNorm in eval mode during the inner iterations too (needed
when B * k patches are too few for batch statistics, common when fine-tuning pretrained backbones with
small batches).

`grad_chunk` bounds an inner iteration's memory by a chunk of patches instead of all B·k: the k patches are
encoded without grad, the head's backward gives dL/dz, and the encoder is replayed chunk by chunk with grad
(`replay_backward`, as in ABMIL-ACC), at the cost of one extra no-grad pass over the k patches. It is exact
when the encoder's BatchNorm is frozen (or absent); with training BatchNorm each chunk is its own batch.

Mixed precision: forward passes run under `stepper.autocast()` (bf16/fp16 on CUDA); Z is kept in float32.

Z-block maps: `predict` returns `zblock_maps` on the patch grid; cell (r, c) covers image pixels
[r*stride, r*stride + patch) x [c*stride, c*stride + patch), i.e. one cell = `stride` image pixels.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from bigslide.data.sample import to_device
from bigslide.data.transfer import send
from bigslide.errors import ConfigError
from bigslide.methods.base import (
    Batch,
    Method,
    MethodParams,
    ModelSpec,
    Prediction,
    Sample,
    Stepper,
    StepResult,
    register,
)
from bigslide.methods.batchnorm import frozen_batchnorm
from bigslide.methods.encoder_layout import channels_last_encoder, rebuilt_in_backward
from bigslide.methods.patchgd_params import PatchGDParams
from bigslide.methods.replay import InexactGradientWarning, batchnorm_layers, replay_backward
from bigslide.methods.zblock import (
    PatchGrid,
    encode_grid,
    fill_z,
    gather_patches,
    module_mode,
    pad_to_grid,
    patch_view,
    zblock_maps,
)
from bigslide.nn.backbones import Encoder, normalised_in_place
from bigslide.nn.patchgd_heads import make_head

if TYPE_CHECKING:
    from bigslide.memory.targets import Candidate, Settings, Target

__all__ = ["PatchGD", "PatchGDModel", "PatchGDParams", "fill_z", "sample_positions", "zblock_maps"]


class PatchGDModel(nn.Module):
    """Encoder f_θ1 (patch -> s-vector) and head g_θ2 (Z-block -> logits), checkpointed together."""

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head


def sample_positions(
    n_patches: int, k: int, iterations: int, batch: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(iterations, batch, k) flat patch positions: each image draws its own random order and walks it k at a
    time, so any ⌈n/k⌉ consecutive iterations cover every patch; when an order runs out a fresh one is drawn,
    deferring the positions already in the current draw, so no draw repeats a position."""
    out = torch.empty(iterations, batch, k, dtype=torch.long)
    for b in range(batch):
        pool: list[int] = []
        for j in range(iterations):
            take, pool = pool[:k], pool[k:]
            if len(take) < k:
                fresh = torch.randperm(n_patches, generator=generator).tolist()
                chosen = set(take)
                fresh = [p for p in fresh if p not in chosen] + [p for p in fresh if p in chosen]
                need = k - len(take)
                take, pool = take + fresh[:need], fresh[need:]
            out[j, b] = torch.tensor(take)
    return out


@register
class PatchGD(Method[PatchGDParams]):
    name = "patchgd"
    display_name = "PatchGD"
    kind = "image"
    takes_uint8 = True
    Params = PatchGDParams
    summary = "Z-block of patch encodings; each inner step re-encodes k patches per image with grad."
    memory_params = ("k", "fill_batch_size")
    map_titles: ClassVar[dict[str, str]] = {
        "norm": "Z-block norm",
        "pca": "Z-block PCA",
        "evidence": "class evidence",
    }
    plan_preference = 2

    @classmethod
    def plan(cls, target: Target, settings: Settings) -> list[Candidate]:
        from bigslide.memory.targets import Candidate, powers_of_two
        from bigslide.methods.calibration import calibrate_patchgd

        patch = min(target.tile, target.image)
        side = math.ceil(target.image / patch)
        cells = side * side
        model = calibrate_patchgd(settings, patch, cells, name=cls.name)
        input_bytes = 12 * target.batch * (side * patch) ** 2
        out = []
        for k in powers_of_two(cells):
            for fill in [f for f in (256, 128, 64, 32, 16, 8, 4, 2, 1) if f <= target.batch * cells] or [1]:
                peak = model.peak(
                    images=target.batch, cells=cells, k=k, fill_batch=fill, input_bytes=input_bytes
                )
                if peak <= target.usable_bytes or fill == 1:
                    break
            iterations = math.ceil(cells / k)
            params = {"patch_size": patch, "k": k, "fill_batch_size": fill}
            out.append(
                Candidate(cls.name, params, peak, note=f"{iterations} inner iterations", rank=iterations)
            )
        return out

    model: PatchGDModel

    def __init__(self, params: MethodParams, spec: ModelSpec, device: torch.device) -> None:
        if not isinstance(params, PatchGDParams):
            raise ConfigError(f"method.params: PatchGD needs PatchGDParams, got {type(params).__name__}")
        params.validate()
        super().__init__(params, spec, device)
        # (ζ, B, k) flat positions re-encoded by the last train_step, for inspection.
        self.last_positions: torch.Tensor | None = None

    def build_model(self) -> nn.Module:
        p = self.params
        encoder = _patch_encoder(self.spec, p.latent_dim, p.patch_size)
        if p.channels_last:
            encoder = channels_last_encoder(encoder, host=self.device.type == "cpu")
        head = make_head(
            p.head,
            p.latent_dim,
            self.spec.outputs,
            width=p.head_width,
            dropout=p.head_dropout,
            norm=p.head_norm,
        )
        return PatchGDModel(encoder, head)

    def _grid(self, x: torch.Tensor) -> tuple[PatchGrid, torch.Tensor]:
        grid = PatchGrid.for_image(
            x.shape[-2], x.shape[-1], self.params.patch_size, self.params.stride or None
        )
        return grid, patch_view(pad_to_grid(x, grid, self.params.pad_value), grid)

    def train_step(self, batch: Batch, stepper: Stepper) -> StepResult:
        p = self.params
        x = to_device(batch.x, self.device, self.colour(batch.samples))
        y = send(batch.y, self.device).long()
        grid, patches = self._grid(x)
        encoder, head = self.model.encoder, self.model.head
        images, n = x.shape[0], grid.count
        k, iterations = p.patches_per_iteration(n), p.iterations(n)

        with stepper.autocast(), module_mode(encoder, p.fill_bn_mode == "train"):
            Z = encode_grid(
                encoder, patches, batch_size=p.training_fill_batch(images, k), channels_last=p.channels_last
            )
        positions = send(sample_positions(n, k, iterations, images), self.device)
        self.last_positions = positions
        image_index = torch.arange(images * k, device=self.device) // k  # 0 … 0, 1 … 1, k of each
        full_groups = iterations // p.epsilon * p.epsilon

        losses: list[torch.Tensor] = []
        logits = torch.empty(0)
        steps = 0
        shape = (images, grid.rows, grid.cols, -1)
        with frozen_batchnorm(encoder, p.encoder_bn == "frozen"):
            chunked = 0 < p.grad_chunk < images * k
            batch_stats = any(layer.training for layer in batchnorm_layers(encoder))
            if chunked and batch_stats:
                warnings.warn(
                    "method.params.grad_chunk with encoder_bn='train': BatchNorm normalises each chunk "
                    "alone, so the gradient differs from one pass over all B·k patches; "
                    "encoder_bn='frozen' is exact",
                    InexactGradientWarning,
                    stacklevel=2,
                )
            for j in range(iterations):
                where = (image_index, positions[j].reshape(-1))
                group = p.epsilon if j < full_groups else iterations - full_groups
                sampled = gather_patches(patches, *where, channels_last=p.channels_last)

                def head_loss(z: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
                    # Out of place: the gradient flows to this iteration's z only.
                    current = Z.index_put(where, z.to(Z.dtype))  # noqa: B023 (called in this iteration)
                    logits = head(current.view(shape).permute(0, 3, 1, 2))
                    loss = self.loss(logits, y)
                    return loss / group, (loss.detach(), logits.detach(), z.detach())  # noqa: B023

                if chunked:
                    _, (loss, logits, z) = replay_backward(
                        encoder,
                        sampled,
                        head_loss,
                        chunk_size=p.grad_chunk,
                        forward_chunk_size=p.fill_batch_size,
                        autocast=stepper.autocast,
                        backward=stepper.backward,
                        batch_stats=batch_stats,
                    )
                else:
                    # The encoder's input is rebuilt from the images in backward instead of being kept.
                    def rebuild(where: tuple[torch.Tensor, torch.Tensor] = where) -> torch.Tensor:
                        again = gather_patches(patches, *where, channels_last=p.channels_last)
                        return normalised_in_place(encoder, again)[1]

                    module, sampled = normalised_in_place(encoder, sampled)
                    with stepper.autocast(), rebuilt_in_backward(encoder, sampled, rebuild, patches):
                        scaled, (loss, logits, z) = head_loss(_encode(module, sampled))
                    del sampled, module
                    stepper.backward(scaled)
                Z.index_put_(where, z.to(Z.dtype))
                losses.append(loss)
                if (j + 1) % p.epsilon == 0 or j + 1 == iterations:
                    stepper.step()
                    steps += 1
        return StepResult(
            loss=torch.stack(losses).mean(), logits=logits.detach().float(), optimizer_steps=steps
        )

    def predict(self, sample: Sample) -> Prediction:
        """Z filled with every patch, the head on it, and the Z-block maps: evidence for class 1 (the
        positive class, as AUC counts it) when there are two classes, so a tumour map means the same on
        every slide, also on one the model calls normal; else for the predicted class."""
        x = to_device(sample.x[None], self.device, self.colour([sample]))
        Z = fill_z(
            self.model.encoder,
            x,
            self.params.patch_size,
            self.params.stride or None,
            batch_size=self.params.fill_batch_size,
            pad_value=self.params.pad_value,
            channels_last=self.params.channels_last,
        )
        with torch.no_grad():
            probs = self.outputs(self.model.head(Z))[0]
        target = 1 if len(probs) == 2 else int(probs.argmax())
        maps = zblock_maps(
            self.model.head, Z[0], target=target, score=self.score if self.explains_score else None
        )
        return Prediction(probs=probs.cpu().numpy(), maps=maps)


def _encode(encoder: nn.Module, patches: torch.Tensor) -> torch.Tensor:
    try:
        return encoder(patches)
    except ValueError as err:
        if "more than 1 value per channel" not in str(err):
            raise
        raise ConfigError(
            "method.params.encoder_bn: the encoder's BatchNorm cannot train on this few patches "
            f"({patches.shape[0]} per inner iteration); set encoder_bn='frozen' or raise k / the batch size"
        ) from None


def _patch_encoder(spec: ModelSpec, latent_dim: int, patch_size: int) -> Encoder:
    """The spec's encoder projecting each patch to `latent_dim`; models with a fixed input size (ViTs) are
    built for `patch_size` so their position embeddings fit, and a plain module's width is measured on
    patches, whose side it may depend on."""
    spec = dataclasses.replace(spec, tile_side=patch_size)
    try:
        return spec.encoder(latent_dim, img_size=patch_size)
    except TypeError:  # the model takes any input size and has no img_size argument
        return spec.encoder(latent_dim)
