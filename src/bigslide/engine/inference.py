"""Inference: slide-level probabilities and heatmaps (attention or Z-block maps) on the level-0 grid."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from bigslide.data.arrays import ArrayImageDataset
from bigslide.data.bags import BagDataset
from bigslide.data.endpoint import Endpoint
from bigslide.data.images import SlideImageDataset
from bigslide.data.loader import BatchLoader, default_workers, load_item
from bigslide.data.processes import DecodeProcesses, Pool
from bigslide.data.sample import as_float
from bigslide.data.slides import SlideCache
from bigslide.data.stain_norm import StainFit
from bigslide.data.table import SlideEntry, SlideTable
from bigslide.data.tile_cache import TileCache, tile_cache_for
from bigslide.data.ultramnist import UltraMNIST
from bigslide.engine import setup
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.config import TrainConfig
from bigslide.engine.decision import Decision
from bigslide.engine.features import attach_feature_store
from bigslide.engine.preview_lattice import coarse_map, thin_grids
from bigslide.engine.slide_prediction import SlidePrediction
from bigslide.errors import DataError, SlideError, TrainingError
from bigslide.explain.heatmap import ScoreGrid
from bigslide.methods.base import Method, Prediction, Sample
from bigslide.methods.mil import MILMethod

Mpp = tuple[float, float] | None
SlideDataset = BagDataset | SlideImageDataset | UltraMNIST | ArrayImageDataset


@dataclass
class DatasetPredictions:
    labels: np.ndarray  # (n,) the targets as datasets give them ((n, 3) for survival)
    probs: np.ndarray  # (n, K) the endpoint's outputs (class probabilities for classes)
    grids: list[dict[str, dict[str, ScoreGrid]]] = field(default_factory=list)  # per item: slide -> maps
    decision: Decision | None = None  # the checkpoint's, when predicted from one (classification)
    left_out: dict[int, str] = field(default_factory=dict)  # items that could not be read (skip_bad), why


def predict_sample(method: Method, sample: Sample) -> Prediction:
    method.model.eval()
    if not method.takes_uint8:
        sample = replace(sample, x=as_float(sample.x, method.colour([sample])))
    # a whole slide's bag ends in a chunk of its own size
    with untimed_convolutions() if sample.coords is not None else nullcontext():
        return method.predict(sample)


@contextmanager
def untimed_convolutions() -> Iterator[None]:
    """cuDNN picks its algorithms by heuristics meanwhile, without timing each (`cudnn.benchmark`, which
    training turns on for its fixed shapes): a shape seen once would pay seconds of timing."""
    timed = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = timed


def sample_grids(sample: Sample, pred: Prediction, mpp: tuple[float, float] | None) -> dict[str, ScoreGrid]:
    """The prediction's per-tile scores or patch-grid maps placed on the slide's level-0 grid (a sample
    from one slide)."""
    if sample.coords is not None:
        return bag_grids([sample], [pred], lambda _slide: mpp).get(sample.slide, {})
    grids = {}
    for name, values in pred.maps.items():
        stride = pred.map_stride or sample.x.shape[-1] / values.shape[1]
        origin = (
            sample.origin[0] + pred.map_offset * sample.downsample,
            sample.origin[1] + pred.map_offset * sample.downsample,
        )
        grids[name] = ScoreGrid(values, stride * sample.downsample, origin, mpp, name)
    return grids


def slide_mpp(slides: SlideCache, slide: str) -> tuple[float, float] | None:
    return slides.mpp(Path(slide))


def bag_grids(
    samples: Sequence[Sample], preds: Sequence[Prediction], mpp_of: Callable[[str], Mpp]
) -> dict[str, dict[str, ScoreGrid]]:
    """Per slide, the per-tile scores of one or more bags of an item (repeated bags of a slide pool into
    one grid per map; a case's bag puts each tile on its own slide)."""
    per_tile = [
        {**({"attention": p.instance_scores} if p.instance_scores is not None else {}), **p.instance_maps}
        for p in preds
    ]
    names = [n for n in per_tile[0] if all(n in t for t in per_tile)]
    chunks: dict[str, list[tuple[np.ndarray, dict[str, np.ndarray], int]]] = {}
    for sample, values in zip(samples, per_tile, strict=True):
        assert sample.coords is not None
        for part in sample.by_slide():
            picked = {n: np.asarray(values[n])[part.tiles] for n in names}
            tiles = (sample.coords[part.tiles], picked, part.tile_size_level0)
            chunks.setdefault(part.slide, []).append(tiles)
    out: dict[str, dict[str, ScoreGrid]] = {}
    for slide, parts in chunks.items():
        coords = np.concatenate([c for c, _, _ in parts])
        out[slide] = {
            n: ScoreGrid.from_tiles(
                coords, np.concatenate([v[n] for _, v, _ in parts]), parts[0][2], mpp=mpp_of(slide), name=n
            )
            for n in names
        }
    return out


def predict_dataset(
    method: Method,
    dataset: SlideDataset,
    *,
    repeats: int = 1,
    with_grids: bool | Collection[int] = False,
    workers: int | None = None,
    items: Sequence[int] | None = None,
    skip_bad: bool = False,
) -> DatasetPredictions:
    """Predict every item (or the `items` given); bags average `repeats` sampled bags (Big-Layers §4.2.4),
    0 = all tiles at once. `with_grids`: every item's heatmaps too, or those of the items it holds (the
    others' entries of `grids` empty). `skip_bad`: an item whose slide cannot be read is left out of the
    predictions and named in `left_out`, instead of raising its error.

    Slides whose `SlideCache` has decode workers are read there, the next items while one is predicted;
    else tiles are decoded on `workers` threads here (None: `default_workers()`).
    """
    order = list(range(len(dataset)) if items is None else items)
    slides = getattr(dataset, "slides", None)
    processes = slides.workers if slides is not None else None
    if isinstance(processes, DecodeProcesses):
        reads = _ItemReads(dataset, repeats)
        with BatchLoader(reads, processes=processes, prefetch=1, skip_bad=skip_bad) as loader:
            loader.plan([[i] for i in order])
            taken = ((i, loader.take([i])) for i in order)
            preds = _predicted(method, dataset, ((i, t[0]) for i, t in taken if t), with_grids)
            preds.left_out = dict(loader.bad)
            return preds
    n_workers = default_workers() if workers is None else workers
    left_out: dict[int, str] = {}

    def read(pool: Pool) -> Iterator[tuple[int, list[Sample]]]:
        for i in order:
            try:
                samples = read_samples(dataset, i, repeats, pool)
            except (SlideError, DataError) as err:
                if not skip_bad:
                    raise
                left_out[i] = str(err)
                continue
            yield i, samples

    with ThreadPoolExecutor(n_workers) if n_workers else nullcontext() as pool:
        preds = _predicted(method, dataset, read(pool), with_grids)
    preds.left_out = left_out
    return preds


class _ItemReads:
    """Item i = what item i of `dataset` is predicted from (`read_samples`), for a loader to read ahead."""

    def __init__(self, dataset: SlideDataset, repeats: int) -> None:
        self.dataset, self.repeats = dataset, repeats

    def __getitem__(self, i: int) -> list[Sample]:
        return read_samples(self.dataset, i, self.repeats, None)

    def load(self, i: int, pool: Pool) -> list[Sample]:
        return read_samples(self.dataset, i, self.repeats, pool)


def _predicted(
    method: Method,
    dataset: SlideDataset,
    reads: Iterable[tuple[int, list[Sample]]],
    with_grids: bool | Collection[int],
) -> DatasetPredictions:
    labels, probs, grids = [], [], []
    for i, samples in reads:
        drawn = with_grids if isinstance(with_grids, bool) else i in with_grids
        item_probs, item_grids = predict_samples(method, dataset, samples, with_grids=drawn)
        labels.append(samples[0].y)
        probs.append(item_probs)
        if with_grids:  # True, or items to draw
            grids.append(item_grids or {})
    return DatasetPredictions(np.array(labels), np.array(probs), grids)


def read_samples(dataset: SlideDataset, i: int, repeats: int, pool: Pool) -> list[Sample]:
    """What item i is predicted from: every tile of a bag in one sample (`repeats` 0, or bags of all
    tiles), else `repeats` sampled bags (Big-Layers §4.2.4); an image method's whole image."""
    if isinstance(dataset, BagDataset) and repeats > 0 and dataset.bag_size > 0:
        return [dataset.read_bag(i, dataset.tile_indices(i, repeat=1000 + k), pool) for k in range(repeats)]
    if isinstance(dataset, BagDataset):
        return [dataset.read_bag(i, np.arange(dataset.tile_count(i)), pool)]
    return [load_item(dataset, i, pool)]


def predict_samples(
    method: Method, dataset: SlideDataset, samples: list[Sample], *, with_grids: bool
) -> tuple[np.ndarray, dict[str, dict[str, ScoreGrid]] | None]:
    """The item's outputs (averaged over its samples) and, `with_grids`, its heatmaps on each of its
    slides (slide -> map name -> grid)."""
    preds = [predict_sample(method, s) for s in samples]
    probs = np.mean([p.probs for p in preds], axis=0)
    if not with_grids:
        return probs, None
    assert not isinstance(dataset, UltraMNIST | ArrayImageDataset), "heatmaps are placed on slides"
    mpp_of = partial(slide_mpp, dataset.slides)
    if samples[0].coords is None:
        return probs, {samples[0].slide: sample_grids(samples[0], preds[0], mpp_of(samples[0].slide))}
    return probs, bag_grids(samples, preds, mpp_of)


class Trained(NamedTuple):
    method: Method
    config: TrainConfig
    classes: list[str]
    epochs: int  # epochs the weights were trained for (the checkpoint's history)
    risk_reference: dict[str, Any] | None = None  # survival: the risks a prediction is read against
    decision: Decision = Decision()  # the checkpoint's decision threshold (classification)


def load_trained(
    checkpoint: str | Path,
    *,
    device: str = "auto",
    state: dict[str, Any] | None = None,
    config: TrainConfig | None = None,
) -> Trained:
    """The checkpoint's model, ready to predict on `device`; `state` and `config`: the checkpoint already
    read (`load_checkpoint`) and its configuration parsed, so neither is done twice."""
    state = load_checkpoint(checkpoint) if state is None else state
    if config is None:
        config = TrainConfig.from_dict(state["config"], source=f"{checkpoint}: config")
    classes = list(state["classes"])
    endpoint = Endpoint.from_state(state.get("endpoint"), classes)
    stain = StainFit.from_state(state["stain"]) if state.get("stain") else None
    if stain is None and config.data.stain_normalise != "none":
        raise TrainingError(
            f"{checkpoint}: trained with data.stain_normalise={config.data.stain_normalise} but holds no "
            "stain reference; retrain it with this version"
        )
    method = setup.build_method(config, endpoint, setup.resolve_device(device), stain=stain, checkpoint=state)
    method.model.load_state_dict(state["model"])
    method.model.eval()
    decision = Decision.from_state(state.get("decision"), len(classes))
    history = len(state.get("history", []))
    return Trained(method, config, classes, history, state.get("risk_reference"), decision)


def prediction_table(table: SlideTable, classes: list[str], endpoint: Endpoint) -> SlideTable:
    """`table` as the model reads it: labels are optional at prediction, so a missing one stands in as
    the first class (datasets give every slide a target)."""
    entries = table.entries
    if endpoint.task == "classification":
        entries = [replace(e, label=e.label if e.label in classes else classes[0]) for e in entries]
    return SlideTable(entries, classes, endpoint.task)


def predict_slides(
    checkpoint: str | Path,
    table: SlideTable,
    *,
    device: str = "auto",
    repeats: int = 0,
    slide_mpp: float | None = None,
    tiles: TileCache | None = None,
    max_tiles: int | None = None,
    processes: DecodeProcesses | None = None,
    attention_samples: int = 0,
) -> tuple[list[SlidePrediction], DatasetPredictions]:
    """Predict every slide of `table` with a trained checkpoint; bags use every tile when repeats = 0.
    The slides of a case are one bag: each gets the case's prediction and its own heatmaps.

    Every slide is read at the checkpoint's resolution (its data.target_mpp and tile or image size), whatever
    its scanner's; `slide_mpp` is the level-0 µm/px of slides whose files state none. Tile grids come from
    `tiles`, else from the training run's tile cache (data.tile_cache) when its run folder is here.
    `max_tiles` makes a preview of a bag method: a slide with more tiles is read one tile in s x s (a
    regular lattice) and its map drawn in cells of s tiles, `SlidePrediction.thinned` = s.
    Slides are tiled and read in `processes` (e.g. a napari session's, kept between predictions), else in
    decode workers started for the call (the checkpoint's data.workers).
    `attention_samples` > 0 adds the "attention_spread" map of attention-MIL methods
    (`MILMethod.attention_spread`).
    """
    trained = load_trained(checkpoint, device=device)
    method, config, classes, epochs = trained.method, trained.config, trained.classes, trained.epochs
    if isinstance(method, MILMethod):
        method.attention_samples = attention_samples
    reference = trained.risk_reference
    endpoint = method.spec.endpoint or Endpoint(classes=classes)
    decision = trained.decision if endpoint.task == "classification" else None
    table = prediction_table(table, classes, endpoint)
    if tiles is None and Path(config.run.out_dir).is_dir():
        tiles = tile_cache_for(config.data.tile_cache, config.run.out_dir)
    fallback_mpp = slide_mpp if slide_mpp is not None else config.data.slide_mpp
    own = setup.decode_processes(config.data) if processes is None else None
    slides = SlideCache(slide_mpp=fallback_mpp, tiles=tiles, workers=processes or own)
    try:
        dataset = setup.build_dataset(
            config, method.kind, table, train=False, slides=slides, endpoint=endpoint
        )
        steps = thin_grids(dataset, max_tiles) if max_tiles and isinstance(dataset, BagDataset) else {}
        if config.data.features:  # slides new to the store are encoded into it first
            for _event in attach_feature_store(config, method, [dataset]):
                pass
        preds = predict_dataset(
            method, dataset, repeats=repeats, with_grids=True, workers=config.data.workers
        )
    finally:
        slides.close()
        if own is not None:
            own.close()
    preds.decision = decision
    out = []
    for i, rows in enumerate(table.cases().values()):  # the datasets' items, in order
        for row in rows:
            e = table.entries[row]
            grids = preds.grids[i].get(str(e.path), {})
            step = steps.get(row, 1)
            grids = {name: coarse_map(grid, step) for name, grid in grids.items()}
            titles = dict(method.map_titles)
            out.append(
                SlidePrediction(
                    e.path,
                    preds.probs[i],
                    classes,
                    grids,
                    titles,
                    epochs,
                    endpoint,
                    e.case,
                    reference,
                    step,
                    decision=decision,
                    read_mpp=config.data.read_mpp,
                )
            )
    return out, preds


def predict_slide(
    checkpoint: str | Path,
    slide: str | Path,
    *,
    regions: str | Path | None = None,
    device: str = "auto",
    repeats: int = 0,
    slide_mpp: float | None = None,
    max_tiles: int | None = None,
    processes: DecodeProcesses | None = None,
) -> SlidePrediction:
    """One slide: class probabilities and heatmaps ("attention", or PatchGD's "norm"/"pca"/"evidence");
    `max_tiles` makes a quicker preview of a large slide (see `predict_slides`)."""
    entry = SlideEntry(Path(slide).expanduser().resolve(), "", None, Path(regions) if regions else None)
    table = SlideTable([entry], ["?"])
    preds, _ = predict_slides(
        checkpoint,
        table,
        device=device,
        repeats=repeats,
        slide_mpp=slide_mpp,
        max_tiles=max_tiles,
        processes=processes,
    )
    return preds[0]


def preview_maps(
    method: Method, dataset: BagDataset, item: int, max_tiles: int
) -> dict[str, dict[str, ScoreGrid]]:
    """Item `item`'s heatmaps (slide -> map name -> grid) from at most `max_tiles` tiles of each of its
    slides, on a lattice over all its tissue with cells of s x s tiles (`predict_slides`' preview):
    the whole slide at a bounded cost, read in the dataset's decode workers. `dataset` is unchanged."""
    view = copy.copy(dataset)
    view.grids, view.annotated = list(dataset.grids), None
    rows = dataset.items[item]
    steps = thin_grids(view, max_tiles, rows)
    maps = predict_dataset(method, view, repeats=0, with_grids=True, items=[item]).grids[0]
    step_of = {str(dataset.table.entries[row].path): steps.get(row, 1) for row in rows}
    return {
        slide: {n: coarse_map(g, step_of[slide]) for n, g in grids.items()} for slide, grids in maps.items()
    }
