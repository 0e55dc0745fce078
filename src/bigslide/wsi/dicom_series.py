"""DICOM whole-slide images: recognise their files, and pick the file to open for a folder.

A DICOM WSI is a series of instances, usually one file per pyramid level (plus label and overview
images), all in one folder. OpenSlide opens the whole series from any one of its files; bigslide also
accepts the folder itself and opens it through its largest DICOM whole-slide file (normally level 0),
so a folder holding one slide opens as that slide. A folder holding several series (several slides) is
an error naming a file of each, which opens its own series: keep one slide per folder, as archives such
as NCI Imaging Data Commons deliver them. Series are told apart by their SeriesInstanceUID, read with
pydicom (part of `bigslide[openslide]`; without it the folder opens the series of its largest file).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bigslide.errors import SlideError

DICOM_SUFFIX = ".dcm"
_PREAMBLE = 128  # DICOM Part 10 files start with a 128-byte preamble, then "DICM"
_MAGIC = b"DICM"
TIFF_HEADERS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
"""A TIFF file's first four bytes: classic and BigTIFF, both byte orders."""
SERIES_UID_TAG = 0x0020000E
"""(0020,000E) Series Instance UID: a file's header is read up to it (Image Type, (0008,0008), before)."""
_NAMELESS_SNIFF = 32
"""Files without a .dcm name whose first bytes are checked when a folder is tested quickly."""


def is_dicom_file(path: str | Path) -> bool:
    """Whether `path` is a DICOM Part 10 file (by its "DICM" marker, whatever its name)."""
    try:
        with Path(path).open("rb") as f:
            f.seek(_PREAMBLE)
            return f.read(4) == _MAGIC
    except OSError:
        return False


def opens_as_dicom(path: str | Path) -> bool:
    """Whether the slide at `path` is read as DICOM: a folder, a .dcm file, or a file with the DICOM
    marker that is not also a TIFF (a dual-personality DICOM-TIFF named .tif or .svs reads as the TIFF
    it also is, as OpenSlide does)."""
    path = Path(path)
    if path.is_dir() or path.suffix.lower() == DICOM_SUFFIX:
        return True
    try:
        with path.open("rb") as f:
            head = f.read(_PREAMBLE + 4)
    except OSError:
        return False
    return head[_PREAMBLE:] == _MAGIC and head[:4] not in TIFF_HEADERS


def starts_as_tiff(path: str | Path) -> bool:
    """Whether the file at `path` begins as a TIFF file does (whatever its name)."""
    try:
        with Path(path).open("rb") as f:
            return f.read(4) in TIFF_HEADERS
    except OSError:
        return False


def looks_like_dicom_folder(folder: str | Path) -> bool:
    """A quick answer (for napari and slide tables) to "is this a folder of DICOM files?": a file named
    *.dcm that is DICOM, or one among the first few other files."""
    try:
        files = _files(Path(folder))
    except SlideError:
        return False
    named = [f for f in files if f.suffix.lower() == DICOM_SUFFIX]
    others = [f for f in files if f.suffix.lower() != DICOM_SUFFIX][:_NAMELESS_SNIFF]
    return any(is_dicom_file(f) for f in [*named, *others])


def series_file(folder: str | Path, is_wsi: Callable[[Path], bool] | None = None) -> Path:
    """The file to open for the DICOM slide in `folder`: its largest DICOM file that `is_wsi` accepts
    (OpenSlide's format check; None accepts every DICOM file). Raise `SlideError` naming the folder
    when it holds none."""
    folder = Path(folder)
    dicom = [f for f in _files(folder) if is_dicom_file(f)]
    if not dicom:
        raise SlideError(
            f"{folder}: a folder without DICOM files (a slide is a file, or a folder holding one DICOM "
            "whole-slide series)"
        )
    wsi = dicom if is_wsi is None else [f for f in dicom if is_wsi(f)]
    if not wsi:
        raise SlideError(
            f"{folder}: none of its {len(dicom)} DICOM file(s) is a whole-slide image "
            "(VL Whole Slide Microscopy Image) OpenSlide can read"
        )
    largest = [max(files, key=_size_then_name) for files in _by_series(wsi)]
    if len(largest) > 1 and is_wsi is not None:
        named = ", ".join(f.name for f in sorted(largest))
        raise SlideError(
            f"{folder}: a folder holding {len(largest)} DICOM whole-slide series, so several slides; give "
            f"one of its files instead, which opens that file's series ({named}), or keep one series per "
            "folder"
        )
    return max(largest, key=_size_then_name)


def _size_then_name(file: Path) -> tuple[int, str]:
    return file.stat().st_size, file.name


def _by_series(files: list[Path]) -> list[list[Path]]:
    """`files` grouped by their SeriesInstanceUID, each group holding pyramid levels (Image Type VOLUME;
    a label or overview some scanners file in a series of its own is no slide); one group where pydicom
    is not installed."""
    try:
        from pydicom.filereader import read_partial
    except ImportError:
        return [files]
    groups: dict[str, list[Path]] = {}
    volumes: set[str] = set()
    for f in files:
        try:
            with f.open("rb") as stream:  # the header up to the series UID, not a sparse tiling's frame list
                header = read_partial(stream, stop_when=lambda tag, *_: tag > SERIES_UID_TAG)
            uid, kind = str(header.get("SeriesInstanceUID", "")), list(header.get("ImageType", []))
        except Exception:  # a file pydicom cannot parse is not told apart: OpenSlide decides
            uid, kind = "", []
        groups.setdefault(uid, []).append(f)
        if len(kind) < 3 or kind[2] == "VOLUME":
            volumes.add(uid)
    return [groups[uid] for uid in groups if uid in volumes] or list(groups.values())


def _files(folder: Path) -> list[Path]:
    try:
        return sorted(f for f in folder.iterdir() if f.is_file())
    except OSError as err:
        raise SlideError(f"{folder}: cannot list the folder ({err.strerror or err})") from None
