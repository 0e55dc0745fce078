"""Measure tiles on a low pyramid level, never by reading level 0 tile by tile: each tile's share of
tissue and of ink is the share of its footprint's pixels that `classify_pixels` puts in each class.

A level too large to hold is read in strips of whole tile rows (with a margin, so a pixel's neighbours
are seen across the strip's edge); a slide with no small enough level is measured on its streamed
thumbnail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
from scipy import ndimage

from bigslide.errors import SlideError
from bigslide.tiling.pixel_classes import (
    FILM,
    GLASS_OD,
    INK,
    TISSUE,
    TissueSettings,
    optical_density,
    summed,
)
from bigslide.tiling.tissue import MASK_SIZE, block_mean, classify_pixels, glass_od, textured_pixels
from bigslide.wsi.slide import BACKGROUND, WHOLE_READ_PIXELS, Slide
from bigslide.wsi.tiff_tiles import LUMA

TEXTURE_STEP = 4
"""Cell texture (for the tissue check's warning, a slide-wide share) is judged on every fourth pixel and
row of the level tissue is measured on."""
MIN_FOOTPRINT_PX = 4
"""A tile must still span this many pixels on the level its tissue is measured on."""
MEASURE_UM = 8.0
"""Where the slide states its pixel size, tiles are measured on pixels no coarser than about 8 µm (within
PIXEL_TOLERANCE; a finer level's pixels judged in blocks where the pyramid has no such level): a pen
stroke, 80 µm wide and more, spans 10 of them, enough for the film rule to find it flat. On 16 µm pixels
a thin stroke is mostly its soft edges (the tissue bench's tuning set, 32 px tiles at 2 µm/px: blue
ink-on-glass tiles kept 3.9 % on 16 µm pixels, 0.7 % on 8 µm)."""
PIXEL_TOLERANCE = 1.15
"""Scanners' pixels are rarely round numbers (0.2527 µm at 40x makes 4.04 µm pixels 16 times down)."""
STRIP_PIXELS = 1 << 24
BARE_OD = GLASS_OD / 4
"""On the coarsest level, a pixel whose summed OD is less than this above the glass's shows nothing: even a
tile whose tissue covers less than a quarter of it raises its pixels past it."""


class TileMeasure(NamedTuple):
    """Per tile: its share of tissue, of ink (pen, marker, dust), of ink only the film rule found and of
    tissue with cell texture (`textured_pixels`); for the slide: the share of the tiled area (every tile,
    kept or not) that is tissue and that is ink, and the glass OD the tiles were judged against."""

    tissue: np.ndarray
    ink: np.ndarray
    slide_tissue: float
    slide_ink: float
    textured: np.ndarray
    film: np.ndarray
    glass: np.ndarray


def measure_raster(slide: Slide, size0: int) -> tuple[int, int]:
    """(level, block): tiles of `size0` level-0 pixels are measured on blocks of block x block pixels of
    `level` (their means). The level is the coarsest on which a tile still spans MIN_FOOTPRINT_PX; where
    that level's pixels are coarser than MEASURE_UM (and the slide states its pixel size), a finer level
    is read instead, in blocks of up to MEASURE_UM."""
    coarsest = level_spanning(slide, size0, MIN_FOOTPRINT_PX)
    if slide.mpp is None:
        return coarsest, 1
    level = coarsest
    while level > 0 and slide.mpp[0] * slide.level_downsamples[level] > MEASURE_UM * PIXEL_TOLERANCE:
        level -= 1
    if level == coarsest:
        return level, 1
    pixel_um = slide.mpp[0] * slide.level_downsamples[level]
    largest = min(MEASURE_UM * PIXEL_TOLERANCE, size0 * slide.mpp[0] / (MIN_FOOTPRINT_PX * 0.99))
    return level, max(1, int(largest / pixel_um))


def level_spanning(slide: Slide, size0: int, pixels: int) -> int:
    """The coarsest level on which `size0` level-0 pixels still span `pixels` (level 0 if none does)."""
    chosen = 0
    for level, ds in enumerate(slide.level_downsamples):
        if size0 / ds >= pixels * 0.99:  # level sizes are floored, so ds runs a hair high
            chosen = level
    return chosen


def thumbnail_downsample(slide: Slide) -> float:
    """Level-0 pixels per pixel of `slide.thumbnail(MASK_SIZE)`, without reading it."""
    level = slide.thumbnail_level(MASK_SIZE)
    w, h = slide.level_dimensions[level]
    return slide.level_downsamples[level] * max(1, math.ceil(max(w, h) / MASK_SIZE))


def footprints(coords: np.ndarray, size0: int, ds: float, shape: tuple[int, int]) -> np.ndarray:
    """(N, 4) row0, row1, col0, col1 of each tile on a raster of downsample `ds` (at least 1 px)."""
    h, w = shape
    start = np.round(coords / ds).astype(np.int64)
    stop = np.round((coords + size0) / ds).astype(np.int64)
    stop = np.maximum(stop, start + 1)
    col0, row0 = np.clip(start[:, 0], 0, w - 1), np.clip(start[:, 1], 0, h - 1)
    col1, row1 = np.clip(stop[:, 0], col0 + 1, w), np.clip(stop[:, 1], row0 + 1, h)
    return np.stack([row0, row1, col0, col1], axis=1)


def box_means(values: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Mean of `values` over each (row0, row1, col0, col1) box, via a summed-area table taken only at
    the boxes' rows: the rows between two of them are summed in one pass (`np.add.reduceat`), several
    times cheaper than a table of every row."""
    # integer sums are exact; int32 (half the memory to run through) holds any count below 2**31
    dtype = np.float64 if values.dtype.kind == "f" else np.int32 if values.size < 2**31 // 255 else np.int64
    r0, r1, c0, c1 = boxes.T
    h, w = values.shape
    starts = np.unique(np.concatenate([[0], r0, r1]))
    starts = starts[starts < h]
    table = np.zeros((len(starts) + 1, w + 1), dtype)
    np.cumsum(np.add.reduceat(values, starts, axis=0, dtype=dtype), axis=0, out=table[1:, 1:])
    np.cumsum(table[1:, 1:], axis=1, out=table[1:, 1:])
    edges = np.append(starts, h)  # table row k sums the values above row edges[k]
    i0, i1 = np.searchsorted(edges, r0), np.searchsorted(edges, r1)
    total = table[i1, c1] - table[i0, c1] - table[i1, c0] + table[i0, c0]
    return total / ((r1 - r0) * (c1 - c0))


def strips(
    slide: Slide, level: int, boxes: np.ndarray, margin: int = 0, block: int = 1
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(tile indices, image, their boxes in the image's pixels): `level` read in strips of whole tile rows
    spanning the tiles' columns, each with `margin` extra pixels around it where the level has them.
    With `block` above 1, `boxes`, `margin` and the images are in blocks of `block` x `block` of the
    level's pixels (their means; a partial last row or column of blocks is left out)."""
    lw, lh = (n // block for n in slide.level_dimensions[level])
    col0, col1 = int(boxes[:, 2].min()), int(boxes[:, 3].max())
    x0, x1 = max(0, col0 - margin), min(lw, col1 + margin)
    max_rows = max(int((boxes[:, 1] - boxes[:, 0]).max()), STRIP_PIXELS // max(1, x1 - x0))
    order = np.argsort(boxes[:, 0], kind="stable")
    start = 0
    while start < len(order):
        top = int(boxes[order[start], 0])
        stop, bottom = start, top
        while stop < len(order) and int(boxes[order[stop], 1]) - top <= max_rows:
            bottom = max(bottom, int(boxes[order[stop], 1]))
            stop += 1
        batch = order[start:stop]
        y0, y1 = max(0, top - margin), min(lh, bottom + margin)
        image = slide._read_level(level, y0 * block, y1 * block, x0 * block, x1 * block)
        yield batch, block_mean(image, block), boxes[batch] - np.array([y0, y0, x0, x0])
        start = stop


def measure_tiles(
    slide: Slide,
    coords: np.ndarray,
    size0: int,
    settings: TissueSettings,
) -> TileMeasure:
    """Tissue and ink shares of each tile (`coords` level-0 top-left corners, side `size0`), measured on
    `measure_raster` (or on the thumbnail when every level is too large to read)."""
    if len(coords) == 0:
        empty = np.zeros(0, np.float64)
        return TileMeasure(empty, empty, 0.0, 0.0, empty, empty, np.zeros(3, np.float32))
    level, block = measure_raster(slide, size0)
    lw, lh = slide.level_dimensions[level]
    if lw * lh > WHOLE_READ_PIXELS and size0 / thumbnail_downsample(slide) >= MIN_FOOTPRINT_PX:
        # no pyramid level is small enough: measure on the (streamed) thumbnail instead
        thumb = slide.thumbnail(MASK_SIZE)
        ds = slide.dimensions[0] / thumb.shape[1]
        classes = _classify(slide, thumb, ds, settings, None)
        boxes = footprints(coords, size0, ds, classes.classes.shape)
        return _shares([(np.arange(len(coords)), classes, boxes)], len(coords))
    ds = slide.level_downsamples[level] * block
    glass = None
    measured = np.arange(len(coords))
    if lw * lh > STRIP_PIXELS:  # read in strips: one glass for every strip, and no strip of bare glass
        glass = glass_od(slide.thumbnail(512)) if settings.reject_ink else None
        measured = measured[_not_bare(slide, coords, size0, level)]
    boxes = footprints(coords[measured], size0, ds, (lh // block, lw // block))
    margin = _margin(slide, ds, settings)
    parts = [
        (measured[batch], _classify(slide, image, ds, settings, glass), local)
        for batch, image, local in strips(slide, level, boxes, margin, block)
    ]
    return _shares(parts, len(coords))


def _not_bare(slide: Slide, coords: np.ndarray, size0: int, level: int) -> np.ndarray:
    """Whether each tile's footprint on the pyramid's coarsest level (grown by a pixel) holds anything
    but glass: any pixel absorbing BARE_OD more than the glass. All True when that level is `level`
    or too large to read whole."""
    coarse = slide.level_count - 1
    w, h = slide.level_dimensions[coarse]
    if coarse <= level or w * h > WHOLE_READ_PIXELS:
        return np.ones(len(coords), bool)
    image = slide.read_level(coarse)
    od = optical_density(image, glass_od(image))
    something = ndimage.binary_dilation(summed(od) >= BARE_OD)
    boxes = footprints(coords, size0, slide.level_downsamples[coarse], (h, w))
    return box_means(something, boxes) > 0


class _Classes(NamedTuple):
    classes: np.ndarray
    textured: np.ndarray  # tissue with cell texture, on every `step`-th pixel and row
    step: int
    glass: np.ndarray


def _classify(
    slide: Slide, image: np.ndarray, ds: float, settings: TissueSettings, glass: np.ndarray | None
) -> _Classes:
    pixel_um = slide.mpp[0] * ds if slide.mpp is not None else None
    glass = glass_od(image) if glass is None else glass
    classes = classify_pixels(image, settings, glass=glass, pixel_um=pixel_um, mark_films=True)
    step = TEXTURE_STEP if min(image.shape[:2]) >= 16 * TEXTURE_STEP else 1
    cells = textured_pixels(image, glass, pixel_um, step) & (classes[::step, ::step] == TISSUE)
    return _Classes(classes, cells, step, glass)


def _margin(slide: Slide, ds: float, settings: TissueSettings) -> int:
    """Pixels read around a strip so that texture and filled holes see across its edge."""
    if not settings.reject_ink:
        return 0
    pixel_um = slide.mpp[0] * ds if slide.mpp is not None else None
    holes = settings.fill_holes_um / pixel_um if pixel_um else 0.0
    return math.ceil(max(16.0, holes))


def _shares(parts: list[tuple[np.ndarray, _Classes, np.ndarray]], n: int) -> TileMeasure:
    tissue, ink, film, textured = (np.zeros(n, np.float64) for _ in range(4))
    for batch, (classes, cells, step, _glass), boxes in parts:
        tissue[batch] = box_means(classes == TISSUE, boxes)
        ink[batch] = box_means(classes >= INK, boxes)  # films are ink too
        film[batch] = box_means(classes == FILM, boxes)
        start = np.minimum(boxes[:, [0, 2]] // step, np.array(cells.shape) - 1)
        stop = np.maximum(-(-boxes[:, [1, 3]] // step), start + 1)
        textured[batch] = box_means(
            cells, np.stack([start[:, 0], stop[:, 0], start[:, 1], stop[:, 1]], axis=1)
        )
    glass = parts[0][1].glass if parts else np.zeros(3, np.float32)
    return TileMeasure(tissue, ink, float(tissue.mean()), float(ink.mean()), textured, film, glass)


def apply_in_runs(
    slide: Slide,
    level: int,
    boxes: np.ndarray,
    per_run: Callable[[np.ndarray, np.ndarray], np.ndarray],
    margin: int = 0,
    luma: bool = False,
) -> np.ndarray:
    """`per_run(image, boxes in the image)` -> one value per tile, reading only the tiles: each run of
    neighbouring tiles in a row of tiles is one rectangle (with `margin` pixels around it where the level
    has them), (h, w, 3) uint8, or (h, w) float32 luma with `luma`. Runs go top to bottom and each file
    tile of `level` is decoded once (`FileTiles`). A tile over a file tile that cannot be decoded gets NaN
    (the tile read for training names the broken file tile). `boxes` may hold further groups of four
    columns after the first: boxes within each tile's (row0, row1, col0, col1), moved into the image
    alike."""
    out = np.zeros(len(boxes), np.float64)
    lw, lh = slide.level_dimensions[level]
    tiles = FileTiles(slide, level, luma)
    for batch in _runs(boxes):
        y0, y1 = max(0, int(boxes[batch, 0].min()) - margin), min(lh, int(boxes[batch, 1].max()) + margin)
        x0, x1 = max(0, int(boxes[batch, 2].min()) - margin), min(lw, int(boxes[batch, 3].max()) + margin)
        tiles.forget_above(y0)
        image, failed = tiles.region(y0, y1, x0, x1)
        local = boxes[batch] - np.tile([y0, y0, x0, x0], boxes.shape[1] // 4)
        out[batch] = per_run(image, local)
        for fy0, fy1, fx0, fx1 in failed:
            r0, r1, c0, c1 = (local[:, :4] - margin * np.array([1, -1, 1, -1])).T
            out[batch[(r0 < fy1) & (fy0 < r1) & (c0 < fx1) & (fx0 < c1)]] = np.nan
    return out


def _runs(boxes: np.ndarray) -> Iterator[np.ndarray]:
    """Indices of boxes in runs: the same top row, each box starting at most one box's width after the
    previous one ends; runs ordered top to bottom, left to right."""
    order = np.lexsort((boxes[:, 2], boxes[:, 0]))
    start = 0
    while start < len(order):
        stop = start + 1
        first = boxes[order[start]]
        while (
            stop < len(order)
            and boxes[order[stop], 0] == first[0]
            and boxes[order[stop], 2] <= boxes[order[stop - 1], 3] + (first[3] - first[2])
        ):
            stop += 1
        yield order[start:stop]
        start = stop


LARGE_FILE_TILE = 1 << 20
"""File tiles of more pixels than this (a level stored untiled or in strips) are not decoded whole."""


class FileTiles:
    """One level's file tiles, each decoded once (as RGB, or as luma with `luma`), pasted into the
    rectangles asked for. Rectangles are asked for top to bottom: `forget_above` lets go of the file tiles
    no later rectangle reaches."""

    def __init__(self, slide: Slide, level: int, luma: bool = False) -> None:
        self.slide, self.level, self.luma = slide, level, luma
        self.tile_h, self.tile_w = slide.tile_shape(level)
        self.decoded: dict[tuple[int, int], np.ndarray | None] = {}

    def region(
        self, y0: int, y1: int, x0: int, x1: int
    ) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
        """Pixels [y0, y1) x [x0, x1) of the level as (h, w, 3) uint8 (or (h, w) float32 luma), and the
        (row0, row1, col0, col1) in them of file tiles that could not be decoded (drawn as glass)."""
        th, tw = self.tile_h, self.tile_w
        if th * tw > LARGE_FILE_TILE:  # untiled or stripped: decode the rectangle alone, not whole strips
            try:
                image = self.slide._read_level(self.level, y0, y1, x0, x1)
                return (image @ LUMA if self.luma else image), []
            except SlideError:
                return self._glass(y1 - y0, x1 - x0), [(0, y1 - y0, 0, x1 - x0)]
        out = self._glass(y1 - y0, x1 - x0)
        failed = []
        for row in range(y0 // th, -(-y1 // th)):
            for col in range(x0 // tw, -(-x1 // tw)):
                ty, tx = row * th, col * tw
                ay0, ay1, ax0, ax1 = max(ty, y0), min(ty + th, y1), max(tx, x0), min(tx + tw, x1)
                tile = self._tile(row, col)
                if tile is None:
                    failed.append((ay0 - y0, ay1 - y0, ax0 - x0, ax1 - x0))
                    continue
                part = tile[ay0 - ty : ay1 - ty, ax0 - tx : ax1 - tx]
                out[ay0 - y0 : ay0 - y0 + part.shape[0], ax0 - x0 : ax0 - x0 + part.shape[1]] = part
        return out, failed

    def _glass(self, h: int, w: int) -> np.ndarray:
        if self.luma:
            return np.full((h, w), float(BACKGROUND), np.float32)
        return np.full((h, w, 3), BACKGROUND, np.uint8)

    def forget_above(self, y: int) -> None:
        """Let go of the file tiles that lie wholly above row `y` of the level."""
        for key in [k for k in self.decoded if (k[0] + 1) * self.tile_h <= y]:
            del self.decoded[key]

    def _tile(self, row: int, col: int) -> np.ndarray | None:
        key = (row, col)
        if key not in self.decoded:
            try:
                read = self.slide.read_file_tile_luma if self.luma else self.slide.read_file_tile
                self.decoded[key] = read(self.level, row, col)
            except SlideError:
                self.decoded[key] = None
        return self.decoded[key]
