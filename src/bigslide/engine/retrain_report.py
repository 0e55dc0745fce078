"""What a retrain with annotations changed, in words: per annotated slide, the share of the attention inside
its lesion outlines and inside its Not-lesion outlines, and the validation figures on the same validation
slides, each before -> after."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bigslide.engine.metric_words import SHOWN, why_missing
from bigslide.engine.slide_prediction import SlidePrediction
from bigslide.explain.attention_share import attention_share
from bigslide.tiling.annotations import NOT_LESION_NAMES, Annotation, canonical


@dataclass(frozen=True)
class OutlineShares:
    """Share of a slide's attention inside its lesion outlines and inside its Not-lesion outlines (None:
    the slide has no outline of that kind, or its map has no attention)."""

    slide: str
    lesion: float | None
    not_lesion: float | None


def outline_shares(
    predictions: Sequence[SlidePrediction], annotations: Mapping[str, Sequence[Annotation]]
) -> list[OutlineShares]:
    """`OutlineShares` of each predicted slide with an attention map, from its `annotations` (by path)."""
    out = []
    for pred in predictions:
        grid = pred.grids.get("attention")
        if grid is None or grid.is_rgb:
            continue
        drawn = annotations.get(str(pred.slide), ())
        lesion = [a.geometry for a in drawn if canonical(a.name) not in NOT_LESION_NAMES]
        other = [a.geometry for a in drawn if canonical(a.name) in NOT_LESION_NAMES]
        out.append(
            OutlineShares(str(pred.slide), attention_share(grid, lesion), attention_share(grid, other))
        )
    return out


def retrain_summary(
    before: Sequence[OutlineShares],
    after: Sequence[OutlineShares],
    start_val: Mapping[str, float] | None,
    end_val: Mapping[str, float] | None,
) -> list[str]:
    """Lines saying what the retrain changed: attention inside the outlines per slide, then validation."""
    lines = []
    later = {s.slide: s for s in after}
    for first in before:
        last = later.get(first.slide)
        if last is None:
            continue
        parts = [
            f"inside the {kind} outlines {_percent(a)} → {_percent(b)}"
            for kind, a, b in (
                ("lesion", first.lesion, last.lesion),
                ("Not-lesion", first.not_lesion, last.not_lesion),
            )
            if a is not None and b is not None
        ]
        if parts:
            lines.append(f"{Path(first.slide).name}: attention {'; '.join(parts)}.")
    if start_val is not None and end_val is not None:
        lines.append(_validation(start_val, end_val))
    return lines


def _validation(start: Mapping[str, float], end: Mapping[str, float]) -> str:
    shown, missing = [], []
    for key, words in SHOWN.items():
        if key not in start or key not in end:
            continue
        a, b = start[key], end[key]
        if math.isfinite(a) and math.isfinite(b):
            shown.append(f"{words} {a:.3f} → {b:.3f}")
        else:
            missing.append(f"{words} left out: {why_missing(key)}")
    text = "Validation, same slides, before → after: " + ("; ".join(shown) if shown else "no figure")
    return text + (f" ({'; '.join(missing)})" if missing else "") + "."


def _percent(share: float) -> str:
    return f"{100 * share:.0f} %"
