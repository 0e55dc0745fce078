"""The run configuration: one dataclass tree shared by the CLI, the GUI and checkpoints (YAML round-trip)."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from bigslide.coerce import build_dataclass, check_ranges
from bigslide.errors import ConfigError
from bigslide.resolution import DEFAULT_MPP, check_mpp, magnification_to_mpp


@dataclass
class DataConfig:
    csv: str | None = field(default=None, metadata={"help": "slide table: slide,label[,split][,regions]"})
    source: Literal["csv", "demo", "ultramnist"] = field(
        default="csv",
        metadata={"help": "csv: the slide table; demo: bundled synthetic slides; ultramnist: digit canvases"},
    )
    ultramnist_count: int = field(
        default=200, metadata={"min": 1, "help": "training canvases (validation: a quarter)"}
    )
    ultramnist_task: Literal["sum", "digit"] = field(
        default="sum", metadata={"help": "label: sum of the 3-5 digits (paper), or 'digit': 3-5 of one digit"}
    )
    ultramnist_smallest_digit: float = field(
        default=1 / 16, metadata={"help": "smallest digit side, a fraction of the canvas side"}
    )
    ultramnist_largest_digit: float = field(
        default=1 / 2, metadata={"help": "largest digit side, a fraction of the canvas side"}
    )
    ultramnist_canvas: int = field(
        default=0, metadata={"help": "side digits are drawn at, shrunk to data.image_size (0 = that size)"}
    )
    tile_size: int = field(
        default=64, metadata={"min": 1, "help": "MIL tile side, pixels at data.target_mpp"}
    )
    target_mpp: float | None = field(
        default=None,
        metadata={
            "help": "µm per pixel tiles and images are read at, whatever the scanner "
            "(null = from data.magnification, else 0.5)"
        },
    )
    magnification: float | None = field(
        default=None, metadata={"help": "the same as a magnification: 20 = 0.5 µm/px, 40 = 0.25"}
    )
    slide_mpp: float | None = field(
        default=None,
        metadata={"help": "level-0 µm per pixel of slides whose files state none (else they are an error)"},
    )
    workers: int | None = field(
        default=None,
        metadata={
            "min": 0,
            "help": "processes decoding tiles ahead of the step (null = min(cores, 8); 0 = none)",
        },
    )
    prefetch: int = field(
        default=2,
        metadata={
            "min": 1,
            "help": "bags or image batches decoded ahead of the step (raised to data.workers + 1)",
        },
    )
    bag_size: int = field(
        default=32, metadata={"min": 0, "help": "tiles sampled per slide for training (0 = all)"}
    )
    min_tissue: float = field(
        default=0.6, metadata={"min": 0, "max": 1, "help": "minimum tissue fraction of a tile"}
    )
    image_size: int = field(
        default=256,
        metadata={"min": 1, "help": "side of the image read per slide at data.target_mpp (image methods)"},
    )
    batch_size: int = field(
        default=1, metadata={"min": 1, "help": "images per batch (image methods; bags come one at a time)"}
    )
    augment: bool = field(default=True, metadata={"help": "flips/rotations, the same for a whole bag"})
    inference_repeats: int = field(
        default=1, metadata={"min": 0, "help": "sampled bags averaged at inference (0 = all tiles)"}
    )

    def __post_init__(self) -> None:
        # resolved here so the stored config (and so every checkpoint) names the resolution it used
        if self.magnification is not None:
            from_magnification = magnification_to_mpp(self.magnification)
            if self.target_mpp is not None and abs(self.target_mpp / from_magnification - 1) > 1e-6:
                raise ConfigError(
                    f"data.target_mpp={self.target_mpp:g} and data.magnification={self.magnification:g} "
                    f"disagree ({self.magnification:g}x is {from_magnification:g} µm/px); give one of them"
                )
            self.target_mpp = from_magnification
        if self.target_mpp is None:
            self.target_mpp = DEFAULT_MPP
        for name in ("target_mpp", "slide_mpp"):
            check_mpp(getattr(self, name), f"data.{name}")
        check_ranges(self, "data")

    @property
    def read_mpp(self) -> float:
        """`target_mpp` once resolved (always, after construction): the µm/px every slide is read at."""
        return float(self.target_mpp if self.target_mpp is not None else DEFAULT_MPP)


@dataclass
class ModelConfig:
    backbone: str = field(default="resnet18", metadata={"help": "timm model name"})
    pretrained: bool = field(default=False, metadata={"help": "ImageNet weights from the timm hub"})
    weights: str | None = field(default=None, metadata={"help": "local backbone state dict"})


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
    lr: float = field(default=1e-4, metadata={"min": 0, "help": "peak learning rate"})
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
    dist_timeout: float = field(
        default=1800.0,
        metadata={
            "help": "seconds a rank waits for the others (torchrun) before the run stops on every rank; "
            "must exceed rank 0's validation time"
        },
    )

    def __post_init__(self) -> None:
        check_ranges(self, "run")


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
        if config.data.csv and not Path(config.data.csv).is_absolute():
            config.data.csv = str((path.parent / config.data.csv).resolve())
        return config


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
