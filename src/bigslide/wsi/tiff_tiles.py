"""Decode one file tile of a tiled TIFF page straight from the file (`os.pread`), as RGB or as luma.

Not through zarr, whose single event-loop thread would serialise the loader's threads. Luma (the focus
measure's greyscale) comes from a JPEG tile's decoder itself: for the YCbCr JPEG most scanners write it is
the first plane, and the colour planes are never decoded (less than half the time of RGB and a product).

Aperio's JPEG 2000 in YCbCr (compression 33003) is RGB once read, whatever its chroma's resolution, as
OpenSlide reads it: OpenJPEG converts Y, Cb, Cr only when Cb and Cr are subsampled across, so tiles of
full-resolution chroma (4:4:4) are converted here (`ycbcr_left`, `ycbcr_to_rgb`).
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

LUMA = np.array([0.299, 0.587, 0.114], np.float32)
"""ITU-R 601 luma weights (PIL's "L" mode; JPEG's Y): greyscale as a matrix product, three times faster on
uint8 RGB than channel by channel."""


APERIO_J2K_YCBCR = 33003


def decode(page: Any, fd: int, index: int) -> np.ndarray:
    """File tile `index` of a tifffile `page` as tifffile decodes it (samples last; whole, not cropped), a
    33003 tile's Y, Cb, Cr as RGB."""
    data = os.pread(fd, page.databytecounts[index], page.dataoffsets[index])
    block = np.asarray(page.decode(data, index, jpegtables=page.jpegtables)[0][0])
    if page.compression == APERIO_J2K_YCBCR and ycbcr_left(data):
        return ycbcr_to_rgb(block)
    return block


def ycbcr_left(codestream: bytes) -> bool:
    """Whether OpenJPEG gives a 33003 tile's Y, Cb, Cr back unconverted: a raw codestream (SOC, then SIZ)
    of three components whose Cb is not subsampled across; OpenJPEG's own tools take only a subsampled
    one for YCbCr (a JP2 file's colour box says for itself)."""
    if len(codestream) < 51 or codestream[:4] != b"\xff\x4f\xff\x51":
        return False
    (components,) = struct.unpack(">H", codestream[40:42])
    # each component: Ssiz (depth), XRsiz, YRsiz (its subsampling across and down)
    return components == 3 and codestream[42 + 3 + 1] == 1


def ycbcr_to_rgb(block: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 Y, Cb, Cr (ITU-R 601, full range, as JPEG's) as RGB, with OpenSlide's coefficients."""
    y, cb, cr = (block[..., c].astype(np.float32) for c in range(3))
    cb -= 128
    cr -= 128
    rgb = np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], axis=-1)
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def decode_luma(page: Any, fd: int, index: int) -> np.ndarray | None:
    """File tile `index` of `page` as (h, w) uint8 luma from its JPEG decoder, or None when the page is not
    8-bit JPEG of three interleaved colour samples (RGB or YCbCr)."""
    if not (
        page.compression == 7
        and page.photometric in (2, 6)
        and page.planarconfig == 1
        and page.samplesperpixel == 3
        and page.bitspersample == 8
    ):
        return None
    import imagecodecs  # here: LUMA is read by the tissue rule's settings, on napari's GUI thread

    data = os.pread(fd, page.databytecounts[index], page.dataoffsets[index])
    rgb_coded = page.photometric == 2 and not page.is_jfif  # Aperio's JPEG: RGB, not YCbCr
    grey = imagecodecs.jpeg_decode(
        data, tables=page.jpegtables, colorspace="RGB" if rgb_coded else None, outcolorspace="GRAY"
    )
    return grey.reshape(grey.shape[0], grey.shape[1])


def rgba_on_white(rgba: np.ndarray, *, premultiplied: bool) -> np.ndarray:
    """(h, w, 4) uint8 RGBA as RGB laid on white: a transparent pixel (no scan data) is glass, as a
    transparent PNG's is. `premultiplied`: the colour is already scaled by alpha (associated alpha, and
    OpenSlide's)."""
    rgb = rgba[..., :3].astype(np.uint16)
    alpha = rgba[..., 3:4].astype(np.uint16)
    if not premultiplied:
        rgb = (rgb * alpha + 127) // 255
    return (rgb + (255 - alpha)).clip(0, 255).astype(np.uint8)


def as_rgb(block: np.ndarray, alpha: str | None) -> np.ndarray:
    """(h, w, 3) of a decoded block: grey (with or without alpha) repeated, RGB as it is, RGBA laid on
    white when its fourth sample is `alpha` ("premultiplied" or "straight"; None: not alpha, dropped)."""
    if block.ndim == 2:
        return np.repeat(block[..., None], 3, axis=2)
    if block.shape[2] < 3:
        return np.repeat(block[..., :1], 3, axis=2)
    if block.shape[2] == 4 and alpha is not None:
        return rgba_on_white(block, premultiplied=alpha == "premultiplied")
    return np.ascontiguousarray(block[..., :3])
