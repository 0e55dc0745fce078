"""What the TIFF behind a tiffslide handle holds: its levels as arrays, the pages whose tiles are those
arrays' chunks, whether every tile lies inside the file, and the pixel size it states."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.errors import SlideError


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


def parse_mpp(properties: dict[str, Any]) -> tuple[float, float] | None:
    def value(key: str) -> float | None:
        raw = properties.get(key)
        try:
            number = float(raw) if raw is not None else None
        except (TypeError, ValueError):
            return None
        return number if number and math.isfinite(number) and number > 0 else None

    mpp_x, mpp_y = value("tiffslide.mpp-x"), value("tiffslide.mpp-y")
    if mpp_x is None and mpp_y is None:
        return None
    return (mpp_x or mpp_y or 0.0, mpp_y or mpp_x or 0.0)
