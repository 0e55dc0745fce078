"""Write pyramidal tiled TIFFs (Aperio SVS, generic pyramidal TIFF, OME-TIFF) with tifffile.

Used by the bundled synthetic data, the tests and the benchmarks. Levels can be in-memory arrays or
lazy tile sources, so a 100,000-pixel-wide mostly-empty slide is written tile by tile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tifffile

Flavour = Literal["svs", "tiff", "ome"]


@dataclass(frozen=True)
class LazyLevel:
    """A level given by its size and a function returning the RGB tile at tile row/column (ty, tx).

    The function must return a (tile, tile, 3) uint8 array; edge tiles are cropped on write.
    """

    height: int
    width: int
    tile_fn: Callable[[int, int], np.ndarray]


Level = np.ndarray | LazyLevel


def _shape(level: Level) -> tuple[int, int]:
    if isinstance(level, LazyLevel):
        return level.height, level.width
    return int(level.shape[0]), int(level.shape[1])


def _tiles(level: Level, tile: int) -> Iterator[np.ndarray]:
    height, width = _shape(level)
    for ty in range(-(-height // tile)):
        for tx in range(-(-width // tile)):
            if isinstance(level, LazyLevel):
                block = level.tile_fn(ty, tx)
            else:
                block = level[ty * tile : (ty + 1) * tile, tx * tile : (tx + 1) * tile]
            out = np.zeros((tile, tile, 3), np.uint8)
            out[: block.shape[0], : block.shape[1]] = block[:tile, :tile, :3]
            yield out


def downsample_pyramid(image: np.ndarray, n_levels: int, factor: int = 2) -> list[np.ndarray]:
    """Level 0 plus `n_levels - 1` box-filtered reductions by `factor` (sizes floor-divided)."""
    levels = [image]
    for _ in range(n_levels - 1):
        prev = levels[-1]
        h, w = prev.shape[0] // factor, prev.shape[1] // factor
        if min(h, w) < 1:
            break
        block = prev[: h * factor, : w * factor].reshape(h, factor, w, factor, 3).astype(np.float32)
        levels.append(np.round(block.mean(axis=(1, 3))).astype(np.uint8))
    return levels


APERIO_JP2000_RGB = 33005
"""TIFF compression tag of Aperio's JPEG 2000 in RGB (33003 is its YCbCr flavour)."""
JPEG2000_PSNR = 45
"""Quality of the JPEG 2000 tiles written, as a PSNR in dB: lossy, about what a scanner keeps."""


def write_pyramid(
    path: str | Path,
    levels: Sequence[Level],
    *,
    mpp: float | None = 0.5,
    tile: int = 256,
    flavour: Flavour = "svs",
    compression: str | None = "zlib",
    jpeg_quality: int | None = None,
) -> Path:
    """Write `levels` (level 0 first, each smaller) as a tiled pyramidal TIFF.

    flavour "svs": Aperio layout (baseline, thumbnail, reduced levels) with `MPP` in the description;
    "tiff": generic pyramid as SubIFDs of page 0 with the resolution tags in centimetres;
    "ome": OME-TIFF with SubIFDs and PhysicalSizeX/Y in µm. `mpp=None` writes no resolution at all.
    `compression`: a tifffile name; "jpeg2000" writes Aperio's JPEG 2000 (RGB, lossy).
    """
    path = Path(path)
    if tile % 16:
        raise ValueError(f"tile must be a multiple of 16, got {tile}")
    h0, w0 = _shape(levels[0])
    kw: dict = {"tile": (tile, tile), "photometric": "rgb", "compression": compression, "dtype": np.uint8}
    if jpeg_quality is not None:
        kw.update(compression="jpeg", compressionargs={"level": int(jpeg_quality)})
    elif compression == "jpeg2000":  # as Aperio's Kakadu writes it: RGB, lossy, the colour transform inside
        kw.update(compression=APERIO_JP2000_RGB, compressionargs={"level": JPEG2000_PSNR})
    res: dict = {}
    if mpp is not None and flavour != "svs":
        res = {"resolution": (1e4 / mpp, 1e4 / mpp), "resolutionunit": "CENTIMETER"}

    with tifffile.TiffWriter(path, bigtiff=h0 * w0 * 3 > 2**31, ome=flavour == "ome") as tif:
        if flavour == "svs":
            coding = "J2K/KDU Q=70" if compression == "jpeg2000" else "RGB"
            coding = coding if jpeg_quality is None else f"JPEG/RGB Q={int(jpeg_quality)}"
            desc = f"Aperio Image Library v12.0.0\r\n{w0}x{h0} [0,0 {w0}x{h0}] ({tile}x{tile}) {coding}"
            if mpp is not None:
                desc += f"|AppMag = 20|MPP = {mpp:.6f}"
            # as Aperio writes: one ImageDescription (tifffile's own second one hides the first from
            # OpenSlide), and reduced levels as plain pages (tifffile's SVS reader stops at a reduced one)
            kw["metadata"] = None
            tif.write(_tiles(levels[0], tile), shape=(h0, w0, 3), description=desc, **kw)
            thumb = _thumbnail(levels)
            tif.write(
                thumb,
                photometric="rgb",
                metadata=None,
                description=f"{w0}x{h0} -> {thumb.shape[1]}x{thumb.shape[0]}",
            )
            for level in levels[1:]:
                h, w = _shape(level)
                tif.write(_tiles(level, tile), shape=(h, w, 3), description=f"{w0}x{h0} -> {w}x{h}", **kw)
            return path

        metadata: dict[str, object] | None = None
        if flavour == "ome":
            metadata = {"axes": "YXS"}
            if mpp is not None:
                metadata.update(
                    PhysicalSizeX=mpp, PhysicalSizeXUnit="µm", PhysicalSizeY=mpp, PhysicalSizeYUnit="µm"
                )
        tif.write(
            _tiles(levels[0], tile),
            shape=(h0, w0, 3),
            subifds=len(levels) - 1,
            metadata=metadata,
            **res,
            **kw,
        )
        for level in levels[1:]:
            h, w = _shape(level)
            tif.write(_tiles(level, tile), shape=(h, w, 3), subfiletype=1, **res, **kw)
    return path


def _thumbnail(levels: Sequence[Level]) -> np.ndarray:
    """The smallest in-memory level (or a grey square for lazy levels), as SVS files carry one."""
    for level in reversed(levels):
        if isinstance(level, np.ndarray):
            return np.ascontiguousarray(level)
    return np.full((64, 64, 3), 240, np.uint8)
