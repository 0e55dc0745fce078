"""Inference: slide-level probabilities and heatmaps (attention or Z-block maps) on the level-0 grid."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bigslide.data.arrays import ArrayImageDataset
from bigslide.data.bags import BagDataset
from bigslide.data.endpoint import Endpoint
from bigslide.data.images import SlideImageDataset
from bigslide.data.loader import default_workers, load_item
from bigslide.data.sample import as_float
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.data.ultramnist import UltraMNIST
from bigslide.engine import setup
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.config import TrainConfig
from bigslide.engine.features import attach_feature_store
from bigslide.explain.heatmap import ScoreGrid
from bigslide.methods.base import Method, Prediction, Sample

SlideDataset = BagDataset | SlideImageDataset | UltraMNIST | ArrayImageDataset


@dataclass
class DatasetPredictions:
    labels: np.ndarray  # (n,) the targets as datasets give them ((n, 3) for survival)
    probs: np.ndarray  # (n, K) the endpoint's outputs (class probabilities for classes)
    grids: list[dict[str, ScoreGrid]] = field(default_factory=list)


def predict_sample(method: Method, sample: Sample) -> Prediction:
    method.model.eval()
    if not method.takes_uint8:
        sample = replace(sample, x=as_float(sample.x))
    return method.predict(sample)


def sample_grids(sample: Sample, pred: Prediction, mpp: tuple[float, float] | None) -> dict[str, ScoreGrid]:
    """The prediction's per-tile scores or patch-grid maps placed on the slide's level-0 grid."""
    if sample.coords is not None:
        per_tile = dict(pred.instance_maps)
        if pred.instance_scores is not None:
            per_tile = {"attention": pred.instance_scores, **per_tile}
        return {
            name: ScoreGrid.from_tiles(sample.coords, values, sample.tile_size_level0, mpp=mpp, name=name)
            for name, values in per_tile.items()
        }
    grids = {}
    for name, values in pred.maps.items():
        stride = pred.map_stride or sample.x.shape[-1] / values.shape[1]
        origin = (
            sample.origin[0] + pred.map_offset * sample.downsample,
            sample.origin[1] + pred.map_offset * sample.downsample,
        )
        grids[name] = ScoreGrid(values, stride * sample.downsample, origin, mpp, name)
    return grids


def predict_dataset(
    method: Method,
    dataset: SlideDataset,
    *,
    repeats: int = 1,
    with_grids: bool = False,
    workers: int | None = None,
    items: Sequence[int] | None = None,
) -> DatasetPredictions:
    """Predict every item (or the `items` given); bags average `repeats` sampled bags (Big-Layers §4.2.4),
    0 = all tiles at once.

    Tiles are decoded on `workers` threads (None: `default_workers()`).
    """
    n_workers = default_workers() if workers is None else workers
    with ThreadPoolExecutor(n_workers) if n_workers else nullcontext() as pool:
        return _predict_dataset(method, dataset, repeats, with_grids, pool, items)


def _predict_dataset(
    method: Method,
    dataset: SlideDataset,
    repeats: int,
    with_grids: bool,
    pool: Executor | None,
    items: Sequence[int] | None = None,
) -> DatasetPredictions:
    labels, probs, grids = [], [], []
    for i in range(len(dataset)) if items is None else items:
        if isinstance(dataset, BagDataset) and repeats > 0 and dataset.bag_size > 0:
            samples = [
                dataset.read_bag(i, dataset.tile_indices(i, repeat=1000 + k), pool) for k in range(repeats)
            ]
        elif isinstance(dataset, BagDataset):
            samples = [dataset.read_bag(i, np.arange(dataset.tile_count(i)), pool)]
        else:
            samples = [load_item(dataset, i, pool)]
        preds = [predict_sample(method, s) for s in samples]
        labels.append(samples[0].y)
        probs.append(np.mean([p.probs for p in preds], axis=0))
        if with_grids:
            assert not isinstance(dataset, UltraMNIST | ArrayImageDataset), "heatmaps are placed on slides"
            mpp = dataset.slides.open(Path(samples[0].slide)).mpp
            if samples[0].coords is not None:  # pool repeated bags into one grid per map
                coords = np.concatenate([s.coords for s in samples if s.coords is not None])
                scores = None
                if all(p.instance_scores is not None for p in preds):
                    scores = np.concatenate([p.instance_scores for p in preds])  # type: ignore[misc]
                maps = {
                    k: np.concatenate([p.instance_maps[k] for p in preds]) for k in preds[0].instance_maps
                }
                merged = Sample(
                    samples[0].x, samples[0].y, samples[0].slide, coords, samples[0].tile_size_level0
                )
                grids.append(sample_grids(merged, Prediction(preds[0].probs, scores, maps), mpp))
            else:
                grids.append(sample_grids(samples[0], preds[0], mpp))
    return DatasetPredictions(np.array(labels), np.array(probs), grids)


@dataclass
class SlidePrediction:
    slide: Path
    probs: np.ndarray
    classes: list[str]
    grids: dict[str, ScoreGrid]
    titles: dict[str, str] = field(default_factory=dict)  # heatmap name -> title, from the method
    epochs: int = 0  # epochs the checkpoint's weights were trained for
    endpoint: Endpoint | None = None  # None: classification into `classes`

    @property
    def task(self) -> str:
        return self.endpoint.task if self.endpoint is not None else "classification"

    @property
    def risk(self) -> float:
        """Survival: the predicted risk (higher = earlier event)."""
        assert self.endpoint is not None
        return float(self.endpoint.risk(self.probs)[0])

    @property
    def label(self) -> str:
        """The prediction in words: the class, the number, or the risk."""
        if self.task == "regression":
            return f"{float(self.probs[0]):.4g}"
        if self.task == "survival":
            return f"risk {self.risk:.3g}"
        return self.classes[int(np.argmax(self.probs))]


class Trained(NamedTuple):
    method: Method
    config: TrainConfig
    classes: list[str]
    epochs: int  # epochs the weights were trained for (the checkpoint's history)


def load_trained(checkpoint: str | Path, *, device: str = "auto") -> Trained:
    state = load_checkpoint(checkpoint)
    config = TrainConfig.from_dict(state["config"], source=f"{checkpoint}: config")
    classes = list(state["classes"])
    endpoint = Endpoint.from_state(state.get("endpoint"), classes)
    method = setup.build_method(config, endpoint, setup.resolve_device(device))
    method.model.load_state_dict(state["model"])
    method.model.eval()
    return Trained(method, config, classes, len(state.get("history", [])))


def predict_slides(
    checkpoint: str | Path,
    table: SlideTable,
    *,
    device: str = "auto",
    repeats: int = 0,
    slide_mpp: float | None = None,
) -> tuple[list[SlidePrediction], DatasetPredictions]:
    """Predict every slide of `table` with a trained checkpoint; bags use every tile when repeats = 0.

    Every slide is read at the checkpoint's resolution (its data.target_mpp and tile or image size), whatever
    its scanner's; `slide_mpp` is the level-0 µm/px of slides whose files state none.
    """
    method, config, classes, epochs = load_trained(checkpoint, device=device)
    endpoint = method.spec.endpoint or Endpoint(classes=classes)
    table = SlideTable(
        [replace(e, label=e.label if e.label in classes else classes[0]) for e in table.entries]
        if endpoint.task == "classification"
        else table.entries,
        classes,
        endpoint.task,
    )
    slides = SlideCache(slide_mpp=slide_mpp if slide_mpp is not None else config.data.slide_mpp)
    try:
        dataset = setup.build_dataset(
            config, method.kind, table, train=False, slides=slides, endpoint=endpoint
        )
        if config.data.features:  # slides new to the store are encoded into it first
            for _event in attach_feature_store(config, method, [dataset]):
                pass
        preds = predict_dataset(
            method, dataset, repeats=repeats, with_grids=True, workers=config.data.workers
        )
    finally:
        slides.close()
    out = [
        SlidePrediction(
            e.path, preds.probs[i], classes, preds.grids[i], dict(method.map_titles), epochs, endpoint
        )
        for i, e in enumerate(table.entries)
    ]
    return out, preds


def predict_slide(
    checkpoint: str | Path,
    slide: str | Path,
    *,
    regions: str | Path | None = None,
    device: str = "auto",
    repeats: int = 0,
    slide_mpp: float | None = None,
) -> SlidePrediction:
    """One slide: class probabilities and heatmaps ("attention", or PatchGD's "norm"/"pca"/"evidence")."""
    entry = SlideEntry(Path(slide).resolve(), "", None, Path(regions) if regions else None)
    table = SlideTable([entry], ["?"])
    preds, _ = predict_slides(checkpoint, table, device=device, repeats=repeats, slide_mpp=slide_mpp)
    return preds[0]
