"""Checks on a timm model bigslide builds as an encoder, with what to do when it cannot be one: an
architecture this timm lacks, a hub configuration that names no classifier, an input size the model
cannot take."""

from __future__ import annotations

from typing import Any

import timm
import torch
from torch import nn

from bigslide.errors import ConfigError


def unknown_to_timm(name: str, hub: dict[str, Any] | None, err: RuntimeError) -> str:
    """What a hub model's RuntimeError from timm says: an architecture its config.json names that this
    timm has not, named with the cure; timm's own words for any other error."""
    if hub is None or not str(err).startswith("Unknown model"):
        return str(err)
    return (
        f"{name}: its config.json names the architecture {hub['architecture']!r}, which timm "
        f"{timm.__version__} does not have: a newer timm may (pip install -U timm), or load the model in "
        "an nn.Module of your own and name that as model.backbone: package.module:factory"
    )


def hub_classifier(hub: dict[str, Any]) -> dict[str, Any]:
    """timm's `pretrained_cfg_overlay` naming the classifier of a hub model whose config.json names none,
    as timm's own configuration of its architecture does: timm leaves only a classifier it knows out of
    the published weights when the encoder gets a projection of its own (`num_classes`, PatchGD's
    latent size), and otherwise fails on the projection's missing weights."""
    if hub["pretrained_cfg"].get("classifier"):
        return {}
    try:
        default = timm.models.get_pretrained_cfg(hub["architecture"])
    except RuntimeError:
        return {}
    classifier = getattr(default, "classifier", None)
    return {"pretrained_cfg_overlay": {"classifier": classifier}} if classifier else {}


def check_tile_side(model: nn.Module, name: str, side: int) -> None:
    """A `ConfigError` when a timm model built for one input size, which timm cannot resize for it
    (MaxViT's and CoAtNet's windows), fails on tiles of `side` px; what to set instead."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if not cfg.get("fixed_input_size") or getattr(model, "dynamic_img_size", False):
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(2, 3, side, side))
    except Exception as err:
        size = cfg.get("input_size", (0, 0, 0))[-1]
        raise ConfigError(
            f"model.backbone: {name} is built for {size} px inputs and fails on the {side} px tiles of "
            f"data.tile_size ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}): set "
            f"data.tile_size: {size}, or build it for the tiles with model.backbone_args.img_size: {side} "
            "(published weights with position tables of its own size may then not fit)"
        ) from None
    finally:
        model.train(was_training)
