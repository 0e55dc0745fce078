"""`bigslide suggest`: where a pathologist's answer would teach a trained model most, as QuPath GeoJSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from bigslide.data.endpoint import Endpoint
from bigslide.data.table import SlideTable
from bigslide.engine.checkpoint import load_checkpoint
from bigslide.engine.suggest import suggest_from_checkpoint
from bigslide.errors import DataError
from bigslide.explain.suggest import flat_attention, normal_class, write_suggestions
from bigslide.words import counted


def run_suggest(args: argparse.Namespace) -> int:
    state = load_checkpoint(args.checkpoint)
    classes = [str(c) for c in state["classes"]]
    endpoint = Endpoint.from_state(state.get("endpoint"), classes)
    table = SlideTable.from_csv(
        args.slides,
        classes=classes if endpoint.task == "classification" else None,
        labels_required=False,
        task=endpoint.task,
    )
    if args.split == "train":
        table = table.like([e for e in table.entries if e.split in (None, "train")])
        if not table.entries:
            raise DataError(
                f"{args.slides}: no row of the training split (pass --split all to use every row)"
            )
    suggestions = suggest_from_checkpoint(
        args.checkpoint,
        table,
        args.count,
        table_csv=args.slides,
        normal=args.normal_class,
        area_tiles=args.area,
        device=args.device or "auto",
        slide_mpp=args.slide_mpp,
    )
    written = write_suggestions(suggestions, args.out)
    for s in suggestions:
        x, y = s.centre
        print(f"{s.rank:3d}. {Path(s.slide).name} at ({x:.0f}, {y:.0f}): {s.reason}")
    slides = len({s.slide for s in suggestions})
    print(f"{counted(len(suggestions), 'suggestion')} on {counted(slides, 'slide')}: {written[0]}")
    print(f"for QuPath, one file per slide in {written[0].with_suffix('')}/")
    note = flat_attention(suggestions)
    if note is not None:
        print(f"note: {note}")
    if endpoint.task == "classification" and args.normal_class is None and normal_class(classes) is None:
        print(
            f"note: no class is named as lesion-free ({', '.join(classes)}): no false alarms were sought; "
            "name it with --normal-class"
        )
    if len(suggestions) < args.count:
        print(
            f"note: only {counted(len(suggestions), 'place')} of the {args.count} asked for: these slides "
            "hold no more (places above their slide's mean attention, or uncertain, apart from each other, "
            "outside annotations, and a share of them per slide)"
        )
    return 0
