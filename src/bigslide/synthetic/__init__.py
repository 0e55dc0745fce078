"""Synthetic data made on the fly: pyramidal TIFF writing, slides with planted lesions, UltraMNIST canvases.

Names are imported lazily so `bigslide.synthetic.pyramid` stays cheap (UltraMNIST pulls in torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bigslide.synthetic.slide_set import load_lesions, make_slide_set
    from bigslide.synthetic.slides import (
        SlideImage,
        SlideInfo,
        lesion_fraction,
        lesion_tiles,
        make_synthetic_slide,
        synthesize_slide,
    )
    from bigslide.synthetic.ultramnist import (
        UltraMNISTCanvas,
        make_ultramnist,
        render_canvas,
        ultramnist_label,
    )

_SOURCES = {
    "slides": (
        "SlideImage",
        "SlideInfo",
        "lesion_fraction",
        "lesion_tiles",
        "make_synthetic_slide",
        "synthesize_slide",
    ),
    "slide_set": ("load_lesions", "make_slide_set"),
    "ultramnist": ("UltraMNISTCanvas", "make_ultramnist", "render_canvas", "ultramnist_label"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}

__all__ = [
    "SlideImage",
    "SlideInfo",
    "UltraMNISTCanvas",
    "lesion_fraction",
    "lesion_tiles",
    "load_lesions",
    "make_slide_set",
    "make_synthetic_slide",
    "make_ultramnist",
    "render_canvas",
    "synthesize_slide",
    "ultramnist_label",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'bigslide.synthetic' has no attribute {name!r}")
    return getattr(importlib.import_module(f"bigslide.synthetic.{module}"), name)
