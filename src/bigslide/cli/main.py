"""`bigslide` command line: train, cv, predict, heatmap, demo, bench, plan."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bigslide.cli.train import add_mpp_flags, add_train_flags, cmd_cv, cmd_train
from bigslide.errors import BigslideError, ConfigError
from bigslide.files import out_of_files, too_many_open_files
from bigslide.plan.arguments import add_arguments as add_plan_arguments

BENCHES = (
    "grid",
    "tissue",
    "acc",
    "patchgd",
    "biglayer",
    "biglayer_capacity",
    "plan_check",
    "learning",
    "io",
    "predict",
    "features",
    "cohort",
    "epochs",
)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # stop like Ctrl-C: the run saves a checkpoint on the way out


CHECKPOINT_HELP = "a checkpoint file, or a run's folder (its checkpoints/last.pt)"


def run_checkpoint(value: str) -> Path:
    """`--checkpoint`: a file, or a run folder standing for the last checkpoint it saved."""
    from bigslide.engine.run_folder import checkpoint_of

    return checkpoint_of(value)


def cmd_predict(args: argparse.Namespace) -> int:
    from bigslide.cli.predict import run_predict

    return run_predict(args)


def cmd_suggest(args: argparse.Namespace) -> int:
    from bigslide.cli.suggest import run_suggest

    return run_suggest(args)


def cmd_heatmap(args: argparse.Namespace) -> int:
    from bigslide.cli.report import write_heatmaps
    from bigslide.engine import predict_slide

    if args.regions and len(args.slide) > 1:
        raise ConfigError("--regions: one GeoJSON of regions is for one slide; give one --slide with it")
    for slide in args.slide:
        pred = predict_slide(
            args.checkpoint,
            slide,
            regions=args.regions,
            device=args.device or "auto",
            slide_mpp=args.slide_mpp,
        )
        for path in write_heatmaps(pred, Path(args.out)):
            print(path)
        probs = ", ".join(f"{c}={p:.3f}" for c, p in zip(pred.classes, pred.probs))
        print(f"{Path(slide).name}: {pred.label}" + (f" ({probs})" if probs else ""))
        if pred.decision is not None:
            print(pred.decision.describe(pred.classes))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from bigslide.cli.demo import run_demo

    return run_demo(Path(args.out), method=args.method, epochs=args.epochs, quiet=args.quiet)


def bench_parser(name: str) -> argparse.ArgumentParser:
    """The arguments of `bigslide bench NAME`, from the bench's own module."""
    module = importlib.import_module(f"bigslide.bench.{name}")
    parser = argparse.ArgumentParser(prog=f"bigslide bench {name}", description=module.__doc__)
    module.add_arguments(parser)
    return parser


def cmd_bench(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"bigslide.bench.{args.bench}")
    return int(module.run(bench_parser(args.bench).parse_args(args.rest)))


def cmd_plan(args: argparse.Namespace) -> int:
    from bigslide.plan.recommend import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    from bigslide import __version__

    parser = argparse.ArgumentParser(prog="bigslide", description=__doc__)
    parser.add_argument("--version", action="version", version=f"bigslide {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model (YAML config, or --demo)")
    add_train_flags(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("cv", help="k-fold cross-validation by case: one run per fold and a summary")
    add_train_flags(p, resume="no effect: a rerun of the same command always continues where it stopped")
    p.add_argument("--folds", type=int, default=5, help="number of folds (K)")
    p.set_defaults(func=cmd_cv)

    p = sub.add_parser(
        "predict", help="predict a cohort of slides from a CSV with a checkpoint (resumable; see --overwrite)"
    )
    p.add_argument(
        "--slides",
        required=True,
        help=(
            "slide table (CSV with a slide column, labels optional: a labelled table is also scored), "
            "one slide, or a folder of slides"
        ),
    )
    p.add_argument("--checkpoint", required=True, type=run_checkpoint, help=CHECKPOINT_HELP)
    p.add_argument("--out", default="predictions")
    p.add_argument("--repeats", type=int, default=0, help="sampled bags averaged per slide (0 = all tiles)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--workers",
        type=int,
        help="processes decoding slides ahead of the model (default: the checkpoint's data.workers, as "
        "in training; 0 = read in this process)",
    )
    p.add_argument("--overwrite", action="store_true", help="predict again the slides whose outputs exist")
    p.add_argument("--no-heatmaps", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_mpp_flags(p)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser(
        "suggest", help="where an answer would teach the model most: places to review, as QuPath GeoJSON"
    )
    p.add_argument("--checkpoint", required=True, type=run_checkpoint, help=CHECKPOINT_HELP)
    p.add_argument("--slides", required=True, help="slide table (CSV) of the slides to look at")
    p.add_argument("--count", type=int, default=20, help="places to suggest (at most)")
    p.add_argument("--out", default="suggestions.geojson", help="GeoJSON of every suggestion")
    p.add_argument(
        "--split",
        default="train",
        choices=["train", "all"],
        help="the table's rows to look at: train (rows of the training split, or without a split; the "
        "default) or all",
    )
    p.add_argument(
        "--normal-class",
        help="the class of slides that hold no lesion, where high attention is a false alarm (default: the "
        "class named normal, negative, benign, ...)",
    )
    p.add_argument("--area", type=int, default=3, help="an area's side, in the model's tiles")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    add_mpp_flags(p)
    p.set_defaults(func=cmd_suggest)

    p = sub.add_parser("heatmap", help="heatmaps of slides: npz grid, PNG overlay, QuPath GeoJSON")
    p.add_argument("--checkpoint", required=True, type=run_checkpoint, help=CHECKPOINT_HELP)
    p.add_argument("--slide", required=True, action="append", help="a slide (repeat for several)")
    p.add_argument("--regions", help="GeoJSON of regions to restrict the tiles to")
    add_mpp_flags(p)
    p.add_argument("--out", default="heatmaps")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.set_defaults(func=cmd_heatmap)

    p = sub.add_parser("demo", help="make synthetic slides, train briefly, write metrics and a heatmap")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--method", default="abmil_acc")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("plan", help="predict peak memory per method and setting; recommend one that fits")
    add_plan_arguments(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("methods", help="list the training methods")
    p.set_defaults(func=cmd_methods)
    p = sub.add_parser(
        "encoders",
        help="list the timm models in the local Hugging Face cache (model.backbone hf-hub:ORG/NAME)",
    )
    p.set_defaults(func=cmd_encoders)

    p = sub.add_parser("bench", help="benchmarks (side-by-side timings and memory)")
    bench = p.add_subparsers(dest="bench", required=True, metavar="NAME")
    for name in BENCHES:
        # A bench's own arguments (and its --help) are parsed by its module once it is chosen: importing
        # every bench here would load torch for `bigslide --help`.
        bp = bench.add_parser(name, help=_summary(f"bigslide.bench.{name}"), add_help=False)
        bp.set_defaults(func=cmd_bench)
    return parser


def _summary(module: str) -> str | None:
    """The first line of a module's docstring, read without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text()))
    return doc.strip().splitlines()[0] if doc else None


def cmd_encoders(args: argparse.Namespace) -> int:
    from huggingface_hub import constants

    from bigslide.nn.hub_models import cached_hub_models

    found = cached_hub_models()
    for name in found:
        print(name)
    print(
        f"{len(found)} timm model{'s' * (len(found) != 1)} in the Hugging Face cache, "
        f"{constants.HF_HUB_CACHE} (HF_HOME, else ~/.cache/huggingface): give one as model.backbone "
        "(--set model.backbone=hf-hub:ORG/NAME); put one there once with `huggingface-cli download "
        "ORG/NAME` on a machine that can; any timm model name or package.module:factory works too",
        file=sys.stderr,
    )
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from bigslide.methods import available_methods, get_method

    for name in available_methods():
        cls = get_method(name)
        print(f"{name:16s} {cls.kind:6s} {cls.summary}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        args.rest = rest  # the bench's own parser reads these
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return int(args.func(args))
    except BigslideError as err:
        rank = os.environ.get("RANK", "0")
        named = str(err).startswith("rank ") or int(os.environ.get("WORLD_SIZE", "1")) <= 1
        print(f"bigslide: error: {'' if named else f'rank {rank}: '}{err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bigslide: stopped; the last checkpoint is kept", file=sys.stderr)
        return 130
    except OSError as err:
        if not out_of_files(err):
            raise
        print(f"bigslide: error: {too_many_open_files()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
