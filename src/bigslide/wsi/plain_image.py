"""PNG and JPEG images as slides: a region exported from a viewer, a TMA core, a camera's field of view.

The file is decoded whole when it is opened (these formats have no tiles to read one at a time), and a
pyramid is built from it in memory by 4 x 4 box means, so tissue masks and thumbnails read small levels as
they do on a scanned slide. Each level is wrapped as a read-only array (`shape`, `dtype`, `chunks`,
slicing), the surface `Slide` reads through, as for OpenSlide.

The pixel size is taken from the resolution the file states (PNG's pHYs, JPEG's JFIF density) only when it
is a microscope's: 72 or 300 dpi is a screen's or a printer's, and such a file states no pixel size (give
it with `data.slide_mpp`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bigslide.errors import SlideError
from bigslide.wsi.tiff_tiles import rgba_on_white

SIGNATURES = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}
MAX_PIXELS = 400_000_000
"""Larger images are refused: decoded whole, in every process that reads them, they would not fit."""
LEVEL_FACTOR = 4
SMALLEST_SIDE = 1024  # no level is made below this longer side
_CHUNK = 512
_OPEN_LOCK = threading.Lock()  # PIL's image size limit is a module global


def plain_image_format(path: Path) -> str | None:
    """ "PNG" or "JPEG" when the file begins as one does, else None."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError:
        return None
    return next((name for magic, name in SIGNATURES.items() if head.startswith(magic)), None)


class ImageLevel:
    """One level as a (h, w, 3) uint8 array-like; slicing returns a copy."""

    def __init__(self, pixels: np.ndarray) -> None:
        self._pixels = pixels
        self.shape = pixels.shape
        self.ndim = 3
        self.dtype = np.dtype(np.uint8)
        self.chunks = (_CHUNK, _CHUNK, 3)

    def __getitem__(self, key: Any) -> np.ndarray:
        return np.array(self._pixels[key])


class PlainImageHandle:
    """The part of tiffslide's `TiffSlide` that `Slide` uses, for a PNG or JPEG file."""

    def __init__(self, path: Path, kind: str) -> None:
        rgb, dpi, self.greyscale = _decode(path, kind)
        levels = [rgb]
        while max(levels[-1].shape[:2]) >= SMALLEST_SIDE * LEVEL_FACTOR:
            levels.append(np.asarray(Image.fromarray(levels[-1]).reduce(LEVEL_FACTOR)))
        self.level_count = len(levels)
        self.levels = [ImageLevel(level) for level in levels]
        mpp = _stated_mpp(dpi)
        self.properties: dict[str, Any] = {
            "tiffslide.mpp-x": mpp[0] if mpp else None,
            "tiffslide.mpp-y": mpp[1] if mpp else None,
            "tiffslide.series-axes": "YXS",
        }

    def close(self) -> None:
        self.levels = []


def _decode(path: Path, kind: str) -> tuple[np.ndarray, Any, bool]:
    """(h, w, 3) uint8 pixels, transparent ones on white (glass), the dpi the file states, and whether the
    image is grey (no colour in the file)."""
    with _OPEN_LOCK:
        limit = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None  # our own limit below, which names the file and the way out
        try:
            image = Image.open(path)
        except Exception as exc:
            raise SlideError(
                f"{path}: the {kind} image will not decode, damaged or cut short ({exc})"
            ) from exc
        finally:
            Image.MAX_IMAGE_PIXELS = limit
    with image:
        width, height = image.size
        if width * height > MAX_PIXELS:
            raise SlideError(
                f"{path}: a {kind} image of {width} x {height} px is too large to read whole; save it as a "
                "pyramidal TIFF (e.g. vips tiffsave --tile --pyramid --compression jpeg) to read it in tiles"
            )
        if image.mode.startswith("I") or image.mode == "F":  # 16- or 32-bit grey
            raise SlideError(f"{path}: pixels are {image.mode}, only 8-bit RGB slides are supported")
        dpi = image.info.get("dpi")
        grey = image.mode in ("1", "L", "LA")
        try:
            if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
                # laid on white as a TIFF's alpha is: a PNG's alpha is straight
                rgb = rgba_on_white(np.asarray(image.convert("RGBA")), premultiplied=False)
            else:
                rgb = np.asarray(image.convert("RGB"))
        except Exception as exc:  # truncated or corrupt data: PIL raises OSError, SyntaxError...
            raise SlideError(
                f"{path}: the {kind} image will not decode, damaged or cut short ({exc})"
            ) from exc
    return rgb, dpi, grey


def _stated_mpp(dpi: Any) -> tuple[float, float] | None:
    """µm per pixel from a stated dpi, or None when none is stated (one coarser than a microscope's is
    set aside with every reader's, `bigslide.wsi.tiff_levels.parse_mpp`)."""
    try:
        x, y = (float(v) for v in dpi)
    except (TypeError, ValueError):
        return None
    if x <= 0 or y <= 0:
        return None
    return (25_400 / x, 25_400 / y)
