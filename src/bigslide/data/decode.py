"""Read many squares of one slide, decoding each file tile once, optionally on a pool of threads.

Neighbouring grid tiles share file tiles (a 224 px tile on a 256 px JPEG grid touches up to four), so
reading squares one by one decodes most file tiles several times. Here the squares are visited top to
bottom; the file tiles a row band needs are decoded once (in parallel: imagecodecs releases the GIL)
and dropped as soon as no later square can touch them, so memory stays at a few rows of file tiles.
"""

from __future__ import annotations

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


def read_squares(
    slide: Slide,
    plan: ReadPlan,
    coords: np.ndarray,
    pool: Executor | None = None,
    *,
    as_float: bool = False,
) -> np.ndarray:
    """(N, size, size, 3) uint8: the square at each level-0 top-left (x, y) of `coords`, read by `plan`.

    Equal to `resize_square(slide.read_region(xy, plan.level, (read_size,) * 2), size)` per square.
    `as_float`: (N, 3, size, size) float32 in [0, 1] instead, converted square by square on the pool
    (the conversion of a whole bag costs about as much as decoding it).
    """
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    n, s = len(coords), plan.size
    out = np.empty((n, 3, s, s), np.float32) if as_float else np.empty((n, s, s, 3), np.uint8)
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

    def spans(i: int) -> tuple[range, range]:
        return (
            range(int(max(y0[i], 0) // th), int((min(y0[i] + rs, lh) - 1) // th) + 1),
            range(int(max(x0[i], 0) // tw), int((min(x0[i] + rs, lw) - 1) // tw) + 1),
        )

    cache: dict[FileTile, np.ndarray] = {}

    def decode(key: FileTile, needed_by: int) -> np.ndarray:
        try:
            return slide.read_file_tile(level, *key)
        except SlideError as err:
            x, y = (int(v) for v in coords[needed_by])
            raise SlideError(f"{err}; needed by the tile at level-0 (x={x}, y={y})") from err

    def assemble(i: int) -> None:
        square = np.full((rs, rs, 3), BACKGROUND, np.uint8)
        rows, cols = spans(i)
        for r in rows:
            for c in cols:
                tile = cache[(r, c)]
                # overlap of the file tile and the square, in level coordinates
                ty0, tx0 = r * th, c * tw
                ay0, ay1 = max(ty0, int(y0[i])), min(ty0 + tile.shape[0], int(y0[i]) + rs)
                ax0, ax1 = max(tx0, int(x0[i])), min(tx0 + tile.shape[1], int(x0[i]) + rs)
                square[ay0 - y0[i] : ay1 - y0[i], ax0 - x0[i] : ax1 - x0[i]] = tile[
                    ay0 - ty0 : ay1 - ty0, ax0 - tx0 : ax1 - tx0
                ]
        square = resize_square(square, plan.size)
        if as_float:
            np.divide(square.transpose(2, 0, 1), np.float32(255), out=out[i], dtype=np.float32)
        else:
            out[i] = square

    def run(fn: Callable[..., T], items: list[tuple[Any, ...]]) -> list[T]:
        if pool is None:
            return [fn(*item) for item in items]
        return list(pool.map(lambda item: fn(*item), items))  # re-raises the first error

    out[~inside] = BACKGROUND / 255 if as_float else BACKGROUND
    todo = [int(i) for i in order if inside[i]]
    start = 0
    while start < len(todo):
        band = int(row0[todo[start]])
        stop = start
        while stop < len(todo) and int(row0[todo[stop]]) == band:
            stop += 1
        group = todo[start:stop]
        needed: dict[FileTile, int] = {}
        for i in group:
            rows, cols = spans(i)
            for r in rows:
                for c in cols:
                    if (r, c) not in cache:
                        needed.setdefault((r, c), i)
        keys = list(needed)
        cache.update(zip(keys, run(decode, [(key, needed[key]) for key in keys])))
        run(assemble, [(i,) for i in group])
        start = stop
        next_band = int(row0[todo[start]]) if start < len(todo) else math.inf
        for key in [k for k in cache if k[0] < next_band]:
            del cache[key]
    return out
