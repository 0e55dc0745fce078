"""The napari plugin: reader, sample data and dock widgets (the only package importing napari/Qt).

Widgets are not imported here: napari loads each contribution from its own module through
`napari.yaml`, so opening a slide never pays for building the training widgets.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _keep_triton_away_from_mesa() -> None:
    """Stop torch from loading triton when Mesa's LLVM is already in the process.

    With software or Mesa GL (Xvfb, VMs, remote desktops, AMD), napari's canvas maps Mesa's
    libLLVM; importing triton afterwards (torchvision and torch._dynamo do at import time) loads a
    second LLVM and crashes the process. bigslide never compiles kernels, so torch runs without it.
    """
    if "triton" in sys.modules:
        return
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # not Linux: no Mesa LLVM clash
        return
    if "libLLVM" in maps:
        sys.modules["triton"] = None  # type: ignore[assignment]  # makes `import triton` fail cleanly


_keep_triton_away_from_mesa()
