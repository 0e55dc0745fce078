"""`bigslide plan`'s command-line arguments, kept apart from the planner so `bigslide --help` stays quick."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-mem", required=True, help="device memory, e.g. 16GB, 512MB, 0.5GiB")
    parser.add_argument("--image", type=int, default=0, help="image side in pixels (image methods)")
    parser.add_argument("--batch", type=int, default=1, help="images per batch (image methods)")
    parser.add_argument("--bag", type=int, default=0, help="tiles per bag (bag methods)")
    parser.add_argument("--tile", type=int, default=256, help="MIL tile / PatchGD patch side (default 256)")
    parser.add_argument(
        "--backbone",
        default="resnet50",
        help="as model.backbone: a timm name, hf-hub:ORG/NAME or package.module:factory (default resnet50)",
    )
    parser.add_argument("--method", default="auto", help="a method name (`bigslide methods`), or auto")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="calibration device"
    )
    parser.add_argument("--margin", type=float, default=0.2, help="safety margin, fraction of --gpu-mem")
    parser.add_argument(
        "--cap-px", type=int, default=0, help="largest calibration input in pixels (0: by device)"
    )
