"""The tile grid of an H&E JPEG SVS against decoding its level 0: what tiling a scanned slide costs.

The slide (20,480 x 16,384 px at 0.5 µm/px by default, Aperio layout with levels 1, 4 and 16, JPEG Q80 in
256 px file tiles, like `bench io`'s) is H&E-like tissue of `bigslide.synthetic.slides` in blocks of
4096 px, each its own seed, over about two fifths of the slide; it is written once and cached.
`TileGrid.from_slide` (tissue, ink and focus measured), its tissue-and-ink pass and its focus pass alone,
and decoding every level-0 file tile once (`DecodeFloor`: the least work any reader of level 0 does) are
timed in turn, repeat by repeat, each on the file opened afresh (nothing decoded is kept between them), on
one core.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bigslide.bench.io_slide import LEVEL_FACTORS, MPP, QUALITY, TILE, DecodeFloor, write_jpeg_svs
from bigslide.bench.targets import Targets, min_median
from bigslide.synthetic.pyramid import downsample_pyramid
from bigslide.tiling.blur import sharpness_level, tile_sharpness
from bigslide.tiling.grid import TileGrid, full_grid
from bigslide.tiling.tissue_measure import measure_tiles
from bigslide.wsi.slide import Slide, open_slide

BLOCK = 4096
"""Side of each separately drawn block of tissue (a multiple of 16, the pyramid's coarsest factor)."""
TARGET_RATIO = 0.10  # grid seconds over level-0 decode seconds, median over repeats


def ensure_he_slide(folder: Path, width: int, height: int) -> Path:
    """Write the H&E JPEG SVS unless a complete copy is already cached."""
    from bigslide.synthetic.slides import synthesize_slide

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"he_{width}x{height}_q{QUALITY}.svs"
    if path.is_file():
        return path
    print(f"writing {path} (once) ...", flush=True)
    n_rows, n_cols = -(-height // BLOCK), -(-width // BLOCK)
    reduced: dict[int, list[np.ndarray]] = {f: [] for f in LEVEL_FACTORS}

    def block_row(b: int) -> np.ndarray:
        """Row `b` of blocks at level 0; its reduced levels are kept in `reduced`."""
        blocks = [
            downsample_pyramid(
                synthesize_slide((BLOCK, BLOCK), lesions=(b + c) % 2, seed=b * n_cols + c).rgb, 3, 4
            )
            for c in range(n_cols)
        ]
        rows = min(BLOCK, height - b * BLOCK)
        for k, factor in enumerate(LEVEL_FACTORS, start=1):
            whole = np.concatenate([levels[k] for levels in blocks], axis=1)
            reduced[factor].append(whole[: rows // factor, : width // factor])
        return np.concatenate([levels[0] for levels in blocks], axis=1)[:rows, :width]

    def level_tiles(factor: int) -> Iterator[np.ndarray]:
        """A level's file tiles: level 0 block row by block row, a reduced level once level 0 is written."""
        if factor == 1:
            for b in range(n_rows):
                yield from _tiles(block_row(b))
        else:
            yield from _tiles(np.concatenate(reduced[factor]))

    def thumbnail() -> np.ndarray:
        return np.ascontiguousarray(np.concatenate(reduced[LEVEL_FACTORS[-1]])[::4, ::4])

    levels = [(width // f, height // f, level_tiles(f)) for f in (1, *LEVEL_FACTORS)]
    write_jpeg_svs(path, levels, thumbnail)
    return path


def _tiles(image: np.ndarray) -> Iterator[np.ndarray]:
    """File tiles of an image whose height is a whole number of tiles (or its last rows), row-major."""
    h, w = image.shape[:2]
    for y in range(0, h, TILE):
        for x in range(0, w, TILE):
            tile = np.full((TILE, TILE, 3), 255, np.uint8)
            part = image[y : y + TILE, x : x + TILE]
            tile[: part.shape[0], : part.shape[1]] = part
            yield tile


def compare(path: Path, tile_size: int, repeats: int, targets: Targets) -> None:
    """Time the grid, its focus pass alone and the level-0 decode, alternating, each on a file opened
    afresh, on one core; check the grid against the decode."""
    with open_slide(path) as slide:
        dims = " / ".join(f"{w}x{h}" for w, h in slide.level_dimensions)
        th, tw = slide.tile_shape(0)
        w0, h0 = slide.dimensions
    file_tiles = [(r, c) for r in range(-(-h0 // th)) for c in range(-(-w0 // tw))]
    print(
        f"\nH&E JPEG SVS {path} ({path.stat().st_size / 1e6:.0f} MB, Q{QUALITY}), levels {dims}; "
        f"TileGrid.from_slide({tile_size}, target_mpp={MPP}) against decoding level 0 once "
        f"({len(file_tiles)} file tiles), on one core"
    )
    grid_row = f"TileGrid.from_slide({tile_size}, target_mpp={MPP})"
    tissue_row = "  of which tissue and ink (measure_tiles, apart)"
    focus_row = "  of which focus (tile_sharpness, timed apart)"
    decode_row = "decode level 0 once (every file tile)"
    times: dict[str, list[float]] = {grid_row: [], tissue_row: [], focus_row: [], decode_row: []}
    read: dict[str, str] = {decode_row: "0"}
    grid: TileGrid | None = None
    with _one_core():
        for _ in range(max(1, repeats)):
            with open_slide(path) as slide:
                start = time.perf_counter()
                grid = TileGrid.from_slide(slide, tile_size, target_mpp=MPP)
                times[grid_row].append(time.perf_counter() - start)
                read[grid_row] = _levels_read(slide)
                focus_level = sharpness_level(slide, grid.tile_size_level0, grid.level)
            with open_slide(path) as slide:
                start = time.perf_counter()
                tiled = full_grid(slide, grid.level, grid.read_size, grid.tile_size_level0)
                measure_tiles(slide, tiled, grid.tile_size_level0, grid.tissue_settings)
                times[tissue_row].append(time.perf_counter() - start)
                read[tissue_row] = _levels_read(slide)
            with open_slide(path) as slide:
                start = time.perf_counter()
                tile_sharpness(slide, grid.coords, grid.tile_size_level0, grid.level)
                times[focus_row].append(time.perf_counter() - start)
                read[focus_row] = _levels_read(slide)
            floor = DecodeFloor(path)
            try:
                start = time.perf_counter()
                floor._decode(file_tiles)
                times[decode_row].append(time.perf_counter() - start)
            finally:
                floor.close()
    assert grid is not None
    print(
        f"grid: {len(grid)} tiles kept of {grid.check.tiles} ({grid.check.tissue_fraction:.0%} of the tiled "
        f"area tissue), {grid.check.blurred} out of focus; focus measured on level {focus_level}"
    )
    print(f"{'step':<48} {'min s':>9} {'median s':>9} {'/ decode':>9}  levels read per run")
    decode = statistics.median(times[decode_row])
    for name, values in times.items():
        low, mid = min_median(values)
        print(f"{name:<48} {low:>9.3f} {mid:>9.3f} {mid / decode:>9.3f}  {read[name]}")
    ratio = statistics.median(g / d for g, d in zip(times[grid_row], times[decode_row], strict=True))
    targets.check("H&E SVS grid / level-0 decode (median over repeats)", ratio, TARGET_RATIO)


def _levels_read(slide: Slide) -> str:
    return ", ".join(f"{level} ({px / 1e6:.2f} Mpx)" for level, px in sorted(slide.pixels_read.items()))


@contextmanager
def _one_core() -> Iterator[None]:
    """Run the block on one of this process's cores (restored after): the comparison is per core."""
    saved = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if saved:
        os.sched_setaffinity(0, {min(saved)})
    try:
        yield
    finally:
        if saved:
            os.sched_setaffinity(0, saved)
