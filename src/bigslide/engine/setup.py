"""Build what a run needs from its config: slide table, datasets, method, optimizer and schedule."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from bigslide.data.arrays import ArrayImageDataset
from bigslide.data.bags import BagDataset
from bigslide.data.images import SlideImageDataset
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideTable
from bigslide.engine.config import TrainConfig
from bigslide.errors import ConfigError
from bigslide.methods.base import Method, ModelSpec, get_method, make_params
from bigslide.synthetic.ultramnist import UltraMNIST


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device: cuda was asked for but no CUDA device is available; use auto or cpu")
    return torch.device(name)


def demo_dir() -> Path:
    return Path(os.environ.get("BIGSLIDE_CACHE", Path.home() / ".cache" / "bigslide")) / "demo-slides"


def load_table(config: TrainConfig) -> SlideTable:
    if config.data.source == "demo":
        from bigslide.synthetic.slide_set import make_slide_set

        return SlideTable.from_csv(make_slide_set(demo_dir()))
    if not config.data.csv:
        raise ConfigError("data.csv: no slide table given (or set data.source: demo for the bundled slides)")
    return SlideTable.from_csv(config.data.csv)


TrainData = BagDataset | SlideImageDataset | UltraMNIST | ArrayImageDataset


@dataclass
class RunData:
    """What a run trains and validates on; scripts may pass their own to `train(config, data=...)`."""

    classes: list[str]
    train: TrainData
    val: TrainData | None


def build_data(config: TrainConfig, kind: str, slides: SlideCache) -> RunData:
    """The train and validation datasets for a method of `kind` ("bag" or "image")."""
    d = config.data
    if d.source == "ultramnist":
        if kind != "image":
            raise ConfigError(f"data.source: ultramnist gives images; method {config.method.name} needs bags")
        n_val = max(1, d.ultramnist_count // 4)
        canvases = partial(
            UltraMNIST,
            size=d.image_size,
            seed=config.run.seed,
            task=d.ultramnist_task,
            scale=(d.ultramnist_smallest_digit, d.ultramnist_largest_digit),
            canvas=d.ultramnist_canvas,
        )
        train = canvases(d.ultramnist_count, split="train")
        return RunData(train.classes, train, canvases(n_val, split="val"))
    table = load_table(config).with_splits(seed=config.run.seed)
    train_table, val_table = table.subset("train"), table.subset("val")
    if len(train_table) == 0:
        raise ConfigError("data: no slide is in the train split")
    return RunData(
        table.classes,
        build_dataset(config, kind, train_table, train=True, slides=slides),
        build_dataset(config, kind, val_table, train=False, slides=slides) if len(val_table) else None,
    )


def build_method(config: TrainConfig, classes: list[str], device: torch.device) -> Method:
    cls = get_method(config.method.name)
    params = make_params(config.method.name, config.method.params)
    spec = ModelSpec(
        backbone=config.model.backbone,
        pretrained=config.model.pretrained,
        weights=config.model.weights,
        num_classes=len(classes),
    )
    return cls(params, spec, device)


def build_dataset(
    config: TrainConfig, kind: str, table: SlideTable, *, train: bool, slides: SlideCache
) -> BagDataset | SlideImageDataset:
    d = config.data
    if kind == "bag":
        return BagDataset(
            table,
            tile_size=d.tile_size,
            target_mpp=d.read_mpp,
            bag_size=d.bag_size if train else (0 if d.inference_repeats == 0 else d.bag_size),
            min_tissue=d.min_tissue,
            augment=d.augment and train,
            seed=config.run.seed,
            slides=slides,
        )
    return SlideImageDataset(
        table,
        image_size=d.image_size,
        target_mpp=d.read_mpp,
        augment=d.augment and train,
        seed=config.run.seed,
        slides=slides,
    )


def build_optimizer(config: TrainConfig, method: Method) -> torch.optim.Optimizer:
    params = list(method.trainable_parameters())
    if not params:
        raise ConfigError(f"method {config.method.name}: nothing to train (no parameter requires grad)")
    o = config.optim
    if o.optimizer == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=0.9, weight_decay=o.weight_decay)
    return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)


def build_schedule(
    config: TrainConfig, optimizer: torch.optim.Optimizer, total_batches: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then constant, linear decay to 0 or cosine decay to 0, stepped once per batch."""
    o = config.optim
    warmup = max(o.warmup_steps, 0)
    rest = max(total_batches - warmup, 1)

    def factor(batch: int) -> float:
        if batch < warmup:
            return (batch + 1) / warmup
        t = min((batch - warmup) / rest, 1.0)
        if o.schedule == "linear":
            return 1.0 - t
        if o.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * t))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
