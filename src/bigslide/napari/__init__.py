"""The napari plugin: reader, sample data and dock widgets (the only package importing napari/Qt).

Widgets are not imported here: napari loads each contribution from its own module through
`napari.yaml`, so opening a slide never pays for building the training widgets.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any


class _TritonBesideMesa(MetaPathFinder):
    """Refuses `import triton` while Mesa's LLVM is in the process.

    With software or Mesa GL (Xvfb, VMs, remote desktops, AMD), napari's canvas maps Mesa's libLLVM;
    importing triton afterwards (torchvision and torch._dynamo do at import time) loads a second LLVM and
    crashes the process. The check is made when triton is imported, whenever that is: a script may
    import the plugin before its viewer draws. bigslide never compiles kernels, so torch runs without
    triton (it treats the ImportError as "not installed").
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if fullname == "triton" and _mesa_llvm_loaded():
            raise ModuleNotFoundError(
                "triton is not loaded beside Mesa's LLVM (napari's OpenGL)", name=fullname
            )
        return None


def _mesa_llvm_loaded() -> bool:
    try:
        return "libLLVM" in Path("/proc/self/maps").read_text()
    except OSError:  # not Linux: no Mesa LLVM clash
        return False


if "triton" not in sys.modules and not any(isinstance(f, _TritonBesideMesa) for f in sys.meta_path):
    sys.meta_path.insert(0, _TritonBesideMesa())
