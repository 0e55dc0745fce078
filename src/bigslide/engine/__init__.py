"""The training engine: config, the event-generator training loop, checkpoints, metrics and inference.

The loop and inference pull in PyTorch and timm: they load on first use, so reading or writing a config
(`bigslide.engine.config`, the napari panels' forms) does not wait for them.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bigslide.engine.cohort_score import CohortScore, score_cohort
    from bigslide.engine.config import (
        DataConfig,
        MethodConfig,
        ModelConfig,
        OptimConfig,
        RunConfig,
        TrainConfig,
    )
    from bigslide.engine.events import CheckpointSaved, Event, Loss, Message, Metrics, Progress
    from bigslide.engine.inference import load_trained, predict_slide, predict_slides
    from bigslide.engine.loop import RunResult, run_to_end, train
    from bigslide.engine.slide_prediction import SlidePrediction

_LAZY = {
    **dict.fromkeys(
        ("DataConfig", "MethodConfig", "ModelConfig", "OptimConfig", "RunConfig", "TrainConfig"),
        "bigslide.engine.config",
    ),
    **dict.fromkeys(
        ("CheckpointSaved", "Event", "Loss", "Message", "Metrics", "Progress"), "bigslide.engine.events"
    ),
    **dict.fromkeys(
        ("SlidePrediction", "load_trained", "predict_slide", "predict_slides"), "bigslide.engine.inference"
    ),
    **dict.fromkeys(("RunResult", "run_to_end", "train"), "bigslide.engine.loop"),
    **dict.fromkeys(("CohortScore", "score_cohort"), "bigslide.engine.cohort_score"),
}

__all__ = [
    "CheckpointSaved",
    "CohortScore",
    "DataConfig",
    "Event",
    "Loss",
    "Message",
    "MethodConfig",
    "Metrics",
    "ModelConfig",
    "OptimConfig",
    "Progress",
    "RunConfig",
    "RunResult",
    "SlidePrediction",
    "TrainConfig",
    "load_trained",
    "predict_slide",
    "predict_slides",
    "run_to_end",
    "score_cohort",
    "train",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bigslide.engine' has no attribute {name!r}")
