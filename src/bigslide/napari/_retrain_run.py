"""The retrain's work, run off the GUI thread by `bigslide.napari._retrain.RetrainBox`: the checkpoint's map
of the chosen slide (shown "before retraining"), the attention inside the annotated slides' outlines before
and after, and the fine-tune run between them."""

from __future__ import annotations

import threading
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bigslide.data.table import SlideTable
    from bigslide.engine.config import TrainConfig
    from bigslide.engine.loop import RunResult
    from bigslide.engine.slide_prediction import SlidePrediction
    from bigslide.napari._session import Session

BEFORE = "before retraining"
DRAWING_WAIT_S = 5.0
"""Longest the fine-tune waits for the viewer to draw the map before retraining (a few layers, made one
per event-loop turn), so that they are not made while training takes the cores."""


@dataclass(frozen=True)
class Retrained:
    result: RunResult
    summary: list[str]  # what the retrain changed, line by line (`retrain_summary`)


def retrain_run(
    checkpoint: Path,
    slide: str,
    config: TrainConfig,
    annotated: SlideTable,
    session: Session,
    before_drawn: threading.Event | None = None,
    **predict: Any,
) -> Generator[Any, None, Retrained]:
    """The checkpoint's map of the slide (yielded as (BEFORE, prediction)), the attention inside the
    outlines of the `annotated` slides, the fine-tune run's events, then the attention again; on the
    session's decode workers, started (on first use) by the thread running this. After BEFORE it waits
    (DRAWING_WAIT_S at most) for `before_drawn`: the viewer draws that map before training starts."""
    from bigslide.engine.events import Message
    from bigslide.engine.inference import predict_slide
    from bigslide.engine.loop import train
    from bigslide.engine.retrain_report import outline_shares, retrain_summary
    from bigslide.napari._train_widget import _limit_torch_threads
    from bigslide.tiling.annotations import read_annotations

    _limit_torch_threads()
    predict["processes"] = session.run_processes(config)
    drawn = {str(e.path): read_annotations(e.annotations) for e in annotated.entries if e.annotations}
    yield Message("Drawing the annotated slides' maps before retraining…")
    first = _annotated_predictions(checkpoint, annotated, predict)
    # the chosen slide is most often annotated: its map is drawn already
    chosen = next((p for p in first if Path(p.slide).resolve() == Path(slide).resolve()), None)
    if chosen is None:  # read at its own row's µm/px where the table gives one
        chosen = predict_slide(checkpoint, slide, **{**predict, "slide_mpp": session.fallback_mpp(slide)})
    yield BEFORE, chosen
    before = outline_shares(first, drawn)
    if before_drawn is not None:
        before_drawn.wait(DRAWING_WAIT_S)
    result = yield from train(config, processes=predict["processes"])
    after = []
    if result.checkpoint is not None:
        yield Message("Measuring the attention inside the outlines after retraining…")
        after = outline_shares(_annotated_predictions(result.checkpoint, annotated, predict), drawn)
    end_val = result.history[-1].get("val") if result.history else None
    return Retrained(result, retrain_summary(before, after, result.start_val, end_val))


def _annotated_predictions(
    checkpoint: Path, annotated: SlideTable, predict: dict[str, Any]
) -> list[SlidePrediction]:
    from bigslide.engine.inference import predict_slides

    if not annotated.entries:
        return []
    preds, _ = predict_slides(
        checkpoint,
        annotated,
        device=predict.get("device", "auto"),
        slide_mpp=predict.get("slide_mpp"),
        processes=predict.get("processes"),
    )
    return preds
