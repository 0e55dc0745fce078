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
NOTHING: list[Any] = [(None,)]
"""napari's "nothing to add" sentinel: no layer, and no second error."""
ReaderFunction = Callable[[Any], list[Any]]


def get_reader(path: str | list[str]) -> ReaderFunction | None:
    """A reader function for one file with a slide's name, else None (never raises).

    A file with a slide's name that is not a slide we can open still gets a reader: it shows why in one
    line and adds no layer, instead of napari's bare "failed" and its reader dialog."""
    if isinstance(path, list):
        if len(path) != 1:
            return None
        path = path[0]
    if not Path(path).name.lower().endswith(SUFFIXES):
        return None
    from bigslide.errors import SlideError
    from bigslide.slide import open_slide

    reason = refusal(path)
    slide = None
    if reason is None:
        try:  # parsing the TIFF directories is quick and reads no pixels
            slide = open_slide(path)
        except SlideError as err:
            reason = str(err).removeprefix(f"{path}: ")

    def read(_path: Any) -> list[Any]:
        if slide is None:
            from napari.utils.notifications import show_error

            show_error(f"bigslide cannot open {Path(path).name}: {reason}")
            return NOTHING
        from bigslide.napari._layers import slide_layer_data

        # the slide stays open: its dask arrays read tiles from the file while the layer lives
        return [slide_layer_data(slide)]

    return read


def refusal(path: str | Path) -> str | None:
    """Why a file with a slide's name is no slide we can read (checks existence and magic bytes), or None."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except IsADirectoryError:
        return "it is a folder, not a slide file"
    except OSError as err:
        return f"cannot read the file ({err.strerror or err})"
    if head in _TIFF_MAGIC:
        return None
    if not head:
        return "the file is empty"
    return f"not a TIFF-based slide (it starts with {head!r}, not a TIFF header)"
