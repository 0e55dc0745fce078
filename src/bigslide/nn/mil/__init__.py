"""MIL pooling heads: one bag of instance features (N, D) -> bag logits (1, C) and attention (N,)."""

from __future__ import annotations

from typing import Any, Literal

from bigslide.errors import ConfigError
from bigslide.nn.mil.abmil import ABMIL
from bigslide.nn.mil.base import Aggregator, AttentionPool, LossFn, bag_loss
from bigslide.nn.mil.dtfd import DTFD
from bigslide.nn.mil.transmil import TransMIL

AggregatorName = Literal["abmil", "abmil_gated", "transmil", "dtfd"]
AGGREGATORS: tuple[str, ...] = ("abmil", "abmil_gated", "transmil", "dtfd")


def make_aggregator(name: str, in_dim: int, num_classes: int, **kwargs: Any) -> Aggregator:
    """An aggregator by name. Keyword arguments go to its constructor (hidden, dropout, heads, ...)."""
    if name == "abmil":
        return ABMIL(in_dim, num_classes, gated=False, **kwargs)
    if name == "abmil_gated":
        return ABMIL(in_dim, num_classes, gated=True, **kwargs)
    if name == "transmil":
        return TransMIL(in_dim, num_classes, **kwargs)
    if name == "dtfd":
        return DTFD(in_dim, num_classes, **kwargs)
    raise ConfigError(f"method.params.aggregator: unknown aggregator {name!r}; choose one of {AGGREGATORS}")


__all__ = [
    "ABMIL",
    "AGGREGATORS",
    "DTFD",
    "Aggregator",
    "AggregatorName",
    "AttentionPool",
    "LossFn",
    "TransMIL",
    "bag_loss",
    "make_aggregator",
]
