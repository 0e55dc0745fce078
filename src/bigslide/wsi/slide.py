"""Read whole-slide images: Aperio SVS, generic pyramidal TIFF and OME-TIFF through tiffslide; DICOM
(a .dcm file or a folder of one series), MRXS, SCN, BIF, VMS and NDPI through OpenSlide when installed.

Coordinates follow openslide: `read_region` takes its top-left corner in level-0 pixels and its size in
pixels of the level read. Every failure a user can cause (missing, truncated, non-TIFF or unsupported
file) raises `SlideError` naming the file.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
from PIL import Image

from bigslide.errors import SlideError
from bigslide.files import out_of_files, too_many_open_files
from bigslide.wsi.dicom_series import is_dicom_file, opens_as_dicom, series_file
from bigslide.wsi.slide_view import OnError, TileLevel, tile_levels
from bigslide.wsi.tiff_levels import (
    alpha_of,
    check_complete,
    check_main_image,
    empty_tiles,
    glass_over_empty,
    level_arrays,
    parse_mpp,
    tiled_pages,
    ycbcr_levels,
)
from bigslide.wsi.tiff_tiles import LUMA, as_rgb, decode, decode_luma, ycbcr_to_rgb
from bigslide.wsi.unreadable import in_words, reader_conflict

Backend = Literal["auto", "tiffslide", "openslide"]
BACKGROUND = 255
"""Value of pixels outside the slide: white, as glass without tissue looks."""
WHOLE_READ_PIXELS = 1 << 26
"""Levels above 64 Mpx (192 MB of RGB) are never read at once: thumbnails stream them in strips."""
_STRIP_PIXELS = 1 << 22


class Slide:
    """An open pyramidal slide. Use `open_slide`; close it (or use `with`) to release the file."""

    def __init__(self, path: Path, handle: Any) -> None:
        self.path = path
        self._handle = handle
        self._arrays = level_arrays(path, handle)
        self._local = threading.local()
        self._local.arrays = self._arrays
        self.level_dimensions: tuple[tuple[int, int], ...] = tuple(
            (int(a.shape[1]), int(a.shape[0])) for a in self._arrays
        )
        w0, h0 = self.level_dimensions[0]
        self.level_downsamples: tuple[float, ...] = tuple(
            (w0 / w + h0 / h) / 2 for w, h in self.level_dimensions
        )
        self.mpp = parse_mpp(handle.properties)
        self._streamed: tuple[tuple[int, int], np.ndarray] | None = None
        self._pages = tiled_pages(handle, self._arrays)
        self._ycbcr = ycbcr_levels(path, handle, len(self._arrays))
        self._empty = empty_tiles(handle, self._arrays)
        self._alpha = alpha_of(handle)
        # no colour in the file: pen ink cannot be told from tissue by it (`TileGrid.from_slide`)
        self.greyscale = bool(getattr(handle, "greyscale", False)) or all(a.ndim == 2 for a in self._arrays)
        # one descriptor for all threads: os.pread does not move a shared file position
        self._fd: int | None = os.open(path, os.O_RDONLY) if any(self._pages) else None
        self._closing: list[Callable[[], None]] = []  # run before the file closes (`when_closing`)
        self.pixels_read: Counter[int] = Counter()
        """Pixels decoded per level since opening; lets callers check that no level-0 scan happened."""

    # -- geometry -------------------------------------------------------------------------------
    @property
    def dimensions(self) -> tuple[int, int]:
        """Level-0 size (width, height)."""
        return self.level_dimensions[0]

    @property
    def level_count(self) -> int:
        return len(self.level_dimensions)

    def best_level_for_downsample(self, downsample: float) -> int:
        """The most detailed level whose downsample does not exceed `downsample` (1% tolerance)."""
        best = 0
        for level, ds in enumerate(self.level_downsamples):
            if ds <= downsample * 1.01:
                best = level
        return best

    # -- pixels ---------------------------------------------------------------------------------
    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int]) -> np.ndarray:
        """RGB pixels (h, w, 3) uint8 of `size` = (w, h) at `level`, top-left `location` in level-0 px.

        Parts of the region outside the slide are white (255), like empty glass.
        """
        self._check_level(level)
        width, height = (int(v) for v in size)
        if width < 0 or height < 0:
            raise SlideError(f"{self.path}: region size must be non-negative, got {size}")
        ds = self.level_downsamples[level]
        x0 = math.floor(location[0] / ds)
        y0 = math.floor(location[1] / ds)
        out = np.full((height, width, 3), BACKGROUND, np.uint8)
        level_w, level_h = self.level_dimensions[level]
        cx0, cy0 = max(x0, 0), max(y0, 0)
        cx1, cy1 = min(x0 + width, level_w), min(y0 + height, level_h)
        if cx1 > cx0 and cy1 > cy0:
            out[cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0] = self._read_level(level, cy0, cy1, cx0, cx1)
        return out

    def read_level(self, level: int) -> np.ndarray:
        """A whole level as (h, w, 3) uint8 — meant for the small levels only."""
        self._check_level(level)
        w, h = self.level_dimensions[level]
        return self._read_level(level, 0, h, 0, w)

    def thumbnail(self, max_size: int) -> np.ndarray:
        """The slide with its longer side at most `max_size`, read from the smallest level that suffices.

        A level too big to read at once (a slide without a pyramid) is streamed in strips, with a warning.
        """
        level = self.thumbnail_level(max_size)
        w, h = self.level_dimensions[level]
        if w * h > WHOLE_READ_PIXELS:
            return self._streamed_thumbnail(level, max_size)
        image = self.read_level(level)
        h, w = image.shape[:2]
        scale = max_size / max(h, w)
        if scale >= 1:
            return image
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        return np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BOX))

    def _streamed_thumbnail(self, level: int, max_size: int) -> np.ndarray:
        """Box-average `level` by a whole factor, strip by strip, so it is never held in memory at once."""
        w, h = self.level_dimensions[level]
        factor = math.ceil(max(w, h) / max_size)
        if self._streamed is not None and self._streamed[0] == (level, factor):
            return self._streamed[1]
        warnings.warn(
            f"{self.path}: no pyramid level smaller than {w} x {h} px; building a thumbnail by reading "
            f"level {level} in strips (slow). Save the slide as a pyramidal TIFF to open it fast.",
            stacklevel=3,
        )
        # whole rows of file tiles per read, so each tile is decoded once
        tile_rows = int(self._arrays[level].chunks[0])
        rows = max(1, _STRIP_PIXELS // (w * tile_rows)) * tile_rows
        parts, carry = [], np.zeros((0, w, 3), np.uint8)
        for top in range(0, h, rows):
            strip = np.concatenate([carry, self._read_level(level, top, min(top + rows, h), 0, w)])
            usable = len(strip) if top + rows >= h else len(strip) // factor * factor
            if usable:
                parts.append(_box_mean(strip[:usable], factor))
            carry = strip[usable:]
        out = np.concatenate(parts)
        self._streamed = ((level, factor), out)
        return out

    def thumbnail_level(self, max_size: int) -> int:
        """The smallest level whose longer side is still >= `max_size` (level 0 if none is)."""
        chosen = 0
        for level, (w, h) in enumerate(self.level_dimensions):
            if max(w, h) >= max_size:
                chosen = level
        return chosen

    def pyramid(self, on_error: OnError | None = None) -> list[TileLevel]:
        """One lazy (h, w, 3) uint8 array per level for a viewer: a slice decodes the file tiles it covers
        (kept in a shared cache); a tile that will not decode is background and goes to `on_error`."""
        return tile_levels(self, on_error)

    def tile_shape(self, level: int) -> tuple[int, int]:
        """(height, width) of the file's own tiles (chunks) at `level`: the unit a decoder reads."""
        self._check_level(level)
        chunks = self._arrays[level].chunks
        return int(chunks[0]), int(chunks[1])

    def read_file_tile(self, level: int, row: int, col: int) -> np.ndarray:
        """Decode exactly one file tile of `level` as (h, w, 3) uint8 (edge tiles are cropped), straight from
        the file where the level is tiled (`tiff_tiles`)."""
        return as_rgb(self._decoded(level, row, col, luma=False), self._alpha)

    def read_file_tile_luma(self, level: int, row: int, col: int) -> np.ndarray:
        """One file tile of `level` as (h, w) float32 luma (`LUMA`'s weights): from a JPEG tile, its decoder's
        own (`tiff_tiles.decode_luma`); within a grey level or two of `read_file_tile`'s pixels times LUMA."""
        block = self._decoded(level, row, col, luma=True)
        return block.astype(np.float32) if block.ndim == 2 else as_rgb(block, self._alpha) @ LUMA

    def _decoded(self, level: int, row: int, col: int, luma: bool) -> np.ndarray:
        """The file tile as decoded (luma only where the decoder gives it), cropped to the level."""
        page, index, (y0, y1, x0, x1) = self._file_tile(level, row, col)
        try:
            if index is None:
                block = self._zarr_block(level, y0, y1, x0, x1)
            else:
                grey = decode_luma(page, self._fd, index) if luma else None  # type: ignore[arg-type]
                block = decode(page, self._fd, index) if grey is None else grey  # type: ignore[arg-type]
        except Exception as exc:  # decoder errors come from several libraries
            where = f"file tile (row {row}, col {col}) of level {level}"
            raise SlideError(f"{self.path}: cannot decode {where} ({exc})") from exc
        block = block[: y1 - y0, : x1 - x0]
        self.pixels_read[level] += block.shape[0] * block.shape[1]
        return block

    def _file_tile(self, level: int, row: int, col: int) -> tuple[Any, int | None, tuple[int, int, int, int]]:
        """The tifffile page of `level`, the file tile's index in it (None: read it through zarr) and its
        rows and columns in the level (y0, y1, x0, x1)."""
        th, tw = self.tile_shape(level)
        w, h = self.level_dimensions[level]
        y0, x0 = row * th, col * tw
        if not (0 <= y0 < h and 0 <= x0 < w):
            raise SlideError(f"{self.path}: file tile (row {row}, col {col}) lies outside level {level}")
        page = self._pages[level]
        index = row * -(-w // tw) + col
        direct = page is not None and self._fd is not None and page.databytecounts[index]
        return page, index if direct else None, (y0, min(y0 + th, h), x0, min(x0 + tw, w))

    def _zarr_block(self, level: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        block = np.asarray(self._thread_arrays()[level][y0:y1, x0:x1])
        block = ycbcr_to_rgb(block) if self._ycbcr[level] else block
        empty = self._empty[level]
        return block if empty is None else glass_over_empty(block, empty, self.tile_shape(level), y0, x0)

    def _read_level(self, level: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        try:
            block = self._zarr_block(level, y0, y1, x0, x1)
        except Exception as exc:  # decoder errors come from several libraries
            self._name_the_tile(level, y0, y1, x0, x1)
            raise SlideError(
                f"{self.path}: cannot read level {level} rows {y0}:{y1} cols {x0}:{x1} ({exc})"
            ) from exc
        self.pixels_read[level] += (y1 - y0) * (x1 - x0)
        return as_rgb(block, self._alpha)

    def _name_the_tile(self, level: int, y0: int, y1: int, x0: int, x1: int) -> None:
        """After a region failed to read: raise the error of its first file tile that will not decode,
        which names that tile (a person can find it, and the other tiles are fine)."""
        if self._pages[level] is None:
            return
        th, tw = self.tile_shape(level)
        for row in range(y0 // th, (y1 - 1) // th + 1):
            for col in range(x0 // tw, (x1 - 1) // tw + 1):
                self._decoded(level, row, col, luma=False)

    def _thread_arrays(self) -> list[Any]:
        # tiffslide keeps one zarr store per thread; reading through another thread's store is unsafe
        arrays = getattr(self._local, "arrays", None)
        if arrays is None and hasattr(self._handle, "levels"):
            return self._arrays  # OpenSlide levels are safe to share
        if arrays is None:
            group = self._handle.zarr_group
            arrays = self._local.arrays = [group[str(level)] for level in range(self.level_count)]
        return arrays

    def _check_level(self, level: int) -> None:
        if not 0 <= level < self.level_count:
            raise SlideError(f"{self.path}: level {level} does not exist (slide has {self.level_count})")

    # -- lifetime -------------------------------------------------------------------------------
    def when_closing(self, fn: Callable[[], None]) -> None:
        """Run `fn` as the slide closes, before its file does: what reads it on threads of its own (a
        viewer's decode ahead) stops first, and no thread lingers on a closed file."""
        self._closing.append(fn)

    def close(self) -> None:
        closing, self._closing = self._closing, []
        for fn in closing:
            fn()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._handle.close()

    def __enter__(self) -> Slide:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Slide({str(self.path)!r}, dimensions={self.dimensions}, levels={self.level_count})"


def open_slide(path: str | Path, *, backend: Backend = "auto") -> Slide:
    """Open a slide; raise `SlideError` naming `path` on failure.

    backend "auto": OpenSlide for MRXS / SCN / BIF / VMS / NDPI when it is installed
    (`bigslide[openslide]`), else tiffslide (SVS, generic and OME pyramidal TIFF, NDPI).
    A PNG or JPEG image is read whole, whatever the backend (`bigslide.wsi.plain_image`).
    DICOM — a .dcm file, or a folder holding one series — needs OpenSlide (see `bigslide.wsi.dicom_series`).
    """
    import tiffslide

    from bigslide.wsi.openslide_backend import OPENSLIDE_SUFFIXES, OpenSlideHandle, openslide_available
    from bigslide.wsi.plain_image import PlainImageHandle, plain_image_format

    path = Path(path).expanduser()  # as a table's slide paths are: ~ is the home folder
    if not path.exists():
        raise SlideError(f"{path}: no such slide file")
    if opens_as_dicom(path):
        return _open_dicom(path, backend)
    if not path.is_file():
        raise SlideError(f"{path}: not a file")
    image_format = plain_image_format(path)
    if image_format is not None:
        return Slide(path, PlainImageHandle(path, image_format))
    if backend == "auto":
        wanted = path.suffix.lower() in OPENSLIDE_SUFFIXES and openslide_available()
        backend = "openslide" if wanted else "tiffslide"
    if backend == "openslide":
        try:
            return Slide(path, OpenSlideHandle(path))
        except ImportError:
            raise SlideError(
                f"{path}: OpenSlide is not installed (pip install 'bigslide[openslide]')"
            ) from None
        except Exception as exc:
            raise SlideError(f"{path}: not a slide OpenSlide can read ({exc})") from exc
    try:
        handle = tiffslide.TiffSlide(path)
    except Exception as exc:  # tifffile/tiffslide raise ValueError, KeyError, NotImplementedError...
        if out_of_files(exc):
            raise SlideError(f"{path}: {too_many_open_files()}") from exc
        raise SlideError(f"{path}: not a readable TIFF slide ({in_words(exc)}){reader_conflict()}") from exc
    try:
        check_complete(path, handle)
        check_main_image(path, handle)
        return Slide(path, handle)
    except SlideError:
        handle.close()
        raise
    except Exception as exc:
        handle.close()
        if out_of_files(exc):
            raise SlideError(f"{path}: {too_many_open_files()}") from exc
        raise SlideError(f"{path}: unsupported slide layout ({in_words(exc)}){reader_conflict()}") from exc


def _open_dicom(path: Path, backend: Backend) -> Slide:
    """A DICOM slide (a file, or a folder holding its series) through OpenSlide."""
    from bigslide.wsi.openslide_backend import OpenSlideHandle, is_dicom_wsi, openslide_available

    if path.is_dir():
        series_file(path)  # a folder without DICOM files is no slide, whatever is installed
    elif not is_dicom_file(path):
        raise SlideError(f"{path}: not a DICOM file (no DICM marker after its 128-byte preamble)")
    if backend == "tiffslide":
        raise SlideError(f"{path}: a DICOM slide; tiffslide cannot read DICOM (use backend 'openslide')")
    if not openslide_available():
        raise SlideError(
            f"{path}: a DICOM slide, which bigslide reads through OpenSlide; install it with "
            'pip install "bigslide[openslide]"'
        )
    file = series_file(path, is_wsi=is_dicom_wsi) if path.is_dir() else path
    try:
        handle = OpenSlideHandle(file)
    except Exception as exc:  # OpenSlideUnsupportedFormatError, OpenSlideError, OSError
        which = f"{file.name} " if file != path else ""
        raise SlideError(
            f"{path}: {which}is not a DICOM whole-slide image OpenSlide can read ({exc})"
        ) from exc
    try:
        return Slide(path, handle)
    except Exception:
        handle.close()
        raise


def _box_mean(block: np.ndarray, factor: int) -> np.ndarray:
    """Mean of each `factor` x `factor` box of an (h, w, 3) uint8 image; edge boxes may be smaller."""
    h, w = block.shape[:2]
    pad_rows, pad_cols = -h % factor, -w % factor
    if pad_rows:
        block = np.concatenate([block, np.zeros((pad_rows, w, 3), np.uint8)])
    # rows first, on the contiguous layout: much faster than one reduction over both axes
    row_sums = block.reshape(-1, factor, w * 3).sum(axis=1, dtype=np.uint32).reshape(-1, w, 3)
    row_sums = np.pad(row_sums, ((0, 0), (0, pad_cols), (0, 0)))
    sums = row_sums.reshape(row_sums.shape[0], -1, factor, 3).sum(axis=2)
    n_rows = np.full(sums.shape[0], factor)
    n_rows[-1] = factor - pad_rows
    n_cols = np.full(sums.shape[1], factor)
    n_cols[-1] = factor - pad_cols
    return np.round(sums / (n_rows[:, None, None] * n_cols[None, :, None])).astype(np.uint8)
