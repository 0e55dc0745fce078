"""OpenSlide as a second slide backend, for the formats tiffslide does not read (DICOM, MRXS, SCN, BIF, VMS,
NDPI).

Optional: `pip install bigslide[openslide]` brings the `openslide-python` and `openslide-bin` wheels.
Each pyramid level is wrapped as a read-only array (`shape`, `dtype`, `chunks`, slicing), the same
surface as tiffslide's zarr arrays, so `Slide` reads, tiles and streams it unchanged.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.wsi.tiff_tiles import rgba_on_white

OPENSLIDE_SUFFIXES = (".mrxs", ".scn", ".bif", ".vms", ".vmu", ".ndpi")
"""Files opened with OpenSlide when it is installed (tiffslide stays the default for the rest)."""
_CHUNK = 512


def openslide_available() -> bool:
    try:
        import openslide  # noqa: F401
    except ImportError:
        return False
    return True


def is_dicom_wsi(path: Path) -> bool:
    """Whether OpenSlide reads `path` as a DICOM whole-slide image (it checks the file's SOP class)."""
    import openslide

    try:
        return openslide.OpenSlide.detect_format(str(path)) == "dicom"
    except Exception:  # an unreadable file is not one
        return False


class OpenSlideLevel:
    """One level of an OpenSlide slide as a (h, w, 3) uint8 array that reads on slicing."""

    def __init__(self, handle: OpenSlideHandle, level: int) -> None:
        self._handle, self._level = handle, level
        w, h = handle.level_dimensions[level]
        self.shape = (int(h), int(w), 3)
        self.ndim = 3
        self.dtype = np.dtype(np.uint8)
        self.chunks = (_CHUNK, _CHUNK, 3)
        self._downsample = float(handle.level_downsamples[level])

    def __getitem__(self, key: Any) -> np.ndarray:
        rows, cols = key[0], key[1]
        y0, y1, _ = rows.indices(self.shape[0])
        x0, x1, _ = cols.indices(self.shape[1])
        if y1 <= y0 or x1 <= x0:
            return np.zeros((max(y1 - y0, 0), max(x1 - x0, 0), 3), np.uint8)
        location = (round(x0 * self._downsample), round(y0 * self._downsample))
        rgba = self._handle.read_region(location, self._level, (x1 - x0, y1 - y0))
        return rgba_on_white(np.asarray(rgba), premultiplied=True)  # OpenSlide's RGBA is premultiplied


class OpenSlideHandle:
    """The part of tiffslide's `TiffSlide` that `Slide` uses, backed by OpenSlide."""

    def __init__(self, path: Path) -> None:
        import openslide

        self._path = path
        self._slide = openslide.OpenSlide(str(path))
        self._lock = threading.Lock()  # one C handle: OpenSlide is thread-safe, but keep reads ordered
        self.level_count = int(self._slide.level_count)
        self.level_dimensions = self._slide.level_dimensions
        self.level_downsamples = self._slide.level_downsamples
        self.levels = [OpenSlideLevel(self, lv) for lv in range(self.level_count)]
        props = self._slide.properties
        self.properties = {
            "tiffslide.mpp-x": props.get("openslide.mpp-x"),
            "tiffslide.mpp-y": props.get("openslide.mpp-y"),
            "tiffslide.series-axes": "YXS",
        }

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int]) -> Any:
        """OpenSlide's read. After an error (a damaged tile, a file cut short) OpenSlide refuses every
        later read of the handle with the same error, so the slide is opened again for the next read:
        one bad tile does not take the slide's sound tiles with it."""
        import openslide

        with self._lock:
            try:
                return self._slide.read_region(location, level, size)
            except openslide.OpenSlideError:
                self._slide.close()
                self._slide = openslide.OpenSlide(str(self._path))
                raise

    def close(self) -> None:
        self._slide.close()
