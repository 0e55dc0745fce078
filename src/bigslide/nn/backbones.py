"""Encoders from timm: any timm model name, with ImageNet normalisation built in.

Inputs everywhere in bigslide are RGB floats in [0, 1]; the encoder normalises them with the
backbone's own mean/std so pretrained weights see what they were trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from bigslide.errors import ConfigError


class Normalize(nn.Module):
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def forward_(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` in place, for a float batch the caller copied out for this call: no second copy."""
        return x.sub_(self.mean).div_(self.std)


class Encoder(nn.Module):
    """`normalize` then a timm backbone with its classifier removed: (B, 3, H, W) -> (B, dim)."""

    def __init__(self, backbone: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.backbone = backbone
        self.dim: int = int(getattr(backbone, "num_features"))  # noqa: B009 (typed as Tensor | Module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.normalize(x))


class NoEncoder(nn.Module):
    """Stands in for the encoder of a MIL head trained on features another tool's encoder computed: it holds
    no weights, only the features' width, and cannot encode tiles."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ConfigError(
            "this model was trained on features another tool stored (data.features_foreign): it has no "
            "encoder of its own, so every slide needs a feature file in data.features"
        )


def normalised_in_place(encoder: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    """(module, input) giving `encoder(x)`: for an `Encoder` and a float `x` the caller owns and gives up (a
    fresh copy made for this call), `x` normalised in place and the backbone, so that the batch is not held
    twice (raw and normalised) while the backbone runs; otherwise `encoder` and `x` unchanged."""
    if not isinstance(encoder, Encoder) or type(encoder.normalize) is not Normalize:
        return encoder, x
    norm: Normalize = encoder.normalize
    if x.is_floating_point() and torch.promote_types(x.dtype, norm.mean.dtype) == x.dtype:
        return encoder.backbone, norm.forward_(x)
    return encoder, x


def create_encoder(
    name: str,
    *,
    pretrained: bool = False,
    weights: str | Path | None = None,
    out_dim: int | None = None,
    **timm_kwargs: Any,
) -> Encoder:
    """A timm backbone by name as an `Encoder`.

    `pretrained=True` uses timm's hub weights; `weights` loads a local state dict (timm naming) instead.
    `out_dim` adds a linear projection to that size (timm's `num_classes`), e.g. PatchGD's latent size.
    """
    try:
        backbone = timm.create_model(
            name, pretrained=pretrained and weights is None, num_classes=out_dim or 0, **timm_kwargs
        )
    except RuntimeError as err:  # timm raises RuntimeError for unknown names
        raise ConfigError(f"model.backbone: {err}") from None
    if weights is not None:
        path = Path(weights)
        if not path.is_file():
            raise ConfigError(f"model.weights: no such file {path}")
        state = torch.load(path, map_location="cpu", weights_only=True)
        missing, unexpected = backbone.load_state_dict(state, strict=False)
        ignorable = {k for k in missing if k.startswith(("fc.", "head", "classifier"))}
        if set(missing) - ignorable or unexpected:
            raise ConfigError(
                f"model.weights: {path} does not fit {name}: missing {sorted(set(missing) - ignorable)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
    cfg: dict[str, Any] = getattr(backbone, "pretrained_cfg", None) or {}
    mean = tuple(cfg.get("mean", (0.485, 0.456, 0.406)))
    std = tuple(cfg.get("std", (0.229, 0.224, 0.225)))
    encoder = Encoder(backbone, mean, std)
    if out_dim:
        encoder.dim = out_dim
    return encoder
