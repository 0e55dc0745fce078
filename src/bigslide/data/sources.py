"""Where a run's data comes from, by `data.source`: a slide table (`csv`), the bundled synthetic slides
(`demo`) or UltraMNIST canvases (`ultramnist`). Scripts hand in their own (`RunData`, e.g. in-memory
`ArrayImageDataset`s) to `train(config, data=...)`. The engine asks here and names no dataset."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bigslide.data.arrays import ArrayImageDataset
from bigslide.data.bags import BagDataset
from bigslide.data.config import DataConfig
from bigslide.data.endpoint import Endpoint, fit_endpoint
from bigslide.data.feature_bags import FeatureBagDataset
from bigslide.data.images import SlideImageDataset
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideTable
from bigslide.data.ultramnist import UltraMNIST
from bigslide.errors import ConfigError

TrainData = BagDataset | SlideImageDataset | UltraMNIST | ArrayImageDataset


@dataclass
class RunData:
    """What a run trains and validates on; scripts may pass their own to `train(config, data=...)`."""

    classes: list[str]
    train: TrainData
    val: TrainData | None
    test: TrainData | None = None  # scored once, after training
    endpoint: Endpoint | None = None  # None: classification into `classes`

    def __post_init__(self) -> None:
        if self.endpoint is None:
            self.endpoint = Endpoint(classes=list(self.classes))


Source = Callable[[DataConfig, str, int, SlideCache], RunData]
"""(data config, method kind "bag" | "image", run seed, the run's slide cache) -> the run's data."""


def demo_dir() -> Path:
    return Path(os.environ.get("BIGSLIDE_CACHE", Path.home() / ".cache" / "bigslide")) / "demo-slides"


def load_table(data: DataConfig) -> SlideTable:
    """The slide table a slide source reads: the bundled demo set, or `data.csv`."""
    if data.source == "demo":
        from bigslide.synthetic.slide_set import make_slide_set

        if data.csv:  # a demo run's config.yaml edited into a user's: their table would be ignored
            raise ConfigError(
                f"data.csv: {data.csv} is not read while data.source is demo (the bundled synthetic "
                "slides); set data.source: csv to train on it"
            )

        return SlideTable.from_csv(make_slide_set(demo_dir()), task=data.task)
    if not data.csv:
        raise ConfigError(
            "data.csv: no slide table given (`bigslide train slides.csv`, or set data.source: demo for the "
            "bundled slides)"
        )
    return SlideTable.from_csv(data.csv, task=data.task)


def slide_dataset(
    data: DataConfig,
    kind: str,
    table: SlideTable,
    *,
    train: bool,
    seed: int,
    slides: SlideCache,
    endpoint: Endpoint | None = None,
    skip_bad: bool | None = None,
) -> BagDataset | SlideImageDataset:
    """Bags of tiles (bag methods) or one image per slide (image methods) read at `data.target_mpp`; bags of
    stored features with `data.features`. `skip_bad`: leave out slides that cannot be tiled (None:
    `data.skip_bad_slides`)."""
    stain: dict[str, Any] = {
        "stain_augment": data.stain_augment_strength if data.stain_augment and train else 0.0,
        "stain_normalise": data.stain_normalise,
    }
    bag_size = data.bag_size if train else (0 if data.inference_repeats == 0 else data.bag_size)
    taught = train and data.instance_weight > 0 and table.annotated()
    if taught and kind != "bag":
        raise ConfigError(
            "data.instance_weight: the slide table's annotations label tiles, and this method reads each "
            "slide as one image, without tiles to label; choose a method that learns from tiles, or set "
            "data.instance_weight: 0 to train without the annotations"
        )
    classes = (endpoint or Endpoint(classes=list(table.classes))).instance_classes if taught else None
    if kind == "bag" and data.features:
        return FeatureBagDataset(
            table,
            data.features,
            tile_size=data.tile_size,
            target_mpp=data.read_mpp,
            bag_size=bag_size,
            min_tissue=data.min_tissue,
            tissue=data.tissue,
            seed=seed,
            slides=slides,
            endpoint=endpoint,
            foreign_dim=data.feature_dim if data.features_foreign else 0,
            instance_classes=classes,
        )
    if kind == "bag":
        return BagDataset(
            table,
            tile_size=data.tile_size,
            target_mpp=data.read_mpp,
            bag_size=bag_size,
            min_tissue=data.min_tissue,
            tissue=data.tissue,
            augment=data.augment and train,
            seed=seed,
            slides=slides,
            endpoint=endpoint,
            skip_bad=data.skip_bad_slides if skip_bad is None else skip_bad,
            instance_classes=classes,
            **stain,
        )
    return SlideImageDataset(
        table,
        image_size=data.image_size,
        target_mpp=data.read_mpp,
        augment=data.augment and train,
        seed=seed,
        slides=slides,
        endpoint=endpoint,
        tissue=data.tissue,
        **stain,
    )


def from_slides(data: DataConfig, kind: str, seed: int, slides: SlideCache) -> RunData:
    table = load_table(data).with_splits(seed=seed)
    train_table, val_table, test_table = (table.subset(s) for s in ("train", "val", "test"))
    if len(train_table) == 0:
        raise ConfigError("data: no slide is in the train split")
    if table.task == "classification" and len(table.classes) < 2:
        labels = f"labelled {table.classes[0]!r}" if table.classes else "unlabelled"
        raise ConfigError(
            f"data: every slide of {data.csv or 'the table'} is {labels}: a classifier learns from slides "
            "of at least two classes"
        )
    endpoint = fit_endpoint(table, survival_loss=data.survival_loss, time_bins=data.time_bins)
    make = partial(slide_dataset, data, kind, seed=seed, slides=slides, endpoint=endpoint)
    return RunData(
        table.classes,
        make(train_table, train=True),
        make(val_table, train=False) if len(val_table) else None,
        make(test_table, train=False) if len(test_table) else None,
        endpoint,
    )


def planned_endpoint(data: DataConfig, seed: int) -> Endpoint | None:
    """What a run on `data` predicts, from its slide table alone (no slide opened, no tile made): the
    endpoint `build_data` gives it. None for a source whose classes come with its images (UltraMNIST)."""
    if data.source not in ("csv", "demo"):
        return None
    table = load_table(data).with_splits(seed=seed)
    return fit_endpoint(table, survival_loss=data.survival_loss, time_bins=data.time_bins)


def from_ultramnist(data: DataConfig, kind: str, seed: int, _slides: SlideCache) -> RunData:
    if kind != "image":
        raise ConfigError("data.source: ultramnist gives whole images; this method reads bags of tiles")
    canvases = partial(
        UltraMNIST,
        size=data.image_size,
        seed=seed,
        task=data.ultramnist_task,
        scale=(data.ultramnist_smallest_digit, data.ultramnist_largest_digit),
        canvas=data.ultramnist_canvas,
    )
    train = canvases(data.ultramnist_count, split="train")
    return RunData(train.classes, train, canvases(max(1, data.ultramnist_count // 4), split="val"))


SOURCES: dict[str, Source] = {"csv": from_slides, "demo": from_slides, "ultramnist": from_ultramnist}


def build_data(data: DataConfig, kind: str, seed: int, slides: SlideCache) -> RunData:
    """The train and validation datasets of `data.source` for a method of `kind`."""
    source = SOURCES.get(data.source)
    if source is None:
        raise ConfigError(f"data.source: {data.source!r} is not one of {sorted(SOURCES)}")
    return source(data, kind, seed, slides)
