"""napari reader for whole-slide TIFFs (svs, tif, tiff, ndpi, ome.tif, scn, bif), and through OpenSlide
3DHISTECH (mrxs), Hamamatsu VMS and DICOM (a .dcm file, or a folder of one series): a lazy multiscale RGB
layer.

`get_reader` answers quickly from the file name and the first bytes (a folder: from its file names and
the first bytes of a few files), so napari can ask it about any file or folder, and opens nothing: the
slide is opened when napari reads it (napari may ask and then choose another reader, or the person may
cancel); the layer holds one lazy
array per pyramid level (`bigslide.wsi.slide_view`): napari decodes the visible tiles of the level it needs
as it draws them, and a small coarsest level, the whole-slide view's, is decoded on a thread while napari
builds the layer; a tile that will not decode is drawn striped and named once in a notification.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bigslide.napari._formats import NOT_TIFF, SLIDE_ONLY_PATTERNS, SUFFIXES

LayerData = tuple[Any, dict[str, Any], str]
NOTHING: list[Any] = [(None,)]
"""napari's "nothing to add" sentinel: no layer, and no second error."""
ReaderFunction = Callable[[Any], list[Any]]


def get_reader(path: str | list[str]) -> ReaderFunction | None:
    """A reader function for one file with a slide's name or one folder of DICOM files, else None
    (never raises).

    A file with a slide's name that is not a slide we can open still gets a reader: it shows why in one
    line and adds no layer, instead of napari's bare "failed" and its reader dialog."""
    from bigslide.wsi.dicom_series import looks_like_dicom_folder

    if isinstance(path, list):
        if len(path) != 1:
            return None
        path = path[0]
    named = Path(path).name.lower().endswith(SUFFIXES)
    dicom_folder = Path(path).is_dir() and looks_like_dicom_folder(path)
    if not (named or dicom_folder):
        return None  # other readers may know the file or folder
    reason = None if dicom_folder else refusal(path)

    def read(_path: Any) -> list[Any]:
        from bigslide.errors import SlideError
        from bigslide.wsi.slide import open_slide

        if _select_if_open(path):
            return NOTHING
        why, slide = reason, None
        if why is None:
            try:  # parsing the TIFF directories or DICOM headers is quick and reads no pixels
                slide = open_slide(path)
            except SlideError as err:
                why = str(err).removeprefix(f"{path}: ")
        if slide is None:
            from bigslide.napari._toasts import show_error

            show_error(f"bigslide cannot open {Path(path).name}: {why}")
            return NOTHING
        from bigslide.napari._layers import slide_layer_data
        from bigslide.napari._placement import keep_current_viewer_in_place

        keep_current_viewer_in_place()  # before the layer is added: it goes beside the open slides
        prefer_this_reader()
        _say_opening(Path(path).name)

        # the slide stays open: its levels read tiles from the file while the layer lives
        return [slide_layer_data(slide)]

    return read


def _select_if_open(path: str | Path) -> bool:
    """Whether the slide at `path` is open in the viewer already; it is then selected, and said so. A
    slide is one layer: its maps, outlines and table row follow the slide's file, and a second copy
    beside it would have them drawn on either."""
    from napari import current_viewer

    from bigslide.napari._roles import slide_layers
    from bigslide.napari._toasts import show_info

    viewer = current_viewer()
    if viewer is None:
        return False
    wanted = Path(path).resolve()
    layer = next((s for s in slide_layers(viewer) if Path(s.metadata["path"]).resolve() == wanted), None)
    if layer is None:
        return False
    viewer.layers.selection.active = layer
    show_info(f"{Path(path).name} is open already (layer '{layer.name}'): selected")
    return True


def _say_opening(name: str) -> None:
    """The slide's name on napari's status bar, painted before napari makes its layer (a quarter to half a
    second on two cores for a first slide, on the GUI thread)."""
    from napari import current_viewer

    from bigslide.napari._qt import paint_now

    viewer = current_viewer()
    if viewer is not None:
        viewer.status = f"Opening {name}…"
        paint_now()


def prefer_this_reader() -> None:
    """Make bigslide napari's reader for `SLIDE_ONLY_PATTERNS` (its preference 'extension2reader', the
    setting napari's reader dialog writes when asked to remember a choice), unless the user chose another
    reader for one of them. napari then opens such files here directly, not through a choice between
    readers (napari's built-in one would open a slide in pixels, out of place beside the others)."""
    from napari.settings import get_settings

    plugins = get_settings().plugins
    chosen = dict(plugins.extension2reader)
    missing = {pattern: "bigslide" for pattern in SLIDE_ONLY_PATTERNS if pattern not in chosen}
    if missing:
        plugins.extension2reader = {**chosen, **missing}


def refusal(path: str | Path) -> str | None:
    """Why a file with a slide's name is no slide we can read (checks existence and magic bytes), or None."""
    from bigslide.wsi.dicom_series import DICOM_SUFFIX, TIFF_HEADERS, is_dicom_file

    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except IsADirectoryError:
        return "it is a folder, not a slide file"
    except OSError as err:
        return f"cannot read the file ({err.strerror or err})"
    if not head:
        return "the file is empty"
    if path.name.lower().endswith(DICOM_SUFFIX):
        return None if is_dicom_file(path) else "not a DICOM file (no DICM marker after its preamble)"
    if path.name.lower().endswith(NOT_TIFF):
        return None  # OpenSlide reads it, with the files beside it, and says why not
    if head in TIFF_HEADERS:
        return None
    return f"not a TIFF-based slide (it starts with {head!r}, not a TIFF header)"
