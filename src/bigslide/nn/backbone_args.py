"""What a backbone is built with beside its name: `model.backbone_args` (a value naming an object stands for
it), what known hub models' cards pass to timm, and the identity stored tile features record. It imports
nothing heavy itself (only the objects an argument names): a config is checked with it on any thread."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Mapping
from typing import Any

from bigslide.errors import ConfigError

HUB_PREFIXES = ("hf-hub:", "hf_hub:")
OBJECT_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*")
"""A `model.backbone_args` value naming an object to import: `package.module.Name`, `package.module:Name`."""

CARD_ARGUMENTS = {
    repo: {"mlp_layer": "timm.layers.SwiGLUPacked", "act_layer": "torch.nn.SiLU"}
    for repo in ("paige-ai/Virchow", "paige-ai/Virchow2")
}
"""What these hub models' cards pass to `timm.create_model` beside the name (their config.json cannot hold
layers): taken when `model.backbone_args` gives none, so that the name alone builds the published model."""


def card_arguments(name: str, args: Mapping[str, Any]) -> Mapping[str, Any]:
    """`args`, or, when they are empty, what the model card of hub model `name` passes (`CARD_ARGUMENTS`)."""
    if args or not name.startswith(HUB_PREFIXES):
        return args
    return CARD_ARGUMENTS.get(name.split(":", 1)[1], {})


def backbone_arguments(args: Mapping[str, Any]) -> dict[str, Any]:
    """`model.backbone_args` as the backbone's builder takes them: a string naming an object
    (`OBJECT_NAME`, e.g. `timm.layers.SwiGLUPacked`, `torch.nn.SiLU`) is that object, every other value
    is itself. A `ConfigError` names an argument whose object cannot be imported."""
    out = {}
    for key, value in args.items():
        if isinstance(value, str) and OBJECT_NAME.fullmatch(value):
            module_name, attr = value.rsplit(":", 1) if ":" in value else value.rsplit(".", 1)
            try:
                value = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as err:
                raise ConfigError(
                    f"model.backbone_args.{key}: {value} names no object that can be imported "
                    f"({type(err).__name__}: {err})"
                ) from None
        out[str(key)] = value
    return out


def encoder_identity(backbone: str, args: Mapping[str, Any]) -> str:
    """The backbone's name with its `model.backbone_args` (sorted; none: the name alone): what stored tile
    features were made with."""
    return f"{backbone} {json.dumps(dict(args), sort_keys=True, default=str)}" if args else backbone
