"""What data a run reads and how: the `data` section of the run configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bigslide.coerce import check_ranges
from bigslide.errors import ConfigError
from bigslide.files import expand_home
from bigslide.tiling.pixel_classes import PEN_FLATNESS, TissueSettings
from bigslide.wsi.resolution import DEFAULT_MPP, check_mpp, magnification_to_mpp


@dataclass
class DataConfig:
    csv: str | None = field(
        default=None,
        metadata={
            "help": "slide table: slide, label (or time,event / target), optional split, regions, case"
        },
    )
    task: Literal["classification", "survival", "regression"] = field(
        default="classification",
        metadata={
            "help": "what is predicted: classes (label column), survival (time,event columns: event 1 = "
            "observed, 0 = censored) or a number (target column)"
        },
    )
    survival_loss: Literal["nll", "cox"] = field(
        default="nll",
        metadata={
            "shown_with": {"task": ("survival",)},
            "help": "survival: discrete-time likelihood with censoring (works one bag per step) or Cox "
            "partial likelihood over a batch (data.batch_size >= 2)",
        },
    )
    time_bins: int = field(
        default=4,
        metadata={
            "shown_with": {"task": ("survival",)},
            "min": 2,
            "max": 64,
            "help": "survival nll: time intervals, cut at quantiles of the training set's event times",
        },
    )
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
        metadata={
            "help": "level-0 µm per pixel of slides whose files state none and whose table rows give no mpp "
            "(else they are an error)"
        },
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
    tile_cache: str = field(
        default="auto",
        metadata={
            "help": "folder where each slide's tissue mask and tile grid are kept, so later runs, cv folds, "
            "napari and predict do not tile it again (auto = .tiles in the folder holding run.out_dir; "
            "none = tile on every run)"
        },
    )
    skip_bad_slides: bool = field(
        default=False,
        metadata={
            "help": "leave out of training, with a message, a slide that cannot be tiled or read (a file "
            "that does not open or decode, one that took down two decode workers) instead of stopping the "
            "run (one rank: not with torchrun)"
        },
    )
    bag_size: int = field(
        default=32,
        metadata={
            "label": "tiles per slide (0 = all)",
            "min": 0,
            "help": "tiles sampled per slide for training (0 = all)",
        },
    )
    instance_weight: float = field(
        default=1.0,
        metadata={
            "label": "weight of annotated tiles",
            "min": 0,
            "help": "weight of the loss on annotated tiles (the slide table's annotations column) beside the "
            "slide loss; 0 = ignore annotations. Annotated tiles are always in the bag (up to half of it)",
        },
    )
    instance_loss: Literal["attention", "tiles"] = field(
        default="attention",
        metadata={
            "label": "annotated tiles teach",
            "choices": {"attention": "the attention", "tiles": "a tile classifier"},
            "help": "attention: annotated tiles of a class draw attention, 'Not lesion' tiles none (MIL "
            "heads with attention scores); tiles: a per-tile classifier on the encoder's features (any "
            "MIL head; it trains the encoder, so not with a frozen one)",
        },
    )
    min_tissue: float = field(
        default=0.6, metadata={"min": 0, "max": 1, "help": "minimum tissue fraction of a tile"}
    )
    reject_ink: bool = field(
        default=True,
        metadata={
            "help": "pen ink, marker, dust and bubble rims are not tissue (judged in optical density "
            "against the slide's glass); false: the Big-Layers greyscale rule [3, 230] alone"
        },
    )
    ink_blue_green: float = field(
        default=0.6,
        metadata={
            "min": 0,
            "shown_with": {"reject_ink": (True,)},
            "help": "a pixel absorbing at least this share of blue light to green is no H&E stain "
            "(black, green, red ink, dust) unless it shows cell texture",
        },
    )
    ink_texture: float = field(
        default=0.01,
        metadata={
            "min": 0,
            "shown_with": {"reject_ink": (True,)},
            "help": "ink is a film of one colour: blue-violet or off-stain areas whose colour varies "
            "less than this (spread across their mean colour, over its strength) are ink, not nuclei",
        },
    )
    ink_flatness: float = field(
        default=PEN_FLATNESS,
        metadata={
            "min": 0,
            "shown_with": {"reject_ink": (True,)},
            "help": "pens of any colour on the glass (0 = off): on H&E slides, an area of one hue lying "
            "on open glass whose light varies by less than this share of its mean (over a "
            "nucleus-wide window) is ink, whatever its colour",
        },
    )
    fill_holes_um: float = field(
        default=100.0,
        metadata={
            "min": 0,
            "shown_with": {"reject_ink": (True,)},
            "help": "glass enclosed by tissue up to this many µm across (fat cells, lumens) counts as "
            "tissue (0 = none)",
        },
    )
    min_sharpness: float = field(
        default=0.1,
        metadata={
            "min": 0,
            "help": "tiles whose Laplacian variance over their own greyscale variance is below this, and "
            "below 0.4 x their slide's median, are out of focus (measured at about 32 px per tile; reported "
            "per slide)",
        },
    )
    exclude_blurred: bool = field(
        default=False, metadata={"help": "leave out-of-focus tiles (data.min_sharpness) out of training"}
    )
    exclude_classes: str = field(
        default="",
        metadata={
            "help": "region classes whose areas are left out, comma-separated (QuPath's ignored classes, "
            "ending in '*', always are)"
        },
    )
    image_size: int = field(
        default=256,
        metadata={
            "label": "image side (px)",
            "min": 1,
            "help": "side of the image read per slide at data.target_mpp (image methods)",
        },
    )
    batch_size: int = field(
        default=1,
        metadata={
            "label": "slides per step",
            "min": 1,
            "help": "images, or bags of tiles, per optimizer step",
        },
    )
    augment: bool = field(
        default=True,
        metadata={
            "label": "flips and rotations",
            "help": "quarter turns and mirrors, the same for a whole bag (bags also a brightness/contrast "
            "change), applied where the pixels become floats",
        },
    )
    stain_augment: bool = field(
        default=False,
        metadata={
            "label": "stain augmentation",
            "help": "random hematoxylin/eosin amounts, stain hues, a colour cast, hue and saturation, one "
            "draw per slide and epoch (recommended for MIL on cohorts whose slides come from other labs)",
        },
    )
    stain_augment_strength: float = field(
        default=0.67,
        metadata={
            "label": "stain augmentation strength",
            "min": 0,
            "max": 3,
            "help": "scales every range of data.stain_augment (0.67, chosen on the stain bench's tuning "
            "labs: dye amounts x0.5-2.0, stain hues ±30°, a cast of ±0.1 OD per channel, overall hue ±11°; "
            "1: x0.35-2.9, ±45°, ±0.15 OD, ±16°)",
        },
    )
    stain_normalise: Literal["none", "macenko", "reinhard"] = field(
        default="none",
        metadata={
            "label": "stain normalisation",
            "choices": {"none": "off", "macenko": "Macenko", "reinhard": "Reinhard"},
            "help": "map every slide's stain onto a reference's (training, prediction and heatmaps): "
            "macenko (stain vectors and amounts) or reinhard (colour statistics)",
        },
    )
    stain_reference: str | None = field(
        default=None,
        metadata={
            "help": "slide whose stain data.stain_normalise maps to (null = the bundled H&E reference); "
            "fitted once when training starts and kept in the checkpoint"
        },
    )
    inference_repeats: int = field(
        default=1,
        metadata={
            "min": 0,
            "help": "sampled bags averaged when validating each epoch (0 = all tiles); the test split and "
            "bigslide predict read every tile",
        },
    )
    features: str | None = field(
        default=None,
        metadata={
            "help": "folder of per-slide feature files <slide stem>.h5 (CLAM/TRIDENT layout): frozen "
            "encoders train from them and write the missing ones once (null = encode tiles every step)"
        },
    )
    features_foreign: bool = field(
        default=False,
        metadata={
            "help": "also take feature files without bigslide's attributes (made by CLAM, TRIDENT, ...): "
            "their encoder, tile size and µm/px cannot be checked; give their width in data.feature_dim"
        },
    )
    feature_dim: int = field(
        default=0,
        metadata={
            "min": 0,
            "help": "width of foreign feature files, the MIL head's input (e.g. 1024 for UNI); "
            "only with data.features_foreign",
        },
    )

    def __post_init__(self) -> None:
        self.csv, self.features = expand_home(self.csv), expand_home(self.features)
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
        methods = ["none", "macenko", "reinhard"]
        if self.stain_normalise not in methods:
            raise ConfigError(f"data.stain_normalise: {self.stain_normalise!r} is not one of {methods}")
        if self.stain_reference and self.stain_normalise == "none":
            raise ConfigError(
                "data.stain_reference: a reference slide is only used with data.stain_normalise "
                "macenko or reinhard"
            )
        self._check_features()
        if self.task == "survival" and self.survival_loss == "cox" and self.batch_size < 2:
            raise ConfigError(
                "data.survival_loss: cox compares the bags of a batch; set data.batch_size >= 2 "
                "(or use nll, which works one bag per step)"
            )

    def _check_features(self) -> None:
        if self.features_foreign and not self.features:
            raise ConfigError("data.features_foreign: give the folder of feature files in data.features")
        if self.features_foreign and self.feature_dim < 1:
            raise ConfigError(
                "data.feature_dim: give the width of the foreign feature files (their features dataset's "
                "second axis, e.g. 1024 for UNI), the MIL head's input size"
            )
        if self.feature_dim and not self.features_foreign:
            raise ConfigError(
                "data.feature_dim: only for foreign feature files (data.features_foreign: true); "
                "bigslide's own files have the encoder's width"
            )
        if self.features and (self.stain_augment or self.stain_normalise != "none"):
            raise ConfigError(
                "data.features: stored features are of the tiles as read, so data.stain_augment and "
                "data.stain_normalise cannot apply to them; turn those off, or leave data.features unset"
            )

    @property
    def tissue(self) -> TissueSettings:
        """What the tile grids count as tissue and leave out (`TissueSettings`)."""
        return TissueSettings(
            reject_ink=self.reject_ink,
            ink_blue_green=self.ink_blue_green,
            ink_texture=self.ink_texture,
            ink_flatness=self.ink_flatness,
            fill_holes_um=self.fill_holes_um if self.reject_ink else 0.0,
            min_sharpness=self.min_sharpness,
            exclude_blurred=self.exclude_blurred,
            exclude_classes=tuple(c.strip() for c in self.exclude_classes.split(",") if c.strip()),
        )

    @property
    def read_mpp(self) -> float:
        """`target_mpp` once resolved (always, after construction): the µm/px every slide is read at."""
        return float(self.target_mpp if self.target_mpp is not None else DEFAULT_MPP)
