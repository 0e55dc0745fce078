"""Tile encoders: any timm model name, a timm model on the Hugging Face hub (`hf-hub:org/name`, read from
the local Hugging Face cache when there is no network), or a plain `nn.Module` of the user's own
(`package.module:factory`), with the backbone's normalisation built in. Arguments a model card passes to
`timm.create_model` beside the name (layers its config.json cannot hold) come as `model.backbone_args`; a
ViT built to return its tokens (timm's `global_pool=""`, as Virchow's config.json asks) gives one feature
vector per tile, its class token beside the mean of its patch tokens.

Inputs everywhere in bigslide are RGB floats in [0, 1]; the encoder normalises them with the
backbone's own mean/std (timm's `pretrained_cfg`; ImageNet's when the model states none) so pretrained
weights see what they were trained on.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from bigslide.errors import ConfigError
from bigslide.nn.backbone_args import HUB_PREFIXES
from bigslide.nn.hub_models import IMAGENET_MEAN, IMAGENET_STD, hub_error, hub_recipe
from bigslide.nn.timm_checks import check_tile_side, hub_classifier, unknown_to_timm
from bigslide.nn.weights_file import load_weights

PROBE_SIDE = 224
"""Side of the blank tiles a plain module's feature width is measured on when it does not state it."""


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
    """`normalize` then the backbone (a timm model without its classifier, or a plain module):
    (B, 3, H, W) -> (B, dim)."""

    def __init__(
        self, backbone: nn.Module, mean: tuple[float, ...], std: tuple[float, ...], dim: int | None = None
    ) -> None:
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.backbone = backbone
        self.dim: int = int(_pooled_width(backbone) if dim is None else dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.normalize(x))


def _pooled_width(backbone: nn.Module) -> int:
    """What a timm model without its classifier returns per tile: `head_hidden_size` where a layer after
    the pooling widens it (MobileNetV3's and GhostNet's head convolution: 1,024 or 1,280 values, not the
    `num_features` the pooling reads), else `num_features`."""
    wider = getattr(backbone, "head_hidden_size", None)
    return int(wider if isinstance(wider, int) else getattr(backbone, "num_features"))  # noqa: B009


class TokenPool(nn.Module):
    """A ViT that returns its tokens (B, N, C) as one feature vector per tile: its class token beside the mean
    of its patch tokens (registers left out), (B, 2C), as Virchow's model card embeds a tile; the mean alone,
    (B, C), for a ViT without a class token."""

    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        self.vit = vit
        self.prefix = int(getattr(vit, "num_prefix_tokens", 0))
        self.class_token = getattr(vit, "cls_token", None) is not None
        self.num_features = int(getattr(vit, "num_features")) * (2 if self.class_token else 1)  # noqa: B009
        self.pretrained_cfg = getattr(vit, "pretrained_cfg", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.vit(x)
        patches = tokens[:, self.prefix :].mean(dim=1)
        return torch.cat([tokens[:, 0], patches], dim=1) if self.class_token else patches


def _returns_tokens(model: nn.Module) -> bool:
    """Whether a timm model is built to return its tokens, unpooled (a ViT with `global_pool=""`)."""
    return getattr(model, "global_pool", None) == "" and hasattr(model, "num_prefix_tokens")


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
    recipe: dict[str, Any] | None = None,
    tile_side: int | None = None,
    **timm_kwargs: Any,
) -> Encoder:
    """An encoder by name (see the module's notes for the three kinds of name).

    `pretrained=True` uses the hub's weights (timm's, or the `hf-hub:` repository's); `weights` loads a
    local state dict instead (`weights_file`: other tools' files, wrappers and prefixes). `out_dim` adds
    a linear projection to that size (timm's `num_classes`), e.g. PatchGD's latent size. `recipe`: a hub
    encoder's `hub_recipe`, saved in a checkpoint: the model is built from it without the hub (its
    weights come from the checkpoint).
    `tile_side`: the side of the tiles it will encode, which a plain module's output is measured on
    (None: PROBE_SIDE) and a timm model of one input size is tried on.
    """
    dim = None
    if recipe is not None:
        args = {**recipe["model_args"], "num_classes": out_dim or 0, **timm_kwargs}
        if recipe.get("pretrained_cfg"):  # not in checkpoints written before it was kept
            args["pretrained_cfg"] = recipe["pretrained_cfg"]
        backbone = _timm_model(recipe["architecture"], pretrained=False, **args)
        mean, std = tuple(recipe["mean"]), tuple(recipe["std"])
    elif _is_import_path(name):
        backbone, dim = _plain_module(name, out_dim, weights, timm_kwargs, tile_side)
        weights = None  # loaded into the module itself, before any projection
        mean, std = _normalisation(backbone)
    else:
        hub = hub_recipe(name)  # the hub's configuration, or a ConfigError saying why it cannot be read
        if hub is not None and out_dim:
            timm_kwargs = {**hub_classifier(hub), **timm_kwargs}
        try:
            backbone = _timm_model(
                name, pretrained=pretrained and weights is None, num_classes=out_dim or 0, **timm_kwargs
            )
        except RuntimeError as err:  # timm raises RuntimeError for unknown names and misfit weights
            raise ConfigError(
                f"model.backbone: {_misfit(name, err) or unknown_to_timm(name, hub, err)}"
            ) from None
        except OSError as err:  # the hub's weights neither in the local cache nor reachable
            raise ConfigError(f"model.pretrained: {name}: {hub_error(err, name)}") from None
        mean, std = _normalisation(backbone)
    _check_normalisation(name, mean, std)
    if tile_side is not None and not _is_import_path(name):
        check_tile_side(backbone, name, tile_side)
    if weights is not None:
        load_weights(backbone, Path(weights), name)
    if _returns_tokens(backbone):
        if out_dim:
            backbone.reset_classifier(0)  # type: ignore[operator]  # projected after the pooling instead
        backbone = TokenPool(backbone)
        if out_dim:
            backbone, dim = nn.Sequential(backbone, nn.Linear(backbone.num_features, out_dim)), out_dim
    encoder = Encoder(backbone, mean, std, dim)
    if out_dim:
        encoder.dim = out_dim
    return encoder


def _misfit(name: str, err: RuntimeError) -> str | None:
    """Why a model's published weights did not load into the model its configuration builds, and the
    usual cure; None for any other error."""
    text = str(err)
    if "state_dict" not in text:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    detail = "; ".join(lines[1:3]) if len(lines) > 1 else lines[0]
    return (
        f"{name}: its weights do not fit the model its configuration builds ({detail}): a model whose card "
        "passes layers to timm.create_model beside its name needs them as model.backbone_args, e.g. "
        "{mlp_layer: timm.layers.SwiGLUPacked, act_layer: torch.nn.SiLU}, as UNI2-h's card passes them"
    )


def _normalisation(backbone: nn.Module) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of a timm-style `pretrained_cfg`; ImageNet's where the model states none."""
    cfg = getattr(backbone, "pretrained_cfg", None) or {}
    return tuple(cfg.get("mean", IMAGENET_MEAN)), tuple(cfg.get("std", IMAGENET_STD))


def _check_normalisation(name: str, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
    """A `ConfigError` where the mean/std a model states cannot normalise RGB in [0, 1] (bigslide's
    tiles): 0..255 values (mmcv's, Caffe's), other than 1 or 3 channels, a std that is not positive."""
    stated = f"model.backbone: {name} states mean {list(mean)}, std {list(std)} (its pretrained_cfg)"
    if len(mean) not in (1, 3) or len(std) not in (1, 3):
        raise ConfigError(f"{stated}: tiles are RGB, so 3 values each (or 1 for every channel)")
    if min(std) <= 0:
        raise ConfigError(f"{stated}: a std must be positive")
    if max(*mean, *std) > 1:
        raise ConfigError(
            f"{stated}: values for pixels in 0..255, but encoders get RGB in [0, 1]: divide them by 255"
        )


def _timm_model(name: str, **kwargs: Any) -> nn.Module:
    """timm's model; one with a fixed input size (a ViT) built to take tiles of any size
    (`dynamic_img_size`: its position embeddings resampled to the tile's grid of patches, unchanged at
    its own size), as pathology foundation models are used on 256 px tiles and on smaller ones; a tile
    whose side is no multiple of the patch size (64 px for DINOv2's 14 px patches) is padded to one
    (`dynamic_img_pad`; a tile of whole patches is unchanged)."""
    for extra in ({"dynamic_img_size": True, "dynamic_img_pad": True}, {"dynamic_img_size": True}):
        try:
            return timm.create_model(name, **{**extra, **kwargs})
        except TypeError:  # models that take any size have no such argument
            pass
    return timm.create_model(name, **kwargs)


def _is_import_path(name: str) -> bool:
    return ":" in name and not name.startswith(HUB_PREFIXES)


def _plain_module(
    name: str, out_dim: int | None, weights: str | Path | None, kwargs: dict[str, Any], side: int | None
) -> tuple[nn.Module, int]:
    """The module `package.module:factory` makes (a class or function called with `kwargs`; no
    arguments by default) with `weights` loaded, a feature map averaged to features, a linear projection
    to `out_dim` when asked, and its feature width, measured on blank tiles (`_measured_width`)."""
    module_name, _, attr = name.partition(":")
    # a script's own class: its checkpoint builds it only inside that script, not in predict or napari
    script = (
        "; one defined in a script (__main__) is not: move it into a module"
        if module_name == "__main__"
        else ""
    )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"model.backbone: {name}: {type(err).__name__}: {err} (a plain module is named "
            f"'package.module:factory', importable where bigslide runs{script})"
        ) from None
    if script:
        warnings.warn(
            f"model.backbone: {name} is defined in this script: `bigslide predict`, `heatmap` and napari "
            "cannot import it to build the checkpoint's encoder; move it into a module",
            UserWarning,
            stacklevel=3,
        )
    try:
        made = factory(**kwargs)
    except TypeError as err:
        if kwargs:  # for arguments it does not take: the callers may retry without them
            raise
        raise ConfigError(f"model.backbone: {name} failed: TypeError: {err}") from err
    except Exception as err:  # the user's own code: one line naming it, not its traceback
        raise ConfigError(f"model.backbone: {name} failed: {type(err).__name__}: {err}") from err
    if not isinstance(made, nn.Module):
        raise ConfigError(f"model.backbone: {name} returned a {type(made).__name__}, not a torch nn.Module")
    if weights is not None:
        load_weights(made, Path(weights), name)
    if _returns_tokens(made):
        made = TokenPool(made)
    stated = getattr(made, "num_features", None)
    dim, maps = _measured_width(made, name, stated if isinstance(stated, int) else None, side)
    if maps:  # a feature map (a torchvision trunk, a CNN without its head): averaged, as timm pools
        pooled = nn.Sequential(made, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        pooled.pretrained_cfg = getattr(made, "pretrained_cfg", None)  # type: ignore[assignment]
        made = pooled
    if out_dim:
        projected = nn.Sequential(made, nn.Linear(dim, out_dim))
        projected.pretrained_cfg = getattr(made, "pretrained_cfg", None)  # type: ignore[assignment]
        return projected, out_dim
    return made, dim


def _measured_width(module: nn.Module, name: str, stated: int | None, side: int | None) -> tuple[int, bool]:
    """The feature width of `module`'s output on two blank tiles of the run's `side` px (None: PROBE_SIDE;
    its mode restored; a lazy layer is sized by them), and whether that output is a (B, D, H, W) feature
    map rather than (B, D) features. `stated`: the module's own `num_features`, taken when it cannot run
    on PROBE_SIDE tiles; on the run's own it must run."""
    probe = side or PROBE_SIDE
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(torch.zeros(2, 3, probe, probe))
    except Exception as err:
        if stated is not None and side is None:
            return stated, False
        cure = (
            "choose a data.tile_size (PatchGD: method.params.patch_size) it takes"
            if side is not None
            else "give the module a `num_features` attribute (its output width) if it needs another tile size"
        )
        raise ConfigError(
            f"model.backbone: {name} failed on a (2, 3, {probe}, {probe}) batch of tiles "
            f"({type(err).__name__}: {err}); {cure}"
        ) from None
    finally:
        module.train(was_training)
    if not isinstance(out, torch.Tensor) or out.ndim not in (2, 4):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(
            f"model.backbone: {name} returns {shape} for a (2, 3, {probe}, {probe}) batch; an "
            "encoder returns (tiles, features) or a (tiles, channels, height, width) feature map: for tokens "
            "or a model output object, end it with the pooling you want (e.g. the class token)"
        )
    if out.dtype == torch.float64:  # the MIL heads and projections are float32
        raise ConfigError(f"model.backbone: {name} returns float64 features; end it with .float()")
    if stated is not None and stated != out.shape[1]:
        # a timm model made with its classifier states its features' width but returns class scores
        warnings.warn(
            f"model.backbone: {name} states num_features {stated} but returns {out.shape[1]} values per "
            "tile; those are used (class scores? build it without its classifier, e.g. timm's num_classes=0)",
            UserWarning,
            stacklevel=4,
        )
    return int(out.shape[1]), out.ndim == 4
