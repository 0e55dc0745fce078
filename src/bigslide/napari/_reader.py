"""napari reader for whole-slide TIFFs (svs, tif, tiff, ndpi, ome.tif): a lazy multiscale RGB layer.

`get_reader` answers quickly from the file name and the first four bytes, so napari can ask it about
any file; the layer holds one dask array per pyramid level chunked by the file's tiles, and nothing is
decoded until napari draws the visible tiles of the level it needs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

SUFFIXES = (".svs", ".tif", ".tiff", ".ndpi", ".ome.tif", ".ome.tiff")
_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both byte orders

LayerData = tuple[Any, dict[str, Any], str]
ReaderFunction = Callable[[Any], list[LayerData]]


def get_reader(path: str | list[str]) -> ReaderFunction | None:
    """The reader function when `path` is one slide file we can open, else None (never raises)."""
    if isinstance(path, list):
        if len(path) != 1:
            return None
        path = path[0]
    if not is_slide_file(path):
        return None
    from bigslide.errors import SlideError
    from bigslide.slide import open_slide

    try:  # parsing the TIFF directories is quick and reads no pixels
        slide = open_slide(path)
    except SlideError:
        return None

    def read(_path: Any) -> list[LayerData]:
        from bigslide.napari._layers import slide_layer_data

        # the slide stays open: its dask arrays read tiles from the file while the layer lives
        return [slide_layer_data(slide)]

    return read


def is_slide_file(path: str | Path) -> bool:
    """A TIFF-family file with a slide extension (checks the name and the magic bytes only)."""
    path = Path(path)
    if not path.name.lower().endswith(SUFFIXES):
        return False
    try:
        with path.open("rb") as f:
            return f.read(4) in _TIFF_MAGIC
    except OSError:
        return False
