"""Does each method learn? Synthetic hematoxylin-eosin slides (tumour, subtle lesions) and UltraMNIST.

Parts (run seed by seed, so a time box still leaves every part with its first seeds):
- tumour_mil: every MIL method on tumour slides: test slide AUC, balanced accuracy, attention cell AUC.
- tumour_image: PatchGD, full-image GD and Big-Layer image on the same slides rendered whole; PatchGD's
  Z-block class evidence map scored like attention (the other two have no map).
- subtle: ABMIL-ACC against the frozen (random) encoder on subtle lesions (enlarged, pale, vesicular
  nuclei: same density, same mean colour), and, as a control that the change is in the pixels, the same
  encoder trained on the same tiles with tile labels from the lesion masks (tile AUC on the test slides).
- ultramnist: PatchGD at full size vs full-image GD at the size of equal training memory (measured: one
  training step's peak resident set) and at full size.

Each finished run is appended to `<out>/results.json` at once; a rerun skips runs already there and
continues an interrupted run from its last checkpoint when that run's configuration is unchanged.
`--docs` writes the tables into docs/benchmarks.md from that file.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import os
import platform
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import StandardScaler

from bigslide.bench.memory import MEASURE_MEMORY, MEASURE_TIME, peak_rss_delta, set_mmap_threshold, trim_heap
from bigslide.data.arrays import ArrayImageDataset
from bigslide.data.bags import BagDataset
from bigslide.data.sample import Batch, as_float
from bigslide.data.sources import RunData
from bigslide.data.table import SlideTable
from bigslide.engine import RunResult, TrainConfig, predict_slides, run_to_end, train
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.loop import checkpoint_path
from bigslide.engine.metrics import classification_metrics
from bigslide.engine.setup import build_method, build_optimizer
from bigslide.explain.localisation import lesion_cell_auc
from bigslide.memory.stepper import OptimStepper
from bigslide.nn.backbones import create_encoder
from bigslide.synthetic.slide_set import load_lesions, make_slide_set
from bigslide.synthetic.slides import LesionKind, lesion_fraction

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
    "ultramnist": (
        "ultramnist_epochs",
        "canvas",
        "matched_canvas",
        "canvases",
        "ultramnist_backbone",
        "ultramnist_k",
    ),
}
PARTS = ("tumour_mil", "tumour_image", "subtle", "ultramnist")
BEGIN, END = "<!-- bench learning: begin -->", "<!-- bench learning: end -->"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--slides", type=int, default=24, help="slides per set (1/2 train, 1/4 val, 1/4 test)"
    )
    parser.add_argument("--epochs", type=int, default=6, help="epochs of the MIL methods on tumour slides")
    parser.add_argument("--image-epochs", type=int, default=10, help="epochs of the image methods")
    parser.add_argument("--subtle-slides", type=int, default=48, help="slides in the subtle-lesion set")
    parser.add_argument("--subtle-epochs", type=int, default=100, help="epochs on subtle-lesion slides")
    parser.add_argument("--subtle-tile", type=int, default=64, help="subtle tiles' side at 0.5 µm/px")
    parser.add_argument("--subtle-bag", type=int, default=64, help="tiles per subtle training bag")
    parser.add_argument(
        "--tile-label-epochs", type=int, default=4, help="epochs of the subtle task's tile-label control"
    )
    parser.add_argument("--backbone", default="test_resnet", help="timm model, random weights")
    parser.add_argument("--image-size", type=int, default=512, help="slide side rendered for image methods")
    parser.add_argument("--canvas", type=int, default=256, help="UltraMNIST canvas side")
    parser.add_argument(
        "--matched-canvas", type=int, default=0, help="GD's side at PatchGD's memory (0 = measure it)"
    )
    parser.add_argument("--canvases", type=int, default=640, help="UltraMNIST training canvases")
    parser.add_argument("--ultramnist-epochs", type=int, default=15, help="epochs on UltraMNIST")
    parser.add_argument(
        "--ultramnist-backbone",
        default="test_nfnet",
        help="timm model of both UltraMNIST methods, random weights (default: a normaliser-free net, so "
        "neither method depends on BatchNorm statistics)",
    )
    parser.add_argument(
        "--ultramnist-k", type=int, default=8, help="PatchGD's patches per image per inner iteration"
    )
    parser.add_argument("--out", default="runs/bench-learning")
    parser.add_argument(
        "--docs", help="write the tables from <out>/results.json into this Markdown file and exit"
    )


def _base_config(args: argparse.Namespace, name: str, method: str, seed: int) -> TrainConfig:
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
    config = _base_config(args, name, method, seed)
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
    assert result.checkpoint is not None
    table = SlideTable.from_csv(csv)
    test = table.subset("test")
    preds, raw = predict_slides(result.checkpoint, test, repeats=0)
    labels = np.array([table.encode(e.label) for e in test.entries])
    metrics = classification_metrics(labels, raw.probs)
    lesions = load_lesions(csv.parent / "lesions.json")
    map_name = "attention" if method not in IMAGE_METHODS else "evidence"
    aucs = [
        lesion_cell_auc(p.grids[map_name], lesions[Path(e.path).name])
        for p, e in zip(preds, test.entries)
        if e.label == "tumor" and map_name in p.grids
    ]
    if aucs:
        metrics["cell_auc"] = float(np.nanmean(aucs))
    return metrics


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


def ultramnist_config(args: argparse.Namespace, method: str, size: int, seed: int, name: str) -> TrainConfig:
    config = _base_config(args, name, method, seed)
    config.model.backbone = args.ultramnist_backbone
    config.data.source = "ultramnist"
    config.data.ultramnist_count = args.canvases
    # Digit task (3-5 glyphs of the label's digit; learnable from several hundred canvases on a CPU, where
    # the paper's digit sums need tens of thousands) with digits of 4-8 px on a 256² canvas: readable at
    # full size (GD at 256² learns them), gone when the canvas is shrunk 2x. Every size sees the same
    # canvases, drawn at --canvas and shrunk to `size`.
    config.data.ultramnist_task = "digit"
    config.data.ultramnist_smallest_digit, config.data.ultramnist_largest_digit = ULTRAMNIST_DIGITS
    config.data.ultramnist_canvas = args.canvas
    config.data.image_size = size
    config.data.batch_size = 2
    config.data.augment = False
    config.optim.lr = 1e-3
    config.optim.epochs = args.ultramnist_epochs
    if method == "patchgd":
        # Patches of 32 px (a digit of 4-8 px seldom straddles two), k patches per image per inner
        # iteration, one optimizer step per batch (epsilon = the inner iterations), as GD steps once per
        # batch. The pool head: the paper's CNN head, trained from random weights on this task, fits the
        # noise its normalisation makes of the encoder's first, near-identical cells (training loss above
        # ln 10 for all 15 epochs). The backbone has no BatchNorm, so each Z cell is its patch's encoding
        # alone, as GD's image is its own.
        cells = (args.canvas // ULTRAMNIST_PATCH) ** 2
        config.method.params = {
            "patch_size": ULTRAMNIST_PATCH,
            "k": args.ultramnist_k,
            "epsilon": -(-cells // args.ultramnist_k),
            "latent_dim": 64,
            "head": "pool",
        }
    return config


def step_memory(config: TrainConfig) -> int:
    """Peak rise of the resident set (bytes) over one training step of `config`'s method on a batch of
    random images of its size, after a warm-up step (optimizer state, gradient buffers)."""
    device = torch.device("cpu")
    torch.manual_seed(0)
    method = build_method(config, [str(c) for c in range(10)], device)
    method.model.train()
    stepper = OptimStepper(build_optimizer(config, method), device=device)
    side, batch = config.data.image_size, config.data.batch_size

    def step() -> None:
        images, labels = torch.rand(batch, 3, side, side), torch.randint(0, 10, (batch,))
        method.train_step(Batch(images, labels, []), stepper)

    step()
    gc.collect()
    trim_heap()
    set_mmap_threshold(MEASURE_MEMORY)  # large blocks mmapped: the resident set follows live tensors
    try:
        return peak_rss_delta(step)[1]
    finally:
        set_mmap_threshold(MEASURE_TIME)


def matched_side(args: argparse.Namespace) -> int:
    """The largest GD side (a multiple of 16) whose training step needs no more memory than PatchGD's at
    --canvas, both measured here."""
    patchgd = step_memory(ultramnist_config(args, "patchgd", args.canvas, 0, "memory"))
    best = 16
    for side in range(16, args.canvas + 1, 16):
        gd = step_memory(ultramnist_config(args, "full_image", side, 0, "memory"))
        mb = f"gd@{side}: {gd / 2**20:.1f} MB, patchgd@{args.canvas}: {patchgd / 2**20:.1f} MB"
        print(f"ultramnist step memory: {mb}", flush=True)
        if gd > patchgd:
            break
        best = side
    return best


def ultramnist_run(
    args: argparse.Namespace, method: str, size: int, seed: int, name: str
) -> dict[str, float]:
    config = ultramnist_config(args, method, size, seed, name)
    step = step_memory(config)
    history = train_run(config).history
    val = history[-1]["val"]
    return {"accuracy": val["accuracy"], "qwk": val["qwk"], "step_mb": step / 2**20}


def _slide_set(args: argparse.Namespace, kind: LesionKind) -> Path:
    cache = Path(os.environ.get("BIGSLIDE_CACHE", Path.home() / ".cache" / "bigslide"))
    n_slides = args.slides if kind == "tumour" else args.subtle_slides
    # Subtle: 3-5 lesions per positive slide (about 1 tile in 8 of its tissue), so a bag holds several.
    return make_slide_set(
        cache / f"learning-{kind}-{n_slides}",
        n_slides=n_slides,
        seed=11,
        lesion_kind=kind,
        lesion_count=(1, 3) if kind == "tumour" else (3, 5),
    )


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    path = out / "results.json"
    if args.docs:
        write_docs(json.loads(path.read_text()), Path(args.docs))
        print(f"wrote the learning tables from {path} into {args.docs}")
        return 0
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        print(f"bigslide: error: --parts: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    given = sys.argv[sys.argv.index("learning") + 1 :] if "learning" in sys.argv else None
    if given is None:  # called from Python: every setting, as parsed
        given = [
            f"--{k.replace('_', '-')} {v}" for k, v in sorted(vars(args).items()) if v not in (None, False)
        ]
    command = "bigslide bench learning " + " ".join(given)
    meta = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "backbone": args.backbone,
        **{key: getattr(args, key) for part in parts for key in PART_SETTINGS[part]},
    }
    state = _update(path, meta=meta, command=command.strip())
    runs = state["runs"]
    csvs = {kind: _slide_set(args, kind) for kind in ("tumour", "subtle") if _needs(kind, parts)}
    if "ultramnist" in parts:
        matched = args.matched_canvas or matched_side(args)
    for seed in [int(s) for s in args.seeds.split(",")]:
        jobs: list[tuple[str, str, Any]] = []
        if "tumour_mil" in parts:
            jobs += [
                ("tumour_mil", m, partial(slide_run, args, csvs["tumour"], "tumour", m, seed))
                for m in MIL_METHODS
            ]
        if "tumour_image" in parts:
            jobs += [
                ("tumour_image", m, partial(slide_run, args, csvs["tumour"], "tumour", m, seed))
                for m in IMAGE_METHODS
            ]
        if "subtle" in parts:
            jobs += [
                ("subtle", m, partial(slide_run, args, csvs["subtle"], "subtle", m, seed))
                for m in SUBTLE_METHODS
            ]
            jobs.append(("subtle", "tile_labels", partial(tile_label_run, args, csvs["subtle"], seed)))
            jobs.append(("subtle", "frozen_probe", partial(frozen_probe_run, args, csvs["subtle"], seed)))
        if "ultramnist" in parts:
            sizes = {
                f"patchgd@{args.canvas}": ("patchgd", args.canvas),
                f"gd@{matched}": ("full_image", matched),
                f"gd@{args.canvas}": ("full_image", args.canvas),
            }
            jobs += [
                ("ultramnist", name, partial(ultramnist_run, args, m, size, seed, f"ultramnist-{name}"))
                for name, (m, size) in sizes.items()
            ]
        for part, name, job in jobs:
            key = f"{part}/{name}/seed{seed}"
            if key in runs:
                continue
            runs[key] = job()
            state = _update(path, key=key, value=runs[key])
            print(f"{key}: " + "  ".join(f"{k}={v:.3f}" for k, v in runs[key].items()), flush=True)
    print(render_tables(state))
    return 0


def _update(path: Path, **change: Any) -> dict[str, Any]:
    """Read-modify-write the results file under a lock, so several bench processes can share it."""
    with path.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        state.setdefault("runs", {})
        state.setdefault("commands", [])
        if "meta" in change:
            # Parts may be run apart, each with its own settings; a setting must not change under a part
            # that already has runs.
            old = state.setdefault("meta", {})
            clash = sorted(k for k, v in change["meta"].items() if old.get(k, v) != v)
            if clash:
                raise SystemExit(f"{path}: made with other settings ({', '.join(clash)}); pass another --out")
            old.update(change["meta"])
            if change["command"] not in state["commands"]:
                state["commands"].append(change["command"])
        if "key" in change:
            state["runs"][change["key"]] = change["value"]
        path.write_text(json.dumps(state, indent=1))
        return state


def _needs(kind: str, parts: list[str]) -> bool:
    return ("subtle" in parts) if kind == "subtle" else bool({"tumour_mil", "tumour_image"} & set(parts))


def mean_sd(values: list[float]) -> str:
    values = [v for v in values if np.isfinite(v)]
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.3f} ± {sd:.3f}" if len(values) > 1 else f"{values[0]:.3f} (1 seed)"


def _table(runs: dict[str, dict[str, float]], part: str, columns: dict[str, str]) -> list[str]:
    names: dict[str, list[dict[str, float]]] = {}
    for key, value in runs.items():
        p, name, _seed = key.split("/")
        if p == part:
            names.setdefault(name, []).append(value)
    if not names:
        return ["(not measured)", ""]
    lines = ["| run | seeds | " + " | ".join(columns.values()) + " |", "|---|---:|" + "---:|" * len(columns)]
    for name, rows in names.items():
        cells = [mean_sd([r.get(k, float("nan")) for r in rows]) for k in columns]
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def render_tables(state: dict[str, Any]) -> str:
    """The Markdown tables (mean ± sd over seeds) of every part measured so far."""
    runs, meta = state.get("runs", {}), state.get("meta", {})
    slide_cols = {"auc": "test AUC", "balanced_accuracy": "balanced accuracy", "cell_auc": "map cell AUC"}
    lines = [
        f"Machine: 2-core CPU VM, shared; torch {meta.get('torch')}, Python "
        f"{meta.get('python')}. Commands: "
        + ", ".join(f"`nice -n 5 {c}`" for c in state.get("commands", []))
        + f". {meta.get('slides')} (tumour) and {meta.get('subtle_slides')} (subtle) slides of 1024² per set "
        f"(half train, a quarter validation, a quarter test), backbone "
        f"`{meta.get('backbone')}` from random weights; epochs: "
        + ", ".join(
            f"{meta[key]} ({what})"
            for key, what in (
                ("epochs", "tumour MIL"),
                ("image_epochs", "tumour image methods"),
                ("ultramnist_epochs", "UltraMNIST"),
                ("subtle_epochs", "subtle"),
            )
            if key in meta
        )
        + ". "
        "Mean ± sd over the seeds measured; *map cell AUC* is "
        "the AUC of the attention (MIL) or Z-block class-evidence (PatchGD) cells, lesion (> 10 % lesion) "
        "against other tissue cells, averaged over the tumour test slides.",
        "",
        "### Tumour lesions, MIL methods (tiles of 32 px at 1 µm/px, bag 24)",
        "",
        *_table(runs, "tumour_mil", slide_cols),
        f"### Tumour lesions, whole-slide image methods ({meta.get('image_size')}² per slide at 1 µm/px)",
        "",
        *_table(runs, "tumour_image", slide_cols),
        f"### Subtle lesions (enlarged, pale, vesicular nuclei; same density and mean colour; tiles of "
        f"{meta.get('subtle_tile')} px at 0.5 µm/px, bag {meta.get('subtle_bag')}, learning rate "
        f"{SUBTLE_LR}. Controls, tile AUC on the test slides' tiles with labels from the lesion masks: "
        "*tile_labels*, ABMIL-ACC's encoder trained on single tiles for "
        f"{meta.get('tile_label_epochs')} epochs; *frozen_probe*, a logistic regression on the features "
        "of a frozen random encoder of the same backbone, drawn from the run's seed)",
        "",
        *_table(runs, "subtle", {**slide_cols, "tile_auc": "tile AUC"}),
        "### UltraMNIST: PatchGD vs GD at equal memory"
        + (
            f" ({meta['canvases']} training canvases, digits of {ULTRAMNIST_DIGITS[0] * meta['canvas']:g}-"
            f"{ULTRAMNIST_DIGITS[1] * meta['canvas']:g} px on {meta['canvas']}², backbone "
            f"`{meta.get('ultramnist_backbone')}`; PatchGD: {ULTRAMNIST_PATCH} px patches, k "
            f"{meta.get('ultramnist_k')}, pool head; validation accuracy, chance 0.1)"
            if "canvases" in meta
            else ""
        ),
        "",
        *_table(runs, "ultramnist", {"accuracy": "accuracy", "qwk": "QWK", "step_mb": "step MB"}),
    ]
    return "\n".join(lines)


def write_docs(state: dict[str, Any], path: Path) -> None:
    """Replace the text between the bench's markers in `path` with freshly rendered tables."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no '{BEGIN}' ... '{END}' markers to write between")
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{render_tables(state)}\n{END}{tail}")
