"""`model.weights`: a local state dict loaded into a backbone, as other tools save one: a `.safetensors`
file or a torch file, the state dict itself or under "state_dict", "model" or "teacher" (a training
script's, Lightning's or DINO's checkpoint), its keys under the prefix of the module that held the
backbone there (`module.` for DistributedDataParallel, `backbone.`, `model.`, `encoder.backbone.` of a
bigslide checkpoint) or none."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bigslide.errors import ConfigError

WRAPPERS = ("state_dict", "model", "teacher")
"""Keys a checkpoint holds its state dict under, in the order they are looked for."""
PREFIX_DEPTH = 3
"""Dotted names a backbone's keys may be nested under (`model.backbone.`, `module.encoder.backbone.`)."""


def load_weights(backbone: nn.Module, path: Path, name: str) -> None:
    """`path`'s state dict into `backbone`; a `ConfigError` naming the file when it does not fit."""
    if not path.is_file():
        raise ConfigError(f"model.weights: no such file {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        # torch's own words for a pickled object are a page of advice to load it unsafely: not repeated
        pickled = isinstance(err, pickle.UnpicklingError)
        detail = "it pickles objects, not only tensors" if pickled else f"{type(err).__name__}: {err}"
        raise ConfigError(
            f"model.weights: {path} is not a state dict ({detail}); a model saved whole (torch.save(model)) "
            "is saved as one with torch.save(model.state_dict(), path)"
        ) from None
    for key in WRAPPERS:  # a training script's checkpoint around the state dict
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, dict):
        raise ConfigError(f"model.weights: {path} holds a {type(state).__name__}, not a state dict")
    own = backbone.state_dict()
    state = _under_prefix(state, set(own))
    # the file's classifier (ImageNet's 1,000 classes, another task's) is never the encoder's: left out
    heads = classifier_names(backbone)
    state = {k: v for k, v in state.items() if not under(k, heads)}
    misfit = [
        f"{k} {tuple(v.shape)} (the model's {tuple(own[k].shape)})"
        for k, v in state.items()
        if k in own and isinstance(v, torch.Tensor) and v.shape != own[k].shape
    ]
    if misfit:
        raise ConfigError(
            f"model.weights: {path} does not fit {name}: shapes differ for {', '.join(misfit[:5])}"
        )
    missing, unexpected = backbone.load_state_dict(state, strict=False)
    missing = [k for k in missing if not under(k, heads)]
    if missing or unexpected:
        raise ConfigError(
            f"model.weights: {path} does not fit {name}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )


def _under_prefix(state: dict[str, Any], own: set[str]) -> dict[str, Any]:
    """The entries of `state` under the dotted prefix whose keys, without it, name most of the model's own
    (the whole of `state` when no prefix names more than no prefix does): the backbone's weights in a
    checkpoint of a model that held it as `backbone`, `model.backbone`, ..., beside other modules."""
    hits: Counter[str] = Counter()
    for key in map(str, state):
        parts = key.split(".")
        for i in range(min(len(parts) - 1, PREFIX_DEPTH) + 1):
            if ".".join(parts[i:]) in own:
                hits[".".join(parts[:i]) + "." if i else ""] += 1
    best = min(hits, key=lambda prefix: (-hits[prefix], prefix), default="")
    if best == "" or hits[best] <= hits[""]:
        return state
    return {str(k)[len(best) :]: v for k, v in state.items() if str(k).startswith(best)}


def classifier_names(model: nn.Module) -> tuple[str, ...]:
    """The modules of `model` that are its classifier: as its timm configuration names them (`head.fc` for
    ConvNeXt, whose `head.norm` is not), else `fc`, `head` and `classifier`."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    named = cfg.get("classifier") if isinstance(cfg, dict) else None
    names = (named,) if isinstance(named, str) else tuple(named or ())
    return names or ("fc", "head", "classifier")


def under(key: str, modules: tuple[str, ...]) -> bool:
    return any(key == m or key.startswith(f"{m}.") for m in modules)
