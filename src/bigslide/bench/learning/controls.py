"""The subtle part's controls: is the change in the pixels (tiles trained with labels from the lesion
masks), and do the frozen encoder's features hold it (a linear probe)?"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import StandardScaler

from bigslide.bench.learning.runs import SUBTLE_MPP, slide_config, train_run
from bigslide.data.arrays import ArrayImageDataset
from bigslide.data.bags import BagDataset
from bigslide.data.sample import as_float
from bigslide.data.sources import RunData
from bigslide.data.table import SlideTable
from bigslide.nn.backbones import create_encoder
from bigslide.synthetic.slide_set import load_lesions
from bigslide.synthetic.slides import lesion_fraction


def lesion_tiles(csv: Path, split: str, tile_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Every tissue tile of a split's slides at the subtle resolution, (N, H, W, 3) uint8, and its label:
    1 for tiles >= 50 % lesion, 0 for tiles with none (tiles in between are left out)."""
    table, lesions = SlideTable.from_csv(csv), load_lesions(csv.parent / "lesions.json")
    bags = BagDataset(table.subset(split), tile_size=tile_size, target_mpp=SUBTLE_MPP, bag_size=0)
    images, labels = [], []
    for i, entry in enumerate(bags.table.entries):
        bag = bags[i]
        assert bag.coords is not None
        share = lesion_fraction(lesions[Path(entry.path).name], bag.coords, bag.tile_size_level0)
        keep = (share >= 0.5) | (share == 0)
        images.append(bag.x[keep].permute(0, 2, 3, 1).numpy())
        labels.append((share[keep] >= 0.5).astype(np.int64))
    return np.concatenate(images), np.concatenate(labels)


def tile_label_run(args: argparse.Namespace, csv: Path, seed: int) -> dict[str, float]:
    """The subtle task's control: the encoder ABMIL-ACC trains (eval-mode BatchNorm, random weights)
    trained on single tiles with labels from the lesion masks, scored by tile AUC on the test slides'
    tiles: is the change learnable from these pixels?"""
    config = slide_config(args, csv, "subtle", "full_image", seed, "subtle-tile_labels")
    config.data.image_size = config.data.tile_size
    config.data.batch_size = 32
    config.method.params = {"bn_mode": "eval"}
    config.optim.epochs, config.optim.lr = args.tile_label_epochs, 2e-3
    train_set, test_set = (
        ArrayImageDataset(*lesion_tiles(csv, split, args.subtle_tile), name=f"{split} tiles")
        for split in ("train", "test")
    )
    data = RunData(classes=["normal", "lesion"], train=train_set, val=test_set)
    val = train_run(config, data).history[-1]["val"]
    return {"tile_auc": val["auc"], "balanced_accuracy": val["balanced_accuracy"]}


def frozen_probe_run(args: argparse.Namespace, csv: Path, seed: int) -> dict[str, float]:
    """The other control: do the frozen encoder's features hold the change? A logistic regression on
    the random encoder's features (standardised on the training tiles) with tile labels from the lesion
    masks, scored by tile AUC on the test slides' tiles."""
    torch.manual_seed(seed)
    encoder = create_encoder(args.backbone).eval()

    def features(split: str) -> tuple[np.ndarray, np.ndarray]:
        images, labels = lesion_tiles(csv, split, args.subtle_tile)
        x = torch.from_numpy(images).permute(0, 3, 1, 2)
        with torch.no_grad():
            f = torch.cat([encoder(as_float(chunk)) for chunk in x.split(256)])
        return f.numpy(), labels

    (train_x, train_y), (test_x, test_y) = features("train"), features("test")
    scaler = StandardScaler().fit(train_x)
    probe = LogisticRegression(max_iter=2000).fit(scaler.transform(train_x), train_y)
    return {"tile_auc": float(roc_auc_score(test_y, probe.decision_function(scaler.transform(test_x))))}
