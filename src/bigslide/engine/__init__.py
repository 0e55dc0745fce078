"""The training engine: config, the event-generator training loop, checkpoints, metrics and inference."""

from bigslide.engine.config import DataConfig, MethodConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig
from bigslide.engine.events import CheckpointSaved, Event, Loss, Message, Metrics, Progress
from bigslide.engine.inference import SlidePrediction, load_trained, predict_slide, predict_slides
from bigslide.engine.loop import RunResult, run_to_end, train

__all__ = [
    "CheckpointSaved",
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
    "train",
]
