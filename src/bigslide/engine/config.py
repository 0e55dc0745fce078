"""The run configuration: one dataclass tree shared by the CLI, the GUI and checkpoints (YAML round-trip).

`DataConfig` lives with the data (`bigslide.data.config`), which reads it; it is re-exported here.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from bigslide.coerce import build_dataclass, check_ranges
from bigslide.data.config import DataConfig
from bigslide.errors import ConfigError
from bigslide.files import expand_home

__all__ = ["DataConfig", "MethodConfig", "ModelConfig", "OptimConfig", "RunConfig", "TrainConfig"]


@dataclass
class ModelConfig:
    backbone: str = field(
        default="resnet18",
        metadata={
            "help": "timm model name, hf-hub:ORG/NAME, or package.module:factory (an nn.Module of your own)"
        },
    )
    pretrained: bool = field(
        default=False,
        metadata={"help": "the hub's weights (timm's ImageNet weights, or the hf-hub repository's)"},
    )
    weights: str | None = field(
        default=None, metadata={"help": "local backbone state dict (.safetensors, .pt, .pth, .bin)"}
    )
    backbone_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "keyword arguments for the backbone beside its name, as a model card passes them to "
            "timm.create_model (or your factory); a value naming an object (timm.layers.SwiGLUPacked, "
            "torch.nn.SiLU) is that object"
        },
    )

    def __post_init__(self) -> None:
        check_backbone_name(self.backbone)
        self.weights, self.init_from = expand_home(self.weights), expand_home(self.init_from)
        if not isinstance(self.backbone_args, dict):
            raise ConfigError(
                "model.backbone_args: expected a mapping of argument names to values, got "
                f"{self.backbone_args!r}"
            )
        if self.backbone_args:  # a misnamed layer fails here, not when the model is built
            from bigslide.nn.backbone_args import backbone_arguments

            backbone_arguments(self.backbone_args)

    init_from: str | None = field(
        default=None,
        metadata={
            "help": "a bigslide checkpoint whose weights the run starts from (fine-tuning: the optimizer, "
            "schedule and epochs start afresh); its classes must be this run's"
        },
    )


@dataclass
class MethodConfig:
    name: str = field(
        default="abmil_acc",
        metadata={"help": "registry name of the training method (`bigslide methods` lists them)"},
    )
    params: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "the method's parameters, by name (see the method pages); unknown names are an error"
        },
    )

    def __post_init__(self) -> None:
        # checked here, before any slide is opened: a wrong name or value fails in a second, not minutes
        from bigslide.methods.base import make_params

        make_params(self.name, self.params)


@dataclass
class OptimConfig:
    optimizer: Literal["adamw", "sgd"] = field(
        default="adamw", metadata={"help": "adamw, or sgd with momentum 0.9"}
    )
    lr: float = field(default=1e-4, metadata={"above": 0, "help": "peak learning rate"})
    weight_decay: float = field(
        default=0.0, metadata={"min": 0, "help": "decoupled weight decay (AdamW) or L2 penalty (SGD)"}
    )
    epochs: int = field(default=1, metadata={"min": 1, "help": "passes over the training set"})
    max_steps: int | None = field(
        default=None, metadata={"help": "stop after this many batches (null = no limit)"}
    )
    accumulate: int = field(
        default=1, metadata={"min": 1, "help": "complete gradients averaged per optimizer step (per rank)"}
    )
    grad_clip: float | None = field(
        default=None, metadata={"help": "clip the global gradient norm to this value (null = no clipping)"}
    )
    schedule: Literal["constant", "cosine", "linear"] = field(
        default="constant",
        metadata={"help": "learning-rate schedule after the warm-up, stepped once per batch (decays to 0)"},
    )
    warmup_steps: int = field(
        default=0, metadata={"min": 0, "help": "batches of linear learning-rate warm-up"}
    )

    def __post_init__(self) -> None:
        check_ranges(self, "optim")


@dataclass
class RunConfig:
    out_dir: str = field(
        default="runs/latest",
        metadata={"help": "output folder: config.yaml, checkpoints/last.pt, metrics.json, losses.csv"},
    )
    device: Literal["auto", "cpu", "cuda"] = field(
        default="auto", metadata={"help": "auto = CUDA when present, else CPU"}
    )
    seed: int = field(
        default=0, metadata={"help": "seed of every random stream (sampling, augmentation, initialisation)"}
    )
    amp: Literal["none", "bf16", "fp16"] = field(
        default="none",
        metadata={"help": "mixed precision on CUDA (fp16 adds a gradient scaler); ignored on the CPU"},
    )
    checkpoint_every: int = field(
        default=0,
        metadata={"min": 0, "help": "batches between checkpoints; 0 = at the end of each epoch only"},
    )
    deterministic: bool = field(
        default=False, metadata={"help": "deterministic algorithms where torch has them (slower)"}
    )
    channels_last: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata={
            "help": "channels-last memory for the tile encoder of the bag methods (auto = on for CNN "
            "encoders on CUDA); PatchGD and whole-image methods have method.params.channels_last"
        },
    )
    cudnn_benchmark: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata={
            "help": "let cuDNN time its algorithms for each input shape (auto = on CUDA when the shapes "
            "repeat: image methods, or bags of a fixed data.bag_size; off with run.deterministic)"
        },
    )
    tensorboard: bool = field(
        default=True,
        metadata={"help": "write TensorBoard event files in the run folder (tensorboard --logdir runs/)"},
    )
    dist_timeout: float = field(
        default=1800.0,
        metadata={
            "help": "seconds a rank waits for the others (torchrun) before the run stops on every rank; "
            "must exceed a rank's share of validation plus rank 0's checkpoint and map"
        },
    )

    def __post_init__(self) -> None:
        check_ranges(self, "run")
        self.out_dir = expand_home(self.out_dir) or self.out_dir
        if self.deterministic and self.cudnn_benchmark == "on":
            raise ConfigError(
                "run.cudnn_benchmark: on picks cuDNN algorithms by timing them, which run.deterministic "
                "rules out; set it to auto or off"
            )


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> TrainConfig:
        return build_dataclass(cls, migrate(values, source), source)

    def to_yaml(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        path = Path(path)
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({err})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        config = build_dataclass(cls, migrate(values, str(path)), str(path))
        # paths in the file are relative to it: a run folder can move
        if config.data.csv and not Path(config.data.csv).is_absolute():
            config.data.csv = str((path.parent / config.data.csv).resolve())
        if config.model.init_from and not Path(config.model.init_from).is_absolute():
            config.model.init_from = str((path.parent / config.model.init_from).resolve())
        return config


def check_backbone_name(backbone: object) -> None:
    """A run is written down and replayed from its config, so its encoder is named, not held."""
    if not isinstance(backbone, str):
        raise ConfigError(
            f"model.backbone: a name is needed, not a {type(backbone).__name__} object: a timm model name, "
            "hf-hub:ORG/NAME, or 'package.module:factory' naming a function (or class) that returns your "
            "nn.Module, importable where bigslide runs ('__main__:factory' for one in your script)"
        )


def migrate(values: Any, source: str) -> Any:
    """A config written before `data.mpp` became `data.target_mpp` reads as the new one, with a notice."""
    data = values.get("data") if isinstance(values, dict) else None
    if not isinstance(data, dict) or "mpp" not in data:
        return values
    if "target_mpp" in data:
        raise ConfigError(f"{source}: data.mpp (the old name) and data.target_mpp both given; drop data.mpp")
    warnings.warn(
        f"{source}: data.mpp is now data.target_mpp (the µm/px tiles and images are read at); read as such",
        FutureWarning,
        stacklevel=3,
    )
    data = {("target_mpp" if k == "mpp" else k): v for k, v in data.items()}
    return {**values, "data": data}
