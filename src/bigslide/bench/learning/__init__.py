"""Does each method learn? Synthetic hematoxylin-eosin slides (tumour, subtle lesions) and UltraMNIST.

Parts (run seed by seed, so a time box still leaves every part with its first seeds):
- tumour_mil: every MIL method on tumour slides: test slide AUC, balanced accuracy, attention cell AUC.
- tumour_image: PatchGD, full-image GD and Big-Layer image on the same slides rendered whole; PatchGD's
  Z-block class evidence map scored like attention (the other two have no map).
- subtle: ABMIL-ACC against the frozen (random) encoder on subtle lesions (enlarged, pale, vesicular
  nuclei: same density, same mean colour), and, as a control that the change is in the pixels, the same
  encoder trained on the same tiles with tile labels from the lesion masks (tile AUC on the test slides).
- annotations: ABMIL-ACC on the subtle slides with teaching annotations drawn from the lesion masks (a
  quarter of the training lesions, some normal areas) against the same runs without them: test slide AUC,
  balanced accuracy, attention cell AUC and the first epoch with validation AUC >= 0.9.
- stain: ABMIL-ACC trained as `bigslide demo` does (for longer) on the demo slides (lab A) with flips
  only, with stain augmentation (strength 1/3 to 4/3), with Macenko or Reinhard normalisation, with both, and
  with the product's defaults, tested on the demo's test slides as lab A, labs B and C and labs drawn at
  random stain them: tuning labs for every run, held-out labs (drawn after the defaults were chosen on
  the tuning labs) for the runs before and after.
- study: survival, regression and cases of three slides (one lesion slide makes a case positive) on the
  synthetic study slides, ABMIL-ACC against the frozen encoder, test C-index / Pearson r / case AUC next to
  the oracle's (the quantity the outcome was made from).
- ultramnist: PatchGD at full size vs full-image GD at the size of equal training memory (measured: one
  training step's peak resident set) and at full size.

Each finished run is appended to `<out>/results.json` at once; a rerun skips runs already there and
continues an interrupted run from its last checkpoint when that run's configuration is unchanged.
`--docs` writes the tables into docs/benchmarks.md from that file; `--merge OTHER` replaces the runs of
`--parts` in it with those of OTHER/results.json (with their commands and settings), so parts run apart
share one file.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bigslide.bench.learning.annotations import ARMS, annotated_set, annotation_run
from bigslide.bench.learning.controls import frozen_probe_run, lesion_tiles, tile_label_run
from bigslide.bench.learning.runs import (
    IMAGE_METHODS,
    MIL_METHODS,
    PART_SETTINGS,
    PARTS,
    SUBTLE_METHODS,
    SUBTLE_MPP,
    slide_run,
    train_run,
)
from bigslide.bench.learning.stain import (
    HELD_OUT_LABS,
    STAIN_RUNS,
    TUNING_LABS,
    described,
    stain_labs,
    stain_run,
    stain_sets,
    wanted_keys,
)
from bigslide.bench.learning.study import STUDY_KINDS, STUDY_METHODS, study_run, study_set
from bigslide.bench.learning.suggest import ARMS as SUGGEST_ARMS
from bigslide.bench.learning.suggest import CONTROLS, arm_run, control_run, start_scores
from bigslide.bench.learning.tables import render_tables, write_docs
from bigslide.bench.learning.ultramnist import matched_side, step_memory, ultramnist_config, ultramnist_run
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.synthetic.slides import LesionKind

__all__ = [
    "add_arguments",
    "frozen_probe_run",
    "lesion_tiles",
    "render_tables",
    "run",
    "step_memory",
    "train_run",
    "ultramnist_config",
]


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
        "--annotated-epochs", type=int, default=60, help="epochs of the annotations part (subtle slides)"
    )
    parser.add_argument(
        "--suggest-start-epochs",
        type=int,
        default=100,
        help="suggest part: epochs of the checkpoint the places are picked from (the subtle part's: a model "
        "that has learnt where to look; a start at chance has no mistakes to point at)",
    )
    parser.add_argument(
        "--suggest-epochs", type=int, default=20, help="suggest part: epochs of each retrain on the answers"
    )
    parser.add_argument(
        "--suggest-retrain",
        choices=("anew", "continue"),
        default="continue",
        help="suggest part: each retrain continues the start's checkpoint for --suggest-epochs (continue, "
        "as napari's Retrain with annotations), or trains the start's initial weights for the start's and "
        "the retrain's epochs with the answers from the first epoch (anew, as its 'train anew')",
    )
    parser.add_argument("--suggest-k", default="8,16", help="suggest part: answered areas per retrain")
    parser.add_argument(
        "--tile-label-epochs", type=int, default=4, help="epochs of the subtle task's tile-label control"
    )
    parser.add_argument(
        "--stain-epochs",
        type=int,
        default=24,
        help="epochs of the stain part (`bigslide demo`'s other settings; at its 4 epochs the training loss "
        "stays near ln 2 for three of them, too early to tell how a model holds other labs)",
    )
    parser.add_argument(
        "--stain-tuning-labs",
        default=",".join(str(s) for s in TUNING_LABS),
        help="seeds of the drawn labs the stain settings are compared on",
    )
    parser.add_argument(
        "--stain-held-out-labs",
        default=",".join(str(s) for s in HELD_OUT_LABS),
        help="seeds of the drawn labs held out: scored only with the defaults and the augmentations chosen "
        "(disjoint from the tuning labs; the retired held-out labs are scored the same way)",
    )
    parser.add_argument("--study-slides", type=int, default=48, help="slides per study set (cases: 16 of 3)")
    parser.add_argument("--study-epochs", type=int, default=30, help="epochs on the study sets")
    parser.add_argument("--study-bag", type=int, default=64, help="tiles per study training bag")
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
    parser.add_argument(
        "--merge",
        help="replace the runs of --parts in <out>/results.json with those of <MERGE>/results.json, "
        "with their commands and settings, and exit",
    )


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
    if args.merge:
        merge_parts(path, Path(args.merge) / "results.json", parts)
        print(f"replaced the runs of {', '.join(parts)} in {path} with those of {args.merge}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    given = sys.argv[sys.argv.index("learning") + 1 :] if "learning" in sys.argv else None
    if given is None:  # called from Python: every setting, as parsed
        given = [
            f"--{k.replace('_', '-')} {v}" for k, v in sorted(vars(args).items()) if v not in (None, False)
        ]
    niceness = os.nice(0)  # the runs' times depend on it: the table says how each command ran
    command = (f"nice -n {niceness} " if niceness else "") + "bigslide bench learning " + " ".join(given)
    meta = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "backbone": args.backbone,
        **{key: getattr(args, key) for part in parts for key in PART_SETTINGS[part]},
    }
    state = _update(path, meta=meta, command=command.strip())
    runs = state["runs"]
    csvs = {kind: _slide_set(args, kind) for kind in ("tumour", "subtle") if _needs(kind, parts)}
    studies = {kind: study_set(args, kind) for kind in STUDY_KINDS} if "study" in parts else {}
    if "ultramnist" in parts:
        matched = args.matched_canvas or matched_side(args)
    if "stain" in parts:
        labs = stain_labs(args)
        sets = stain_sets(labs)
        state = _update(path, stain_labs={**labs, "described": described(labs)})
        runs = state["runs"]
    if {"annotations", "suggest"} & set(parts):
        annotated = annotated_set(csvs["subtle"], args.subtle_tile, SUBTLE_MPP)
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
        if "annotations" in parts:
            jobs += [
                ("annotations", arm, partial(annotation_run, args, annotated, arm, seed)) for arm in ARMS
            ]
        if "suggest" in parts:
            subtle = csvs["subtle"]
            jobs.append(("suggest", "start", partial(start_scores, args, subtle, seed)))
            jobs += [("suggest", c, partial(control_run, args, subtle, annotated, c, seed)) for c in CONTROLS]
            jobs += [
                ("suggest", f"{arm}-k{k}", partial(arm_run, args, subtle, arm, int(k), seed))
                for k in args.suggest_k.split(",")
                for arm in SUGGEST_ARMS
            ]
        if "stain" in parts:
            jobs += [("stain", name, partial(stain_run, args, sets, labs, name, seed)) for name in STAIN_RUNS]
        for kind, csv_path in studies.items():
            jobs += [
                ("study", f"{kind}-{m}", partial(study_run, args, csv_path, kind, m, seed))
                for m in STUDY_METHODS
            ]
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
            if key in runs and (part != "stain" or wanted_keys(name, labs) <= set(runs[key])):
                continue
            # a stain run missing a lab (added later) is scored on it from its finished checkpoint
            runs[key] = {**runs.get(key, {}), **job()}
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
        if "stain_labs" in change:  # the labs of the latest stain runs; each run's scores name their lab
            state["stain_labs"] = change["stain_labs"]
        path.write_text(json.dumps(state, indent=1))
        return state


def merge_parts(path: Path, other: Path, parts: list[str]) -> None:
    """Replace the runs of `parts` in the results file `path` with those of the results file `other`: the
    runs, the commands that ran only those parts, and the settings of those parts."""
    source = json.loads(other.read_text())
    with path.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(path.read_text())

        def of_parts(key: str) -> bool:
            return key.split("/")[0] in parts

        def only_parts(command: str) -> bool:
            words = command.split()
            given = words[words.index("--parts") + 1].split(",") if "--parts" in words else list(PARTS)
            return set(given) <= set(parts)

        state["runs"] = {
            **{k: v for k, v in state["runs"].items() if not of_parts(k)},
            **{k: v for k, v in source["runs"].items() if of_parts(k)},
        }
        state["commands"] = [c for c in state["commands"] if not only_parts(c)] + [
            c for c in source["commands"] if only_parts(c)
        ]
        for part in parts:
            state["meta"].update({k: source["meta"][k] for k in PART_SETTINGS[part] if k in source["meta"]})
        if "stain" in parts and "stain_labs" in source:
            state["stain_labs"] = source["stain_labs"]
        path.write_text(json.dumps(state, indent=1))


def _needs(kind: str, parts: list[str]) -> bool:
    if kind == "subtle":
        return bool({"subtle", "annotations", "suggest"} & set(parts))
    return bool({"tumour_mil", "tumour_image"} & set(parts))
