"""Build what a run needs from its config: slide table, datasets, method, optimizer and schedule."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from bigslide.data import sources
from bigslide.data.bags import BagDataset
from bigslide.data.config import DataConfig
from bigslide.data.endpoint import Endpoint
from bigslide.data.images import SlideImageDataset
from bigslide.data.loader import default_workers
from bigslide.data.processes import DecodeProcesses
from bigslide.data.slides import SlideCache
from bigslide.data.sources import RunData, TrainData, demo_dir
from bigslide.data.stain_norm import StainFit, stain_reference
from bigslide.data.table import SlideTable
from bigslide.engine.config import TrainConfig
from bigslide.errors import ConfigError, SlideError
from bigslide.methods.base import Method, ModelSpec, get_method, make_params

__all__ = ["RunData", "TrainData", "build_data", "build_method", "demo_dir", "resolve_device"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device: cuda was asked for but no CUDA device is available; use auto or cpu")
    return torch.device(name)


def decode_processes(data: DataConfig) -> DecodeProcesses | None:
    """The decode workers a run or a prediction keeps from its first tile grid to its last map:
    `data.workers` processes (None: `default_workers()`); none with 0 workers or data made in memory."""
    workers = default_workers() if data.workers is None else data.workers
    if workers == 0 or data.source == "ultramnist":
        return None
    return DecodeProcesses(workers, buffers=max(data.prefetch, workers + 1))


def build_data(config: TrainConfig, kind: str, slides: SlideCache) -> RunData:
    """The train and validation datasets for a method of `kind` ("bag" or "image"). A slide that cannot be
    read stops the run, its error saying how to leave such slides out instead."""
    try:
        return sources.build_data(config.data, kind, config.run.seed, slides)
    except SlideError as err:
        if config.data.skip_bad_slides:
            raise
        raise SlideError(f"{err}; set data.skip_bad_slides: true to leave such slides out") from None


def build_method(
    config: TrainConfig,
    target: list[str] | Endpoint,
    device: torch.device,
    *,
    stain: StainFit | Literal["fit"] | None = "fit",
    checkpoint: Mapping[str, Any] | None = None,
) -> Method:
    """The configured method predicting `target`: an endpoint, or a list of classes. `stain`: the stain
    reference slides are normalised to; "fit": the one `config.data` names (a trained checkpoint passes
    the one it saved instead, so prediction maps slides exactly as training did). `checkpoint`: the saved
    state whose weights will replace the model's first ones.

    Weights that a checkpoint (this one, or `model.init_from`'s) replaces are neither downloaded nor read:
    a checkpoint predicts on a machine without network, without the hub's cache and without the file
    `model.weights` named where it was trained. A Hugging Face hub encoder is built from the description
    saved with it."""
    cls = get_method(config.method.name)
    params = make_params(config.method.name, config.method.params)
    endpoint = target if isinstance(target, Endpoint) else Endpoint(classes=list(target))
    replaced = checkpoint is not None or bool(config.model.init_from)
    spec = ModelSpec(
        backbone=config.model.backbone,
        pretrained=config.model.pretrained and not replaced,
        weights=None if replaced else config.model.weights,
        backbone_args=dict(config.model.backbone_args),
        recipe=checkpoint.get("encoder") if checkpoint is not None else init_recipe(config),
        tile_side=config.data.tile_size if cls.kind == "bag" else None,
        num_classes=endpoint.n_outputs,
        endpoint=endpoint,
        feature_dim=config.data.feature_dim if config.data.features_foreign else None,
        instance_loss=config.data.instance_loss if config.data.instance_weight > 0 else None,
        instance_weight=config.data.instance_weight,
        channels_last=config.run.channels_last,
    )
    torch.backends.cudnn.benchmark = cudnn_benchmark(config, cls.kind, device)
    method = cls(params, spec, device)
    data = config.data
    method.stain_reference = (
        stain_reference(
            data.stain_normalise,
            data.stain_reference,
            tile_size=data.tile_size,
            target_mpp=data.read_mpp,
            min_tissue=data.min_tissue,
            tissue=data.tissue,
        )
        if stain == "fit"
        else stain
    )
    return method


def cudnn_benchmark(config: TrainConfig, kind: str, device: torch.device) -> bool:
    """`run.cudnn_benchmark`: "auto" times cuDNN's algorithms on CUDA when input shapes repeat, so each
    shape's timing pays off (images of data.image_size, bags of a fixed data.bag_size), and not with
    run.deterministic."""
    choice = config.run.cudnn_benchmark
    if choice != "auto":
        return choice == "on"
    repeats = kind == "image" or config.data.bag_size > 0
    return device.type == "cuda" and repeats and not config.run.deterministic


def annotations_taught(method: Method, train: object) -> str | None:
    """When the training slides carry teaching annotations that this run learns from: what they teach,
    in words (a `ConfigError` naming why the method cannot learn from them, if it cannot); else None."""
    annotated = getattr(train, "annotated", None)
    if annotated is None or method.spec.instance_loss is None:
        return None
    method.check_instances()
    counts = [annotated.count(row) for row in range(len(annotated.per_row))]
    what = "the attention" if method.spec.instance_loss == "attention" else "a tile classifier"
    slides = sum(c > 0 for c in counts)
    return (
        f"annotations: {sum(counts)} annotated tile{'s' * (sum(counts) != 1)} in {slides} training "
        f"slide{'s' * (slides != 1)} teach {what} (weight {method.spec.instance_weight:g})"
    )


INIT_OPTIONAL = ("tiles.",)
"""State-dict keys a starting checkpoint may lack or hold beyond the model (the tile classifier that
annotations teach: a fine-tune may add it, or teach the attention instead)."""


def init_recipe(config: TrainConfig) -> dict[str, Any] | None:
    """The hub encoder's description saved with `model.init_from`'s checkpoint, when it trained the same
    backbone: the run then builds it without the hub's cache, as prediction does (the weights are the
    checkpoint's). None without one."""
    if not config.model.init_from or not Path(config.model.init_from).is_file():
        return None  # a missing file is said by `init_from_checkpoint`
    from bigslide.engine.checkpoint import load_checkpoint

    saved = load_checkpoint(Path(config.model.init_from))
    same = saved.get("config", {}).get("model", {}).get("backbone") == config.model.backbone
    recipe = saved.get("encoder")
    return recipe if same and isinstance(recipe, dict) else None


def init_from_checkpoint(config: TrainConfig, method: Method, endpoint: Endpoint) -> str | None:
    """Load the weights of `config.model.init_from` into `method` (fine-tuning); says what it loaded, in
    words. A checkpoint of other classes or of another model is a `ConfigError` naming it."""
    if not config.model.init_from:
        return None
    from bigslide.engine.checkpoint import load_checkpoint

    path = Path(config.model.init_from)
    where = f"model.init_from: {path}"
    saved = load_checkpoint(path)
    saved_endpoint = Endpoint.from_state(saved.get("endpoint"), list(saved["classes"]))
    if (saved_endpoint.task, saved_endpoint.classes) != (endpoint.task, endpoint.classes):
        raise ConfigError(
            f"{where}: predicts {saved_endpoint.task} {saved_endpoint.classes or ''}, this run "
            f"{endpoint.task} {endpoint.classes or ''}; start from a checkpoint of the same classes"
        )
    own = method.model.state_dict()
    state = {k: v for k, v in saved["model"].items() if k in own or not k.startswith(INIT_OPTIONAL)}
    wrong = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    missing = [k for k in own if k not in state and not k.startswith(INIT_OPTIONAL)]
    unknown = [k for k in state if k not in own]
    if wrong or missing or unknown:
        trained_with = saved.get("method", "?")
        detail = "; ".join(
            f"{what}: {', '.join(keys[:3])}{' …' if len(keys) > 3 else ''}"
            for what, keys in (("other shapes", wrong), ("missing", missing), ("not in this model", unknown))
            if keys
        )
        raise ConfigError(
            f"{where}: its weights ({trained_with}) do not fit this run's model ({method.name}, "
            f"{config.model.backbone}): {detail}; start from a checkpoint of the same method, backbone "
            "and MIL head"
        )
    method.model.load_state_dict(state, strict=False)
    epochs = len(saved.get("history", []))
    trained = f"{epochs} epoch{'s' * (epochs != 1)} trained"
    return f"started from the weights of {path} ({saved.get('method', '?')}, {trained})"


def build_dataset(
    config: TrainConfig,
    kind: str,
    table: SlideTable,
    *,
    train: bool,
    slides: SlideCache,
    endpoint: Endpoint | None = None,
) -> BagDataset | SlideImageDataset:
    """A dataset of `table` read as `config` says, for prediction: every slide of it, or its error."""
    return sources.slide_dataset(
        config.data,
        kind,
        table,
        train=train,
        seed=config.run.seed,
        slides=slides,
        endpoint=endpoint,
        skip_bad=False,
    )


def build_optimizer(config: TrainConfig, method: Method) -> torch.optim.Optimizer:
    params = list(method.trainable_parameters())
    if not params:
        raise ConfigError(f"method {config.method.name}: nothing to train (no parameter requires grad)")
    o = config.optim
    # Fused on CUDA: fewer launches, and an fp16 step whose gradients overflowed is skipped on the
    # device (the gradient scaler reads the overflow flag on the host for other optimizers).
    fused = True if method.device.type == "cuda" else None
    if o.optimizer == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=0.9, weight_decay=o.weight_decay, fused=fused)
    return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, fused=fused)


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
