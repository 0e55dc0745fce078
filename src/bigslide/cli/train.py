"""`bigslide train` and `bigslide cv`: their flags, and the run's config made from a config file or a
slide table with the flags' overrides."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from bigslide.errors import ConfigError

if TYPE_CHECKING:
    from bigslide.engine.config import TrainConfig

SLIDE_MPP_HELP = (
    "level-0 µm per pixel of slides whose files state none and table rows give no mpp (data.slide_mpp)"
)
TARGET_MPP_HELP = "µm per pixel tiles and images are read at (data.target_mpp; 0.5 = 20x)"
AMBIGUOUS_MPP = (
    "--mpp is ambiguous and no longer taken: give --slide-mpp (level-0 µm/px of slides whose files state "
    "none) or, for train, --target-mpp (µm/px the model reads tiles at)"
)


class _Refuse(argparse.Action):
    """A flag that only says which flags to use instead."""

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        parser.error(AMBIGUOUS_MPP)


def add_mpp_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slide-mpp", type=float, help=SLIDE_MPP_HELP)
    p.add_argument("--mpp", action=_Refuse, help=argparse.SUPPRESS)


def _set_dotted(values: dict[str, Any], assignment: str) -> None:
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r}: expected key=value, e.g. method.params.chunk_size=16")
    node = values
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: {part} is not a section")
    node[parts[-1]] = yaml.safe_load(raw)


TABLE_SUFFIXES = (".csv", ".tsv")
"""A file of these given where `train` and `cv` take a config is a slide table."""
WORKBOOK_SUFFIXES = (".xlsx", ".xls", ".ods")
"""Spreadsheets given where a config or table goes: said to be saved as CSV, not parsed as YAML."""


def config_from_args(args: argparse.Namespace) -> Any:
    from bigslide.engine.config import TrainConfig

    config = TrainConfig()
    if args.config and Path(args.config).suffix.lower() in WORKBOOK_SUFFIXES:
        raise ConfigError(
            f"{args.config}: a spreadsheet workbook; save its sheet as CSV (columns slide,label[,split]) "
            "and give that table, or give a config file (YAML)"
        )
    if args.config and Path(args.config).suffix.lower() in TABLE_SUFFIXES:
        config.data.csv = str(Path(args.config).resolve())  # a slide table: trained on with the defaults
    elif args.config:
        config = TrainConfig.from_yaml(args.config)
    values = config.to_dict()
    if args.demo:
        values["data"]["source"] = "demo"
    if args.method:
        values["method"] = {"name": args.method, "params": {}}
    for assignment in args.set or []:
        _set_dotted(values, assignment)
    given = {a.partition("=")[0].strip() for a in args.set or []}
    for said, other in (("magnification", "target_mpp"), ("target_mpp", "magnification")):
        if f"data.{said}" in given and f"data.{other}" not in given:
            values["data"][other] = None  # the resolution given here wins over the config's (or default's)
    if args.max_steps is not None:
        values["optim"]["max_steps"] = args.max_steps
    if args.epochs is not None:
        values["optim"]["epochs"] = args.epochs
    if args.out:
        values["run"]["out_dir"] = args.out
    if args.device:
        values["run"]["device"] = args.device
    if args.slide_mpp is not None:
        values["data"]["slide_mpp"] = args.slide_mpp
    if args.target_mpp is not None:
        values["data"]["target_mpp"] = args.target_mpp
        values["data"]["magnification"] = None  # the resolution given here wins over the config's
    return TrainConfig.from_dict(values, source="command line")


def cmd_train(args: argparse.Namespace) -> int:
    from bigslide.cli.progress import run_with_progress
    from bigslide.engine import train

    config = config_from_args(args)
    moved = beside_a_trained_run(config, args.resume)
    main_rank = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 reports
    if moved and main_rank:
        print(f"bigslide: {moved}", file=sys.stderr, flush=True)
    result = run_with_progress(train(config, resume=args.resume), quiet=args.quiet or not main_rank)
    if main_rank:
        print(f"checkpoint: {result.checkpoint}\nmetrics: {result.out_dir / 'metrics.json'}")
    return 0


def beside_a_trained_run(config: TrainConfig, resume: bool) -> str | None:
    """A run's folder that holds a trained checkpoint is continued (--resume), never trained over (its
    config.yaml names that folder, so a replay would replace the trained model): the new run goes to the
    first `<folder>-2`, `-3`, ... that holds none. What to say of it; None when the folder is free."""
    from bigslide.engine.run_folder import LAST

    taken = Path(config.run.out_dir)
    if resume or not (taken / LAST).is_file():
        return None
    k = 2
    while (Path(f"{taken}-{k}") / LAST).is_file():
        k += 1
    config.run.out_dir = f"{taken}-{k}"
    return (
        f"{taken} holds a trained run (--resume continues it): this one trains into {config.run.out_dir}, "
        "and that run is left as it is"
    )


def add_train_flags(
    p: argparse.ArgumentParser, resume: str = "continue from <out>/checkpoints/last.pt"
) -> None:
    """The flags of `train`, which `cv` takes too."""
    p.add_argument(
        "config",
        nargs="?",
        help="YAML config (as written to <out>/config.yaml by any run), or a slide table (.csv) to train on "
        "with the default settings",
    )
    p.add_argument("--demo", action="store_true", help="train on the bundled synthetic slides")
    p.add_argument("--method", help="method name (see `bigslide methods`)")
    p.add_argument("--max-steps", type=int, help="stop after this many batches")
    p.add_argument("--epochs", type=int)
    p.add_argument("--out", help="output folder (checkpoints, metrics, config)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override, e.g. optim.lr=1e-4 (repeatable)"
    )
    add_mpp_flags(p)
    p.add_argument("--target-mpp", type=float, help=TARGET_MPP_HELP)
    p.add_argument("--resume", action="store_true", help=resume)
    p.add_argument("--quiet", action="store_true")


def cmd_cv(args: argparse.Namespace) -> int:
    from bigslide.cli.cv import run_cv

    return run_cv(args, config_from_args(args))
