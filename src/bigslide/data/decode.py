"""Read many squares of one slide, decoding each file tile once, optionally on a pool of threads.

Neighbouring grid tiles share file tiles (a 224 px tile on a 256 px JPEG grid touches up to four), so
reading squares one by one decodes most file tiles several times. Here the squares are visited top to
bottom in groups of row bands; the file tiles a group needs are decoded once (in parallel: imagecodecs
releases the GIL) and dropped as soon as no later square can touch them, so memory stays at a few rows
of file tiles. Groups hold at least `GROUP_TILES` file tiles so that a pool's threads wait on each other
rarely. Squares come out channels-first uint8, the form a bag crosses to the device in (a quarter of
float32's bytes; methods scale to [0, 1] on their device).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

import numpy as np

from bigslide.errors import SlideError
from bigslide.resolution import ReadPlan, resize_square
from bigslide.slide import BACKGROUND, Slide

FileTile = tuple[int, int]
T = TypeVar("T")
GROUP_TILES = 64


def read_squares(
    slide: Slide,
    plan: ReadPlan,
    coords: np.ndarray,
    pool: Executor | None = None,
    into: np.ndarray | None = None,
) -> np.ndarray:
    """(N, 3, size, size) uint8: the square at each level-0 top-left (x, y) of `coords`, read by `plan`
    (into `into` when given, e.g. shared memory).

    Equal to `resize_square(slide.read_region(xy, plan.level, (read_size,) * 2), size)` per square,
    channels first.
    """
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    n, s = len(coords), plan.size
    out = np.empty((n, 3, s, s), np.uint8) if into is None else into
    if out.shape != (n, 3, s, s) or out.dtype != np.uint8:
        raise ValueError(f"into must be ({n}, 3, {s}, {s}) uint8, got {out.shape} {out.dtype}")
    if len(coords) == 0:
        return out
    level, rs = plan.level, plan.read_size
    ds = slide.level_downsamples[level]
    lw, lh = slide.level_dimensions[level]
    th, tw = slide.tile_shape(level)
    x0 = np.floor(coords[:, 0] / ds).astype(np.int64)
    y0 = np.floor(coords[:, 1] / ds).astype(np.int64)
    inside = (x0 < lw) & (y0 < lh) & (x0 + rs > 0) & (y0 + rs > 0)
    row0 = np.clip(y0, 0, lh - 1) // th
    order = np.argsort(np.where(inside, row0, -1), kind="stable")

    xs, ys = x0.tolist(), y0.tolist()  # Python ints: numpy scalars are slow in the loops below

    def spans(i: int) -> tuple[range, range]:
        return (
            range(max(ys[i], 0) // th, (min(ys[i] + rs, lh) - 1) // th + 1),
            range(max(xs[i], 0) // tw, (min(xs[i] + rs, lw) - 1) // tw + 1),
        )

    cache: dict[FileTile, np.ndarray] = {}

    def decode(key: FileTile, needed_by: int) -> np.ndarray:
        try:
            return slide.read_file_tile(level, *key)
        except SlideError as err:
            x, y = (int(v) for v in coords[needed_by])
            raise SlideError(f"{err}; needed by the tile at level-0 (x={x}, y={y})") from err

    resamples = rs != s

    def assemble(i: int) -> None:
        # as read: straight into the channels-first output; else via an (rs, rs, 3) square to resize
        square = np.empty((rs, rs, 3), np.uint8) if resamples else out[i].transpose(1, 2, 0)
        x, y = xs[i], ys[i]
        if x < 0 or y < 0 or x + rs > lw or y + rs > lh:
            square[...] = BACKGROUND  # partly beyond the level's edge
        rows, cols = spans(i)
        for r in rows:
            for c in cols:
                tile = cache[(r, c)]
                # overlap of the file tile and the square, in level coordinates
                ty0, tx0 = r * th, c * tw
                ay0, ay1 = max(ty0, y), min(ty0 + tile.shape[0], y + rs)
                ax0, ax1 = max(tx0, x), min(tx0 + tile.shape[1], x + rs)
                piece = tile[ay0 - ty0 : ay1 - ty0, ax0 - tx0 : ax1 - tx0]
                square[ay0 - y : ay1 - y, ax0 - x : ax1 - x] = piece
        if resamples:
            out[i] = resize_square(square, s).transpose(2, 0, 1)

    def run(fn: Callable[..., T], items: list[tuple[Any, ...]]) -> list[T]:
        if pool is None:
            return [fn(*item) for item in items]
        return list(pool.map(lambda item: fn(*item), items))  # re-raises the first error

    out[~inside] = BACKGROUND
    todo = [int(i) for i in order if inside[i]]
    start = 0
    while start < len(todo):
        # whole row bands, until the group has GROUP_TILES file tiles to decode
        stop = start
        needed: dict[FileTile, int] = {}  # file tile -> the first square needing it (for errors)
        while stop < len(todo) and (stop == start or len(needed) < GROUP_TILES):
            band = int(row0[todo[stop]])
            while stop < len(todo) and int(row0[todo[stop]]) == band:
                rows, cols = spans(todo[stop])
                for key in itertools.product(rows, cols):
                    if key not in cache:
                        needed.setdefault(key, todo[stop])
                stop += 1
        group = todo[start:stop]
        keys = list(needed)
        cache.update(zip(keys, run(decode, [(key, needed[key]) for key in keys])))
        run(assemble, [(i,) for i in group])
        start = stop
        next_band = int(row0[todo[start]]) if start < len(todo) else math.inf
        for key in [k for k in cache if k[0] < next_band]:
            del cache[key]
    return out
