"""The `bench io` slide, written once and cached, and the decode floor: each JPEG file tile decoded once
straight from the file's bytes, the least work any reader does."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

TILE = 256
QUALITY = 80
MPP = 0.5
LEVEL_FACTORS = (4, 16)
"""The reduced levels' downsamples, as an Aperio scanner writes them."""


def touched_file_tiles(coords: np.ndarray, size: int, tile: int) -> list[tuple[int, int]]:
    """The (row, col) of every file tile the squares touch, each once."""
    seen: set[tuple[int, int]] = set()
    for x, y in coords:
        for r in range(int(y) // tile, (int(y) + size - 1) // tile + 1):
            for c in range(int(x) // tile, (int(x) + size - 1) // tile + 1):
                seen.add((r, c))
    return sorted(seen)


class DecodeFloor:
    """Decode level-0 JPEG file tiles straight from the file's bytes: the least work any reader does."""

    def __init__(self, path: Path) -> None:
        import tifffile

        self.tif = tifffile.TiffFile(path)
        page = self.tif.pages.first
        self.offsets, self.counts = page.dataoffsets, page.databytecounts
        self.tables = page.jpegtables
        self.columns = -(-page.imagewidth // page.tilewidth)
        self.fd = os.open(path, os.O_RDONLY)

    def decode_bags(self, bags: list[list[tuple[int, int]]], *, threads: int = 0, processes: int = 0) -> None:
        """Decode every tile once: on `threads` threads of this process, or split over `processes` forked
        processes (every `processes`-th tile each; fork start-up is part of the time)."""
        tiles = [t for bag in bags for t in bag]
        if processes:
            context = multiprocessing.get_context("fork")
            workers = [
                context.Process(target=self._decode, args=(tiles[i::processes],)) for i in range(processes)
            ]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            return
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda tile: self._decode([tile]), tiles))

    def _decode(self, tiles: list[tuple[int, int]]) -> None:
        import imagecodecs

        for row, column in tiles:
            k = row * self.columns + column
            data = os.pread(self.fd, int(self.counts[k]), int(self.offsets[k]))
            imagecodecs.jpeg8_decode(data, tables=self.tables)

    def close(self) -> None:
        os.close(self.fd)
        self.tif.close()


def ensure_slide(folder: Path, width: int, height: int, *, seed: int = 0) -> Path:
    """A tissue-textured JPEG SVS (Q80, 256 px tiles, 3 levels), written once and cached; `seed` picks
    its tiles (slides of other seeds are other files, e.g. a cohort)."""
    from skimage import data as skdata
    from skimage.transform import rescale

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"io_{width}x{height}_q{QUALITY}{f'_s{seed}' if seed else ''}.svs"
    if path.is_file():
        return path
    texture = np.ascontiguousarray(skdata.immunohistochemistry())  # 512 x 512 stained tissue
    rng = np.random.default_rng(seed)

    def tiles(w: int, h: int, scale: float) -> Any:
        source = texture
        if scale < 1:
            source = (rescale(texture, scale, channel_axis=-1, anti_aliasing=True) * 255).astype(np.uint8)
            source = np.tile(source, (int(1 / scale), int(1 / scale), 1))
        for _ in range(-(-h // TILE) * -(-w // TILE)):  # row-major, as tifffile writes them
            y, x = rng.integers(0, source.shape[0] - TILE), rng.integers(0, source.shape[1] - TILE)
            tile = source[y : y + TILE, x : x + TILE]
            yield np.rot90(tile, int(rng.integers(4))).copy()

    thumb = np.full((height // 64, width // 64, 3), 200, np.uint8)
    levels = [(width // f, height // f, tiles(width // f, height // f, 1 / f)) for f in (1, *LEVEL_FACTORS)]
    write_jpeg_svs(path, levels, lambda: thumb)
    return path


def write_jpeg_svs(
    path: Path, levels: Sequence[tuple[int, int, Iterator[np.ndarray]]], thumbnail: Callable[[], np.ndarray]
) -> None:
    """An Aperio-layout JPEG SVS (Q`QUALITY` in TILE px file tiles, MPP µm/px) at `path`, written under
    another name and renamed once whole: `levels` (width, height, file tiles row-major), level 0 first,
    each consumed only once the one before is written; the thumbnail (made once level 0 is written) after
    level 0, as Aperio orders its pages."""
    import tifffile

    kw: dict[str, Any] = {
        "tile": (TILE, TILE),
        "photometric": "rgb",
        "compression": "jpeg",
        "compressionargs": {"level": QUALITY},
        "dtype": np.uint8,
    }
    (width, height, level0), *reduced = levels
    partial = path.with_suffix(".partial.svs")
    with tifffile.TiffWriter(partial, bigtiff=True) as tif:
        desc = (
            f"Aperio Image Library v12.0.0\r\n{width}x{height} [0,0 {width}x{height}] ({TILE}x{TILE}) "
            f"JPEG/RGB Q={QUALITY}|AppMag = 20|MPP = {MPP}"
        )
        tif.write(level0, shape=(height, width, 3), description=desc, **kw)
        tif.write(thumbnail(), photometric="rgb", description=f"{width}x{height} -> thumbnail")
        for w, h, tiles in reduced:
            tif.write(tiles, shape=(h, w, 3), subfiletype=1, description=f"{width}x{height} -> {w}x{h}", **kw)
    partial.replace(path)
