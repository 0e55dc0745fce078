"""Decode one file tile of a tiled TIFF page straight from the file (`os.pread`), as RGB or as luma.

Not through zarr, whose single event-loop thread would serialise the loader's threads. Luma (the focus
measure's greyscale) comes from a JPEG tile's decoder itself: for the YCbCr JPEG most scanners write it is
the first plane, and the colour planes are never decoded (less than half the time of RGB and a product).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

LUMA = np.array([0.299, 0.587, 0.114], np.float32)
"""ITU-R 601 luma weights (PIL's "L" mode; JPEG's Y): greyscale as a matrix product, three times faster on
uint8 RGB than channel by channel."""


def decode(page: Any, fd: int, index: int) -> np.ndarray:
    """File tile `index` of a tifffile `page` as tifffile decodes it (samples last; whole, not cropped)."""
    data = os.pread(fd, page.databytecounts[index], page.dataoffsets[index])
    return np.asarray(page.decode(data, index, jpegtables=page.jpegtables)[0][0])


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
