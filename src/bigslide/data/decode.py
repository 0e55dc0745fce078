"""Read many squares of one slide, decoding each file tile once, optionally on a pool of threads.

Neighbouring grid tiles share file tiles (a 224 px tile on a 256 px JPEG grid touches up to four), so
reading squares one by one decodes most file tiles several times. Here every file tile the squares touch
is decoded once, top to bottom, and its pieces are copied at once into every square that overlaps it;
the decoded tile is then dropped. Nothing keeps decoded tiles: the decoder's output is freed and
allocated again while still in the processor's cache (keeping rows of decoded tiles for later squares
cost a third more time than the bare decode, in cache misses on tiles written to fresh memory). Squares
read at another size than they are wanted are staged at read size and resized as soon as their last
file tile is in, so only the squares under way are staged.

Squares come out as uint8 (a quarter of float32's bytes; methods scale to [0, 1] on their device),
shaped channels first but laid out channels last in memory: pieces of decoded tiles (rows of RGB pixels)
are then copied row by row, where a channels-first layout made every copy a transpose; convolutions take
the channels-last layout as it is.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import Executor

import numpy as np

from bigslide.errors import SlideError
from bigslide.wsi.resolution import ReadPlan, resize_square
from bigslide.wsi.slide import BACKGROUND, Slide

FileTile = tuple[int, int]
CHUNK_TILES = 16  # file tiles per task on a thread pool: fewer hand-overs, still balanced


def read_squares(
    slide: Slide,
    plan: ReadPlan,
    coords: np.ndarray,
    pool: Executor | None = None,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """(N, 3, size, size) uint8, a channels-first view of channels-last memory: the square at each level-0
    top-left (x, y) of `coords`, read by `plan` (into `into`, (N, size, size, 3), when given, e.g. shared
    memory).

    Equal to `resize_square(slide.read_region(xy, plan.level, (read_size,) * 2), size)` per square,
    channels first.
    """
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    n, s = len(coords), plan.size
    out = np.empty((n, s, s, 3), np.uint8) if into is None else into
    if out.shape != (n, s, s, 3) or out.dtype != np.uint8:
        raise ValueError(f"into must be ({n}, {s}, {s}, 3) uint8, got {out.shape} {out.dtype}")
    level, rs = plan.level, plan.read_size
    ds = slide.level_downsamples[level]
    lw, lh = slide.level_dimensions[level]
    th, tw = slide.tile_shape(level)
    xs = np.floor(coords[:, 0] / ds).astype(np.int64).tolist()  # Python ints: numpy scalars are slow
    ys = np.floor(coords[:, 1] / ds).astype(np.int64).tolist()

    users: defaultdict[FileTile, list[int]] = defaultdict(list)  # file tile -> the squares it feeds
    edge: set[int] = set()  # squares partly beyond the level's edge
    for i, (x, y) in enumerate(zip(xs, ys)):
        if x >= lw or y >= lh or x + rs <= 0 or y + rs <= 0:
            out[i] = BACKGROUND  # wholly beyond the level
            continue
        if x < 0 or y < 0 or x + rs > lw or y + rs > lh:
            out[i] = BACKGROUND
            edge.add(i)
        for r in range(max(y, 0) // th, (min(y + rs, lh) - 1) // th + 1):
            for c in range(max(x, 0) // tw, (min(x + rs, lw) - 1) // tw + 1):
                users[(r, c)].append(i)
    staging = _Staging(out, rs, users, edge) if rs != s else None

    def scatter(key: FileTile) -> None:
        feeds = users[key]
        try:
            tile = slide.read_file_tile(level, *key)
        except SlideError as err:
            x, y = (int(v) for v in coords[feeds[0]])
            raise SlideError(f"{err}; needed by the tile at level-0 (x={x}, y={y})") from err
        ty0, tx0 = key[0] * th, key[1] * tw
        for i in feeds:
            x, y = xs[i], ys[i]
            # overlap of the file tile and the square, in level coordinates
            ay0, ay1 = max(ty0, y), min(ty0 + tile.shape[0], y + rs)
            ax0, ax1 = max(tx0, x), min(tx0 + tile.shape[1], x + rs)
            square = out[i] if staging is None else staging.square(i)
            square[ay0 - y : ay1 - y, ax0 - x : ax1 - x] = tile[ay0 - ty0 : ay1 - ty0, ax0 - tx0 : ax1 - tx0]
            if staging is not None:
                staging.piece_done(i)

    def scatter_all(keys: list[FileTile]) -> None:
        for key in keys:
            scatter(key)

    keys = sorted(users)  # top to bottom: staged squares complete and leave in order
    if pool is None:
        scatter_all(keys)
    else:
        chunks = [keys[k : k + CHUNK_TILES] for k in range(0, len(keys), CHUNK_TILES)]
        # squares overlap, but no two file tiles write the same pixel: the threads need no lock for it
        list(pool.map(scatter_all, chunks))  # re-raises the first error
    return channels_first(out)


class _Staging:
    """Squares read at `read_size` before their resize: each one is made when its first file tile comes
    and resized into `out` (and dropped) when its last one is in."""

    def __init__(
        self, out: np.ndarray, read_size: int, users: dict[FileTile, list[int]], edge: set[int]
    ) -> None:
        self.out, self.read_size, self.edge = out, read_size, edge
        self.missing: defaultdict[int, int] = defaultdict(int)  # square -> file tiles still to come
        for feeds in users.values():
            for i in feeds:
                self.missing[i] += 1
        self.squares: dict[int, np.ndarray] = {}
        self.lock = threading.Lock()

    def square(self, i: int) -> np.ndarray:
        with self.lock:
            if i not in self.squares:
                square = np.empty((self.read_size, self.read_size, 3), np.uint8)
                if i in self.edge:
                    square[...] = BACKGROUND
                self.squares[i] = square
            return self.squares[i]

    def piece_done(self, i: int) -> None:
        with self.lock:
            self.missing[i] -= 1
            square = self.squares.pop(i) if self.missing[i] == 0 else None
        if square is not None:
            self.out[i] = resize_square(square, self.out.shape[1])


def channels_first(squares: np.ndarray) -> np.ndarray:
    """(N, H, W, 3) squares as an (N, 3, H, W) view (no copy)."""
    return squares.transpose(0, 3, 1, 2)
