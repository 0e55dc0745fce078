"""Tile encoders from the Hugging Face hub (`hf-hub:org/name`), read from the local Hugging Face cache when
there is no network: how a checkpoint builds one without the hub (`hub_recipe`), which timm models the
cache holds (`cached_hub_models`), and words for why one cannot be read."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from bigslide.errors import ConfigError
from bigslide.nn.backbone_args import HUB_PREFIXES

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
"""A model's normalisation where it states none (timm's default)."""


@functools.lru_cache(maxsize=16)
def hub_recipe(name: str) -> dict[str, Any] | None:
    """For a Hugging Face hub name (`hf-hub:org/name`): what builds its model without the hub, from its
    `config.json` (the local cache first, as timm reads it): {"architecture", "model_args", "mean",
    "std", "pretrained_cfg"}; None for any other name. A `ConfigError` when it can be read from neither."""
    if not name.startswith(HUB_PREFIXES):
        return None
    from timm.models import load_model_config_from_hf

    repo = name.split(":", 1)[1]
    try:
        cfg, architecture, model_args = load_model_config_from_hf(repo)
    except Exception as err:  # huggingface_hub's errors: offline and not cached, no such repository
        raise ConfigError(f"model.backbone: {name}: {_not_timm(repo) or hub_error(err, name)}") from None
    return {
        "architecture": architecture,
        "model_args": dict(model_args or {}),
        "mean": list(cfg.get("mean", IMAGENET_MEAN)),
        "std": list(cfg.get("std", IMAGENET_STD)),
        # timm builds a hub model with its pretrained_cfg too: a ViT takes its img_size from input_size
        "pretrained_cfg": dict(cfg),
    }


def cached_hub_models() -> list[str]:
    """`hf-hub:ORG/NAME` of every timm model in the local Hugging Face cache (a snapshot whose config.json
    names a timm architecture), sorted: what a person can choose as model.backbone with no network."""
    from huggingface_hub import constants

    found = set()
    for config in Path(constants.HF_HUB_CACHE).glob("models--*/snapshots/*/config.json"):
        try:
            cfg = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(cfg, dict) and "architecture" in cfg:
            repo = config.parents[2].name.removeprefix("models--").replace("--", "/", 1)
            found.add(f"hf-hub:{repo}")
    return sorted(found)


def _not_timm(repo: str) -> str | None:
    """Why a repository whose configuration is in the local cache cannot be built by timm (another
    library's model, e.g. a transformers ViT); None when it is not cached or timm's own."""
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo, "config.json")
    if not isinstance(path, str):
        return None
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict) or "architecture" in cfg:
        return None
    kind = ", ".join(map(str, cfg.get("architectures") or [])) or cfg.get("model_type") or "another library's"
    return (
        f"it is in the Hugging Face cache, but it is not a timm model (its config.json describes a {kind} "
        "model): load it in an nn.Module of your own that returns one feature vector per tile, and name "
        "that as model.backbone: package.module:factory (the configuration guide shows one for a "
        "transformers ViT)"
    )


def hub_error(err: BaseException, name: str) -> str:
    from huggingface_hub import constants

    repo = name.split(":", 1)[1] if name.startswith(HUB_PREFIXES) else "ORG/NAME"
    return (
        f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''} (the model is read from the "
        f"Hugging Face cache, {constants.HF_HUB_CACHE} here (HF_HOME, else ~/.cache/huggingface), when "
        f"there is no network: download it there once, e.g. `huggingface-cli download {repo}`, on a machine "
        "that can)"
    )
