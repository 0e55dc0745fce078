"""What the TIFF behind a tiffslide handle holds: its levels as arrays, the pages whose tiles are those
arrays' chunks, whether every tile lies inside the file, and the pixel size it states."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import numpy as np

from bigslide.errors import SlideError

COARSEST_MPP = 10.0
"""A stated pixel size coarser than this many µm (2,540 dpi) is not a microscope's."""


def level_arrays(path: Path, handle: Any) -> list[Any]:
    axes = handle.properties["tiffslide.series-axes"]
    if hasattr(handle, "levels"):  # OpenSlide: array-like levels
        return list(handle.levels)
    group = handle.zarr_group
    arrays = [group[str(level)] for level in range(handle.level_count)]
    for array in arrays:
        if array.dtype != np.uint8:
            raise SlideError(f"{path}: pixels are {array.dtype}, only 8-bit RGB slides are supported")
        if axes == "YXS" and array.shape[2] not in (3, 4):
            raise SlideError(f"{path}: {array.shape[2]} samples per pixel, expected RGB(A)")
    if axes not in ("YXS", "YX"):
        raise SlideError(f"{path}: image axes {axes!r} are not supported (expected RGB)")
    return arrays


def tiled_pages(handle: Any, arrays: list[Any]) -> list[Any]:
    """Per level, the tifffile page whose tiles are the zarr chunks (None where they are not)."""
    pages: list[Any] = []
    try:
        series = handle.ts_tifffile.series[handle.properties["tiffslide.series-index"]]
        levels = list(series.levels)
    except Exception:  # an unusual layout: read through zarr
        return [None] * len(arrays)
    for level, array in enumerate(arrays):
        page = levels[level].keyframe if level < len(levels) else None
        ok = (
            page is not None
            and len(levels[level].pages) == 1
            and page.is_tiled
            and (page.tilelength, page.tilewidth) == tuple(array.chunks[:2])
            and (page.imagelength, page.imagewidth) == tuple(array.shape[:2])
        )
        pages.append(page if ok else None)
    return pages


def check_complete(path: Path, handle: Any) -> None:
    """Raise when tile data of a level points past the end of the file (a truncated copy)."""
    size = path.stat().st_size
    series = handle.ts_tifffile.series[handle.properties["tiffslide.series-index"]]
    for level, pyramid_level in enumerate(series.levels):
        for page in pyramid_level.pages:
            ends = [o + c for o, c in zip(page.dataoffsets, page.databytecounts) if c]
            if not ends and getattr(page, "shape", None):
                raise SlideError(f"{path}: level {level} has no image data (truncated file?)")
            if ends and max(ends) > size:
                raise SlideError(
                    f"{path}: level {level} data ends at byte {max(ends)} but the file has {size} bytes "
                    "(truncated file)"
                )


LARGER_IMAGE = 4
"""Another image of the file with this many times the pixels of the one read is the slide itself."""


def check_main_image(path: Path, handle: Any) -> None:
    """Raise when the image tiffslide reads (a generic or OME-TIFF's first) is much smaller than another
    image of the file: a converter that wrote the macro or label photograph first (bfconvert of some
    scanners' files) would have it read as the slide. Scanners' own formats (an SVS, whose macro may
    outsize a small region's scan) choose their image themselves."""
    if handle.properties.get("tiffslide.vendor") is not None:
        return
    try:
        series = list(handle.ts_tifffile.series)
        read = series[handle.properties["tiffslide.series-index"]]
    except Exception:  # a layout without tifffile series: nothing to compare
        return

    def area(s: Any) -> int:
        height, width = _height_width(s)
        return height * width

    def said(s: Any) -> str:
        height, width = _height_width(s)
        return f"{width} x {height} px" + (f" {s.name!r}" if getattr(s, "name", "") else "")

    largest = max(series, key=area)
    if area(largest) > LARGER_IMAGE * area(read):
        raise SlideError(
            f"{path}: its first image ({said(read)}) is not its largest ({said(largest)}, image "
            f"{series.index(largest)} of {len(series)}); bigslide reads a TIFF's first image, so this file "
            "would be read as its smaller picture (a macro or label photograph?). Save the slide on its "
            "own (bfconvert -series N, or QuPath's File > Export images > OME TIFF)"
        )


def _height_width(series: Any) -> tuple[int, int]:
    """A tifffile series' rows and columns, whatever its other axes (samples, channels, planes)."""
    sizes = dict(zip(series.axes, series.shape, strict=False))
    return int(sizes.get("Y", 0)), int(sizes.get("X", 0))


def parse_mpp(properties: dict[str, Any]) -> tuple[float, float] | None:
    """Level-0 (x, y) µm per pixel the file states: tiffslide's reading (Aperio's MPP, the TIFF
    resolution tags), else an OME-TIFF's PhysicalSizeX/Y, which tiffslide leaves unread (Bio-Formats'
    and QuPath's exports state it there only). None when neither states one, or when it is coarser than
    COARSEST_MPP: an image editor's print resolution (72 dpi is 353 µm per pixel), not a scanner's."""
    mpp_x, mpp_y = _positive(properties.get("tiffslide.mpp-x")), _positive(properties.get("tiffslide.mpp-y"))
    if mpp_x is None and mpp_y is None:
        mpp_x, mpp_y = _ome_mpp(
            properties.get("tiff.ImageDescription"), properties.get("tiffslide.series-index")
        )
    if mpp_x is None and mpp_y is None:
        mpp_x = mpp_y = _aperio_decimal_comma(properties.get("tiff.ImageDescription"))
    if mpp_x is None and mpp_y is None:
        return None
    mpp = (mpp_x or mpp_y or 0.0, mpp_y or mpp_x or 0.0)
    return mpp if max(mpp) <= COARSEST_MPP else None


OME_UM = {"m": 1e6, "cm": 1e4, "mm": 1e3, "µm": 1.0, "μm": 1.0, "um": 1.0, "nm": 1e-3, "pm": 1e-6, "Å": 1e-4}
"""OME's length units (UnitsLength) in µm: those a pixel size is stated in."""


def _ome_mpp(description: Any, series: Any) -> tuple[float | None, float | None]:
    """PhysicalSizeX/Y in µm of the OME image behind tiffslide's series (its Image of the same index)."""
    if not isinstance(description, str) or "<OME" not in description[:1000]:
        return None, None
    try:
        root = ElementTree.fromstring(description)
    except ElementTree.ParseError:
        return None, None
    images = [e for e in root if e.tag.rsplit("}", 1)[-1] == "Image"]
    if not images:
        return None, None
    index = series if isinstance(series, int) and 0 <= series < len(images) else 0
    pixels = next((e for e in images[index] if e.tag.rsplit("}", 1)[-1] == "Pixels"), None)
    if pixels is None:
        return None, None

    def size(axis: str) -> float | None:
        number = _positive(pixels.get(f"PhysicalSize{axis}"))
        scale = OME_UM.get(pixels.get(f"PhysicalSize{axis}Unit", "µm"))
        return number * scale if number is not None and scale is not None else None

    return size("X"), size("Y")


def _aperio_decimal_comma(description: Any) -> float | None:
    """Aperio's `MPP = 0,2500`, written where a comma is the decimal mark (tiffslide reads only a point)."""
    if not isinstance(description, str) or not description.startswith("Aperio"):
        return None
    found = re.search(r"\|\s*MPP\s*=\s*(\d+,\d+)\s*(\||$)", description)
    return _positive(found.group(1).replace(",", ".")) if found else None


def _positive(raw: Any) -> float | None:
    try:
        number = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None
    return number if number and math.isfinite(number) and number > 0 else None
