"""What the TIFF behind a tiffslide handle holds: its levels as arrays, the pages whose tiles are those
arrays' chunks, whether every tile lies inside the file, and the pixel size it states."""

from __future__ import annotations

import itertools
import logging
import math
import re
import struct
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import numpy as np

from bigslide.errors import SlideError
from bigslide.wsi.tiff_tiles import APERIO_J2K_YCBCR, ycbcr_left

GLASS = 255
"""What a file tile without data is read as: empty glass, white."""
COARSEST_MPP = 10.0
"""A stated pixel size coarser than this many µm (2,540 dpi) is not a microscope's."""
FINEST_MPP = 0.01
"""Nor is one finer than this many µm (10 nm, a twentieth of light's resolution limit): a unit mixed up
or a garbage tag, that read as stated made every tile cover a speck of tissue (or none fit the slide)."""


def _without_series_fallbacks(record: logging.LogRecord) -> bool:
    """tifffile logs each series layout it tries and fails on a damaged file ("shaped series raised
    TiffFileError…") before the `SlideError` that names the file and what is wrong: noise before it."""
    return " series raised " not in record.getMessage()


logging.getLogger("tifffile").addFilter(_without_series_fallbacks)


def level_arrays(path: Path, handle: Any) -> list[Any]:
    axes = handle.properties["tiffslide.series-axes"]
    if hasattr(handle, "levels"):  # OpenSlide: array-like levels
        return list(handle.levels)
    group = handle.zarr_group
    arrays = [group[str(level)] for level in range(handle.level_count)]
    for array in arrays:
        if array.dtype != np.uint8:
            raise SlideError(f"{path}: pixels are {array.dtype}, only 8-bit RGB slides are supported")
        if axes == "YXS" and array.shape[2] not in (3, 4):
            raise SlideError(f"{path}: {array.shape[2]} samples per pixel, expected RGB(A)")
    if axes not in ("YXS", "YX"):
        raise SlideError(f"{path}: image axes {axes!r} are not supported (expected RGB)")
    check_colours(path, handle)
    sides = [(int(a.shape[1]), int(a.shape[0])) for a in arrays]
    if any(w1 > w0 or h1 > h0 for (w0, h0), (w1, h1) in itertools.pairwise(sides)):
        # every reader of the levels takes a finer level for a lower number (napari's multiscale too)
        said = ", ".join(f"{w} x {h}" for w, h in sides)
        raise SlideError(
            f"{path}: its pyramid levels are not in size order ({said} px); save it again with its "
            "levels largest first (bfconvert, or QuPath's File > Export images > OME TIFF)"
        )
    return arrays


COLOURS_READ = {1: "grey", 2: "RGB", 6: "YCbCr"}
"""TIFF photometric interpretations whose samples are read as the colours they are: grey (black is 0),
RGB, and JPEG's YCbCr, which the decoder turns to RGB."""
COLOURS_REFUSED = {0: "greyscale with 0 as white (MinIsWhite)", 3: "palette (indexed colour)", 5: "CMYK"}


def check_colours(path: Path, handle: Any) -> None:
    """Raise when the samples of the file's pixels are not grey or RGB colours: a palette image's are
    indices into its colour map, MinIsWhite's grey runs backwards, CMYK's are inks, and a multichannel
    image's channels are no colours at all. Read as RGB, each gave a slide of the wrong colours without a
    word (a palette image passed for greyscale, the tissue of a MinIsWhite one for glass)."""
    levels = pyramid_levels(handle)
    if not levels:  # OpenSlide and plain images give RGB themselves
        return
    page = levels[0].keyframe
    photometric, samples = int(page.photometric), int(page.samplesperpixel)
    if photometric not in COLOURS_READ:
        said = COLOURS_REFUSED.get(photometric, f"photometric interpretation {photometric}")
        raise SlideError(
            f"{path}: its pixels are {said}, not grey or RGB; save the slide as RGB (or greyscale) first"
        )
    # grey and alpha is two samples; three flagged grey are read as RGB, as tiffslide reads them (writers
    # mislabel RGB so); more are channels, whose first three are no red, green and blue
    if photometric == 1 and samples > 3:
        raise SlideError(
            f"{path}: an image of {samples} channels (a fluorescence or multispectral image?), not grey or "
            "RGB; bigslide reads brightfield RGB slides"
        )


def pyramid_levels(handle: Any) -> list[Any] | None:
    """The tifffile pyramid levels (`TiffPageSeries`) of the series tiffslide reads; None for a handle of
    another reader (OpenSlide, a plain image) or a layout tifffile cannot give them for."""
    try:
        return list(handle.ts_tifffile.series[handle.properties["tiffslide.series-index"]].levels)
    except Exception:
        return None


def tiled_pages(handle: Any, arrays: list[Any]) -> list[Any]:
    """Per level, the tifffile page whose tiles are the zarr chunks (None where they are not)."""
    pages: list[Any] = []
    levels = pyramid_levels(handle)
    if levels is None:  # an unusual layout: read through zarr
        return [None] * len(arrays)
    for level, array in enumerate(arrays):
        page = levels[level].keyframe if level < len(levels) else None
        ok = (
            page is not None
            and len(levels[level].pages) == 1
            and page.is_tiled
            and (page.tilelength, page.tilewidth) == tuple(array.chunks[:2])
            and (page.imagelength, page.imagewidth) == tuple(array.shape[:2])
        )
        pages.append(page if ok else None)
    return pages


def empty_tiles(handle: Any, arrays: list[Any]) -> list[np.ndarray | None]:
    """Per level, which file tiles hold no data, as a (rows, cols) bool grid of its array's chunks; None
    where every tile has data or its tiles are not those chunks. A tile of byte count 0 is a sparse TIFF's
    "nothing scanned here" (libvips, tifffile and some scanners write them): tifffile reads it as zeros,
    black that the tissue rule takes for ink or tissue, where OpenSlide reads it as glass."""
    out: list[np.ndarray | None] = [None] * len(arrays)
    for level, pyramid_level in enumerate((pyramid_levels(handle) or [])[: len(arrays)]):
        page = pyramid_level.keyframe
        chunk_rows, chunk_cols = arrays[level].chunks[:2]
        grid = (-(-arrays[level].shape[0] // chunk_rows), -(-arrays[level].shape[1] // chunk_cols))
        counts = np.asarray(page.databytecounts)
        # one page of interleaved samples whose tiles (or strips) are the chunks: tile i is chunk i
        if len(pyramid_level.pages) != 1 or counts.size != grid[0] * grid[1] or counts.all():
            continue
        out[level] = (counts == 0).reshape(grid)
    return out


def glass_over_empty(
    block: np.ndarray, empty: np.ndarray, tile_shape: tuple[int, int], y0: int, x0: int
) -> np.ndarray:
    """`block` (rows from `y0`, columns from `x0` of a level whose file tiles are `tile_shape` and
    `empty` says which hold no data, `empty_tiles`) with those tiles' parts set to glass, as OpenSlide
    reads them (zarr fills them with black)."""
    th, tw = tile_shape
    r0, c0 = y0 // th, x0 // tw
    hits = np.argwhere(empty[r0 : -(-(y0 + block.shape[0]) // th), c0 : -(-(x0 + block.shape[1]) // tw)])
    if not len(hits):
        return block
    block = block if block.flags.writeable else block.copy()
    for row, col in hits + np.array([r0, c0]):
        top, left = max(row * th - y0, 0), max(col * tw - x0, 0)
        block[top : (row + 1) * th - y0, left : (col + 1) * tw - x0] = GLASS
    return block


def ycbcr_levels(path: Path, handle: Any, count: int) -> list[bool]:
    """Per level, whether its tiles are JPEG 2000 in YCbCr (33003) that OpenJPEG leaves unconverted
    (`tiff_tiles.ycbcr_left`), judged on the level's first tile: what zarr reads of it is then converted."""
    out = [False] * count
    pages = [level.keyframe for level in (pyramid_levels(handle) or [])[:count]]  # none: OpenSlide converts
    for level, page in enumerate(pages):
        first = next(((o, n) for o, n in zip(page.dataoffsets, page.databytecounts) if n), None)
        if page.compression == APERIO_J2K_YCBCR and first is not None:
            with path.open("rb") as f:
                f.seek(first[0])
                out[level] = ycbcr_left(f.read(min(first[1], 64)))
    return out


def alpha_of(handle: Any) -> str | None:
    """How a TIFF's fourth sample is alpha: "premultiplied" (associated), "straight" (unassociated), or
    None (no alpha, or not a TIFF read by tiffslide)."""
    levels = pyramid_levels(handle)  # none: OpenSlide lays its RGBA on white itself
    extra = tuple(levels[0].keyframe.extrasamples) if levels else ()
    return {1: "premultiplied", 2: "straight"}.get(int(extra[0])) if extra else None


def check_complete(path: Path, handle: Any) -> None:
    """Raise when tile data of a level, or the next page (image file directory) after the last one read,
    lies past the end of the file (a truncated copy: the pages lost are often the pyramid's levels)."""
    size = path.stat().st_size
    tif = handle.ts_tifffile
    if not len(tif.pages):
        raise SlideError(
            f"{path}: it begins as a TIFF file but holds no image (damaged, or its writing never finished)"
        )
    following = _next_page_offset(tif)
    if following >= size:
        raise SlideError(
            f"{path}: the file is cut short: its page {len(tif.pages) + 1} would begin at byte {following} "
            f"but the file has {size} bytes (truncated file: copy or download it again)"
        )
    series = tif.series[handle.properties["tiffslide.series-index"]]
    for level, pyramid_level in enumerate(series.levels):
        for page in pyramid_level.pages:
            ends = [o + c for o, c in zip(page.dataoffsets, page.databytecounts) if c]
            if not ends and getattr(page, "shape", None):
                raise SlideError(f"{path}: level {level} has no image data (truncated file?)")
            if ends and max(ends) > size:
                raise SlideError(
                    f"{path}: level {level} data ends at byte {max(ends)} but the file has {size} bytes "
                    "(truncated file)"
                )


def _next_page_offset(tif: Any) -> int:
    """Where the file's last page says the next one begins (0: it is the last)."""
    pages = tif.pages
    last = pages[len(pages) - 1]
    form, fh = tif.tiff, tif.filehandle
    fh.seek(last.offset)
    (tags,) = struct.unpack(form.tagnoformat, fh.read(form.tagnosize))
    fh.seek(last.offset + form.tagnosize + tags * form.tagsize)
    return int(struct.unpack(form.offsetformat, fh.read(form.offsetsize))[0])


LARGER_IMAGE = 4
"""Another image of the file with this many times the pixels of the one read is the slide itself."""
FINER_SCENE, ASPECT_TOLERANCE = 1.5, 0.02
"""So is one of the same shape (width / height within 2 %) with 1.5 times the pixels: a finer level."""


def check_main_image(path: Path, handle: Any) -> None:
    """Raise when the image tiffslide reads (a generic or OME-TIFF's first) is much smaller than another
    image of the file: a converter that wrote the macro or label photograph first (bfconvert of some
    scanners' files) would have it read as the slide. Scanners' own formats (an SVS, whose macro may
    outsize a small region's scan) choose their image themselves."""
    if handle.properties.get("tiffslide.vendor") is not None:
        return
    try:
        series = list(handle.ts_tifffile.series)
        read = series[handle.properties["tiffslide.series-index"]]
    except Exception:  # a layout without tifffile series: nothing to compare
        return

    def area(s: Any) -> int:
        height, width = _height_width(s)
        return height * width

    def said(s: Any) -> str:
        height, width = _height_width(s)
        return f"{width} x {height} px" + (f" {s.name!r}" if getattr(s, "name", "") else "")

    def aspect(s: Any) -> float:
        height, width = _height_width(s)
        return width / max(height, 1)

    largest = max(series, key=area)
    # the same scene scanned finer (a pyramid written coarse level first) outsizes it by less than a
    # macro photograph need: a level one step finer is 2-4x the pixels
    same_scene = abs(aspect(largest) - aspect(read)) <= ASPECT_TOLERANCE * aspect(read)
    if area(largest) > (FINER_SCENE if same_scene else LARGER_IMAGE) * area(read):
        what = (
            "at a coarser resolution (its levels written coarse first?)"
            if same_scene
            else ("as its smaller picture (a macro or label photograph?)")
        )
        raise SlideError(
            f"{path}: its first image ({said(read)}) is not its largest ({said(largest)}, image "
            f"{series.index(largest)} of {len(series)}); bigslide reads a TIFF's first image, so this file "
            f"would be read {what}. Save the slide on its own, largest level first (bfconvert -series N, "
            "or QuPath's File > Export images > OME TIFF)"
        )


def _height_width(series: Any) -> tuple[int, int]:
    """A tifffile series' rows and columns, whatever its other axes (samples, channels, planes)."""
    sizes = dict(zip(series.axes, series.shape, strict=False))
    return int(sizes.get("Y", 0)), int(sizes.get("X", 0))


def parse_mpp(properties: dict[str, Any]) -> tuple[float, float] | None:
    """Level-0 (x, y) µm per pixel the file states: tiffslide's reading (Aperio's MPP, the TIFF
    resolution tags), else an OME-TIFF's PhysicalSizeX/Y, which tiffslide leaves unread (Bio-Formats'
    and QuPath's exports state it there only), else an ImageJ / Fiji TIFF's resolution in its own `unit`
    (the tags' unit then says none). None when neither states one, or when it is coarser than
    COARSEST_MPP: an image editor's print resolution (72 dpi is 353 µm per pixel), not a scanner's, or
    finer than FINEST_MPP."""
    mpp_x, mpp_y = _positive(properties.get("tiffslide.mpp-x")), _positive(properties.get("tiffslide.mpp-y"))
    if mpp_x is None and mpp_y is None:
        mpp_x, mpp_y = _ome_mpp(
            properties.get("tiff.ImageDescription"), properties.get("tiffslide.series-index")
        )
    if mpp_x is None and mpp_y is None:
        mpp_x = mpp_y = _aperio_decimal_comma(properties.get("tiff.ImageDescription"))
    if mpp_x is None and mpp_y is None:
        mpp_x, mpp_y = _imagej_mpp(properties)
    if mpp_x is None and mpp_y is None:
        return None
    mpp = (mpp_x or mpp_y or 0.0, mpp_y or mpp_x or 0.0)
    return mpp if max(mpp) <= COARSEST_MPP and min(mpp) >= FINEST_MPP else None


OME_UM = {
    "m": 1e6,
    "dm": 1e5,
    "cm": 1e4,
    "mm": 1e3,
    "in": 25400.0,
    "µm": 1.0,
    "μm": 1.0,
    "um": 1.0,
    "nm": 1e-3,
    "pm": 1e-6,
    "Å": 1e-4,
}
"""OME's length units (UnitsLength) in µm: those a pixel size is stated in."""


def _ome_mpp(description: Any, series: Any) -> tuple[float | None, float | None]:
    """PhysicalSizeX/Y in µm of the OME image behind tiffslide's series (its Image of the same index)."""
    if not isinstance(description, str) or "<OME" not in description[:1000]:
        return None, None
    try:
        root = ElementTree.fromstring(description)
    except ElementTree.ParseError:
        return None, None
    images = [e for e in root if e.tag.rsplit("}", 1)[-1] == "Image"]
    if not images:
        return None, None
    index = series if isinstance(series, int) and 0 <= series < len(images) else 0
    pixels = next((e for e in images[index] if e.tag.rsplit("}", 1)[-1] == "Pixels"), None)
    if pixels is None:
        return None, None

    def size(axis: str) -> float | None:
        number = _positive(pixels.get(f"PhysicalSize{axis}"))
        scale = OME_UM.get(pixels.get(f"PhysicalSize{axis}Unit", "µm"))
        return number * scale if number is not None and scale is not None else None

    return size("X"), size("Y")


IMAGEJ_UM = {
    "micron": 1.0,
    "um": 1.0,
    "µm": 1.0,
    "μm": 1.0,
    "\\u00B5m": 1.0,
    "nm": 1e-3,
    "mm": 1e3,
    "cm": 1e4,
}
"""ImageJ's `unit=` names (as its TIFFs write them) in µm."""


def _imagej_mpp(properties: dict[str, Any]) -> tuple[float | None, float | None]:
    """µm per pixel of an ImageJ TIFF: its X/YResolution are pixels per its description's `unit`."""
    description = properties.get("tiff.ImageDescription")
    if not isinstance(description, str) or not description.startswith("ImageJ="):
        return None, None
    found = re.search(r"^unit=(.+)$", description, re.MULTILINE)
    scale = IMAGEJ_UM.get(found.group(1).strip()) if found else None
    if scale is None:
        return None, None
    per_unit = [_positive(properties.get(f"tiff.{axis}Resolution")) for axis in "XY"]
    x, y = (scale / p if p is not None else None for p in per_unit)
    return x, y


def _aperio_decimal_comma(description: Any) -> float | None:
    """Aperio's `MPP = 0,2500`, written where a comma is the decimal mark (tiffslide reads only a point)."""
    if not isinstance(description, str) or not description.startswith("Aperio"):
        return None
    found = re.search(r"\|\s*MPP\s*=\s*(\d+,\d+)\s*(\||$)", description)
    return _positive(found.group(1).replace(",", ".")) if found else None


def _positive(raw: Any) -> float | None:
    try:
        number = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None
    return number if number and math.isfinite(number) and number > 0 else None
