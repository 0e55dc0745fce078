"""A slide's levels as arrays a viewer slices: each slice decodes the file tiles it covers, keeps the most
recent ones, and draws a tile that will not decode as grey stripes (`DAMAGED`: never mistaken for glass or
tissue) instead of failing the whole view.

A real scanner's file can hold a few damaged tiles; a viewer reading through zarr or dask raises the
decoder's error from its first draw and shows nothing. Here the error goes to `on_error` (once per tile)
and the rest of the slide is shown.

Below a pyramid whose coarsest level is still larger than OVERVIEW_FROM (a file of one level, or of two),
overview levels halve it until it fits OVERVIEW_SIDE: a viewer showing the whole slide then keeps a picture
the size of the screen, not the coarsest level whole (a single-level slide of 20,000 x 16,000 px took 3.6 GB
and a 10.8 s freeze in napari; with overviews 0.6 GB and 5-6 s, its tiles decoded once).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import numpy as np
from PIL import Image

from bigslide.errors import SlideError


class Slide(Protocol):
    """What a view reads of a slide (`bigslide.wsi.slide.Slide`)."""

    @property
    def level_count(self) -> int: ...

    @property
    def level_dimensions(self) -> tuple[tuple[int, int], ...]: ...

    def tile_shape(self, level: int) -> tuple[int, int]: ...

    def read_file_tile(self, level: int, row: int, col: int) -> np.ndarray: ...

    def when_closing(self, fn: Callable[[], None]) -> None: ...


CACHE_BYTES = 96 << 20
"""Decoded tiles kept across slices (panning back over a region decodes nothing again)."""
BACKGROUND = 255  # as bigslide.wsi.slide's: glass
DAMAGED = (96, 160)
"""Grey levels of the diagonal stripes a tile that will not decode is drawn with."""
STRIPE_PX = 8
PARALLEL_TILES = 8
"""A slice needing at least this many tiles not yet decoded decodes them on several threads."""
MAX_TILE_THREADS = 4
OVERVIEW_FROM = 4096
"""A file whose coarsest level's longer side is above this gets overview levels: on the gap bench napari
opened a slide whose coarsest level is 4,096 x 3,072 (36 MB) faster read whole than through overviews."""
OVERVIEW_SIDE = 1024
"""Overview levels are added below the file's coarsest level until the longer side is at most this."""
PREFETCH_BYTES = 48 << 20
"""A file's coarsest level up to this size is decoded whole, into one array, on a thread of its own as soon
as a viewer is handed the levels: napari draws it first when the whole slide is in view, and its reads are
views of that array (kept for the slide's life beside the cache of tiles: at most this much more memory per
open slide). napari slices a layer as it makes it, so opening a slide still waits for most of that
decode (about 120 ms of a 16k x 12k zlib slide's 4,096 x 3,072 level on two cores). Filling a fresh 36 MB
array for each read had cost the viewer's thread another ~90 ms of page faults: the first open froze it
401 and 393 ms (median of 4, zlib and JPEG) against 477 and 438 before."""
OnError = Callable[[SlideError], None]
T = TypeVar("T")


class TileCache:
    """Decoded file tiles of one slide, most recently used last, bounded in bytes; failures remembered
    (reported once, never decoded again). Safe to use from a viewer's slicing threads."""

    def __init__(self, slide: Slide, on_error: OnError | None = None, max_bytes: int = CACHE_BYTES) -> None:
        self.slide, self.on_error, self.max_bytes = slide, on_error, max_bytes
        self.shapes = [(h, w) for w, h in slide.level_dimensions]
        """(height, width) of each level: the file's, then the overview levels below them."""
        if max(self.shapes[-1]) > OVERVIEW_FROM:
            while max(self.shapes[-1]) > OVERVIEW_SIDE and min(self.shapes[-1]) >= 2:
                self.shapes.append((self.shapes[-1][0] // 2, self.shapes[-1][1] // 2))
        self._tiles: OrderedDict[tuple[int, int, int], np.ndarray] = OrderedDict()
        self._failed: set[tuple[int, int, int]] = set()
        self._bytes = 0
        self._lock = threading.Lock()
        self._prefetching: dict[int, threading.Thread] = {}
        self._whole: dict[int, np.ndarray] = {}
        self._stopping = False
        slide.when_closing(self.stop)

    def prefetch(self, level: int) -> None:
        """Decode `level` whole into one array on a thread of its own (its tiles on several threads); reads
        of that level then slice the array, and meanwhile wait for it instead of decoding the same tiles
        again. Nothing happens for a level larger than half the cache."""
        h, w = self.shapes[level]
        if h * w * 3 > min(PREFETCH_BYTES, self.max_bytes // 2) or level in self._prefetching:
            return
        thread = threading.Thread(target=self._assemble, args=(level,), name="bigslide-prefetch", daemon=True)
        self._prefetching[level] = thread
        thread.start()

    def _assemble(self, level: int) -> None:
        h, w = self.shapes[level]
        th, tw = self.tile_shape(level)
        # a fresh array's pages are mapped as they are first written: here, not on the viewer's thread
        whole = np.empty((h, w, 3), np.uint8)

        def place(rc: tuple[int, int]) -> None:
            if self._stopping:
                return  # the slide is closing: the level will never be read
            row, col = rc
            tile = self._decoded((level, row, col))
            if tile is None:
                tile = _stripes(min(th, h - row * th), min(tw, w - col * tw), row * th, col * tw)
            whole[row * th : row * th + tile.shape[0], col * tw : col * tw + tile.shape[1]] = tile

        _on_tile_threads(place, [(r, c) for r in range(-(-h // th)) for c in range(-(-w // tw))])
        whole.flags.writeable = False  # handed out in views: nobody may draw into the kept level
        with self._lock:
            if not self._stopping:
                self._whole[level] = whole

    def stop(self) -> None:
        """Stop the decodes ahead and wait for them (the slide is closing)."""
        self._stopping = True
        for thread in list(self._prefetching.values()):
            if thread is not threading.current_thread():
                thread.join()

    def whole(self, level: int) -> np.ndarray | None:
        """The level decoded whole ahead (`prefetch`), read-only, once its decode is done; None for a
        level not decoded so."""
        prefetch = self._prefetching.get(level)
        if prefetch is not None and prefetch is not threading.current_thread():
            prefetch.join()
        with self._lock:
            return self._whole.get(level)

    def tile_shape(self, level: int) -> tuple[int, int]:
        """(height, width) of a tile of `level`: an overview level's are its file level's."""
        return self.slide.tile_shape(min(level, self.slide.level_count - 1))

    def tile(self, level: int, row: int, col: int) -> np.ndarray | None:
        """The decoded tile, or None when it will not decode (an overview tile is never None: the parts
        that will not decode are striped)."""
        if level >= self.slide.level_count:
            return self._overview_tile(level, row, col)
        key = (level, row, col)
        with self._lock:
            if key in self._failed:
                return None
            whole = self._whole.get(level)
        if whole is not None:
            th, tw = self.tile_shape(level)
            return whole[row * th : (row + 1) * th, col * tw : (col + 1) * tw]
        tile = self._kept(key)
        if tile is not None:
            return tile
        tile = self._decoded(key)
        if tile is not None:
            self._keep(key, tile)
        return tile

    def _decoded(self, key: tuple[int, int, int]) -> np.ndarray | None:
        """File tile `key` decoded, or None when it will not decode (said once to `on_error`)."""
        try:
            return self.slide.read_file_tile(*key)
        except SlideError as err:
            with self._lock:
                first = key not in self._failed
                self._failed.add(key)
            if first and self.on_error is not None:
                self.on_error(err)
            return None

    def _kept(self, key: tuple[int, int, int]) -> np.ndarray | None:
        """The tile kept under `key` (now the most recently used), or None."""
        with self._lock:
            tile = self._tiles.get(key)
            if tile is not None:
                self._tiles.move_to_end(key)
            return tile

    def _keep(self, key: tuple[int, int, int], tile: np.ndarray) -> None:
        with self._lock:
            if key not in self._tiles:
                self._tiles[key] = tile
                self._bytes += tile.nbytes
            while self._bytes > self.max_bytes and len(self._tiles) > 1:
                self._bytes -= self._tiles.popitem(last=False)[1].nbytes

    def _overview_tile(self, level: int, row: int, col: int) -> np.ndarray:
        """Tile (row, col) of an overview level: the 2 x 2 tiles of the level above it, each averaged in
        blocks of 2 x 2 pixels (rounded half up; PIL's box reduction, several times faster than numpy's)."""
        key = (level, row, col)
        tile = self._kept(key)
        if tile is not None:
            return tile
        th, tw = self.tile_shape(level)
        h, w = self.shapes[level]
        above_h, above_w = self.shapes[level - 1]
        tile = np.empty((min(th, h - row * th), min(tw, w - col * tw), 3), np.uint8)
        for dr in (0, 1):
            for dc in (0, 1):
                y0, x0 = dr * th // 2, dc * tw // 2  # tile sides are even (multiples of 16)
                if y0 >= tile.shape[0] or x0 >= tile.shape[1]:
                    continue
                r, c = 2 * row + dr, 2 * col + dc
                part = self.tile(level - 1, r, c)
                if part is None:
                    part = _stripes(min(th, above_h - r * th), min(tw, above_w - c * tw), r * th, c * tw)
                small = np.asarray(Image.fromarray(part).reduce(2))
                ph, pw = min(small.shape[0], tile.shape[0] - y0), min(small.shape[1], tile.shape[1] - x0)
                tile[y0 : y0 + ph, x0 : x0 + pw] = small[:ph, :pw]
        self._keep(key, tile)
        return tile

    def decode_many(
        self, level: int, tiles: list[tuple[int, int]]
    ) -> dict[tuple[int, int], np.ndarray | None]:
        """Decode the tiles of `level` not yet kept, on several threads when there are many (the decoders
        let go of the interpreter lock): a view of a slide's coarsest level, JPEG 2000 above all, is
        hundreds of tiles that one thread decodes in turn. An overview level's tiles are made so, each
        from the tiles above it as it needs them. Returns what it made, by (row, col) (none when few were
        missing: they are made as they are read), for the caller to use even if the cache has let go of
        them meanwhile (a view larger than the cache)."""
        with self._lock:
            missing = [
                (r, c)
                for r, c in tiles
                if (level, r, c) not in self._tiles and (level, r, c) not in self._failed
            ]
        if len(missing) < PARALLEL_TILES:
            return {}
        make = self._overview_tile if level >= self.slide.level_count else self.tile
        return dict(zip(missing, _on_tile_threads(lambda rc: make(level, *rc), missing), strict=True))

    @property
    def failed(self) -> set[tuple[int, int, int]]:
        """(level, row, col) of the tiles that did not decode so far."""
        return set(self._failed)


class TileLevel:
    """One level as an (h, w, 3) uint8 array-like: `shape`, `dtype`, `ndim` and basic slicing."""

    def __init__(self, cache: TileCache, level: int) -> None:
        self.cache, self.level = cache, level
        h, w = cache.shapes[level]
        self.shape = (h, w, 3)
        self.dtype = np.dtype(np.uint8)
        self.ndim = 3
        self.tile_shape = cache.tile_shape(level)

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1] * 3

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[:, :]
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, key: Any) -> np.ndarray:
        rows, cols, channel, single = _split_key(key)
        r0, r1, rstep = rows.indices(self.shape[0])
        c0, c1, cstep = cols.indices(self.shape[1])
        if rstep < 0 or cstep < 0:
            raise IndexError("a slide level is sliced with positive steps only")
        out = self._region(r0, max(r1, r0), c0, max(c1, c0))[::rstep, ::cstep][:, :, channel]
        return out[tuple(0 if one else slice(None) for one in single)]

    def _region(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        whole = self.cache.whole(self.level)
        if whole is not None:
            return whole[y0:y1, x0:x1]
        out = np.full((y1 - y0, x1 - x0, 3), BACKGROUND, np.uint8)
        th, tw = self.tile_shape
        rows, cols = range(y0 // th, -(-y1 // th)), range(x0 // tw, -(-x1 // tw))
        made = self.cache.decode_many(self.level, [(row, col) for row in rows for col in cols])
        for row in rows:
            for col in cols:
                tile = made[(row, col)] if (row, col) in made else self.cache.tile(self.level, row, col)
                ty, tx = row * th, col * tw
                if tile is None:
                    tile = _stripes(min(th, self.shape[0] - ty), min(tw, self.shape[1] - tx), ty, tx)
                ay0, ay1 = max(ty, y0), min(ty + tile.shape[0], y1)
                ax0, ax1 = max(tx, x0), min(tx + tile.shape[1], x1)
                out[ay0 - y0 : ay1 - y0, ax0 - x0 : ax1 - x0] = tile[ay0 - ty : ay1 - ty, ax0 - tx : ax1 - tx]
        return out


def _on_tile_threads(fn: Callable[[tuple[int, int]], T], tiles: list[tuple[int, int]]) -> list[T]:
    """`fn` of every (row, col) of `tiles`, on up to MAX_TILE_THREADS threads made for the call and joined
    before it returns: none lingers into a later fork."""
    workers = min(MAX_TILE_THREADS, os.cpu_count() or 1, len(tiles))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bigslide-tiles") as pool:
        return list(pool.map(fn, tiles))


def _stripes(height: int, width: int, y0: int, x0: int) -> np.ndarray:
    """A damaged tile's picture: diagonal grey stripes, continuous across neighbouring damaged tiles."""
    yy, xx = np.ogrid[y0 : y0 + height, x0 : x0 + width]
    grey = np.where(((yy + xx) // STRIPE_PX) % 2 == 0, DAMAGED[0], DAMAGED[1]).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=2)


def tile_levels(slide: Slide, on_error: OnError | None = None) -> list[TileLevel]:
    """Every level of `slide` as a `TileLevel`, then its overview levels, sharing one cache of decoded
    tiles; the file's coarsest level, when small and not averaged into overviews, is being decoded
    already (`PREFETCH_BYTES`)."""
    cache = TileCache(slide, on_error)
    if len(cache.shapes) == slide.level_count:
        cache.prefetch(slide.level_count - 1)
    return [TileLevel(cache, level) for level in range(len(cache.shapes))]


def _split_key(key: Any) -> tuple[slice, slice, Any, tuple[bool, bool]]:
    """(rows, cols, channel index, which of rows and cols were single integers) of an index into an
    (h, w, 3) array."""
    parts = list(key) if isinstance(key, tuple) else [key]
    if any(p is Ellipsis for p in parts):
        at = parts.index(Ellipsis)
        parts = parts[:at] + [slice(None)] * (4 - len(parts)) + parts[at + 1 :]
    parts += [slice(None)] * (3 - len(parts))
    if len(parts) != 3:
        raise IndexError(f"too many indices for a slide level: {key!r}")
    rows, cols, channel = parts
    single = (isinstance(rows, int | np.integer), isinstance(cols, int | np.integer))
    rows = slice(int(rows), int(rows) + 1) if single[0] else rows
    cols = slice(int(cols), int(cols) + 1) if single[1] else cols
    if not isinstance(rows, slice) or not isinstance(cols, slice):
        raise IndexError("a slide level is sliced with integers and slices only")
    return rows, cols, channel, single
