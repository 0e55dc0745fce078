"""The cells of a slide table read one by one: paths (relative to the table's folder, a Windows
spreadsheet's backslashes, a folder holding a DICOM series) and numbers, each error naming the row."""

from __future__ import annotations

import math
from pathlib import Path, PureWindowsPath

from bigslide.errors import DataError
from bigslide.wsi.dicom_series import looks_like_dicom_folder
from bigslide.wsi.tiff_levels import COARSEST_MPP, FINEST_MPP


def pixel_size_cell(value: str, where: str) -> float:
    """A row's mpp: µm per pixel of a scanner's level 0 (0.25 at 40x), not a magnification."""
    mpp = number_cell(value, "mpp", where)
    if not FINEST_MPP <= mpp <= COARSEST_MPP:
        raise DataError(
            f"{where}: mpp is the slide's µm per pixel ({FINEST_MPP:g} to {COARSEST_MPP:g}; 0.25 at 40x, "
            f"0.5 at 20x), got {value}"
        )
    return mpp


def check_slide_folder(slide: Path, where: str, written: str) -> None:
    """A slide that is not a file must be a folder of DICOM files (one whole-slide series); one not found
    is named with what may have been meant (`written`: the table's cell)."""
    if not slide.is_dir():
        windows = PureWindowsPath(slide.name).drive  # "C:\\slides\\a.svs", read here as one file name
        hint = f" (a Windows path, {windows}: give the slide's path on this machine)" if windows else ""
        if not hint and Path(written).expanduser().exists():
            hint = (
                f" (there is a {written} in the working folder, {Path.cwd()}: a relative path is read from "
                "the table's folder)"
            )
        raise DataError(f"{where}: slide file not found: {slide}{hint}")
    if not looks_like_dicom_folder(slide):
        raise DataError(
            f"{where}: {slide} is a folder without DICOM files (a slide is a file, or a folder holding "
            "one DICOM whole-slide series)"
        )


def number_cell(value: str, column: str, where: str) -> float:
    """A finite number from the cell of `column` (error naming the row `where`)."""
    try:
        number = float(value)
    except ValueError:
        raise DataError(f"{where}: {column} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise DataError(f"{where}: {column} must be a finite number, got {value!r}")
    return number


def resolve_path(csv_path: Path, value: str) -> Path:
    """A table's path: relative to the CSV's folder unless absolute. A table written on Windows separates
    folders with backslashes: read as / where no file has the name as written."""
    p = _as_written(csv_path, value)
    if "\\" in value and not p.exists():
        other = _as_written(csv_path, value.replace("\\", "/"))
        return other if other.exists() or not PureWindowsPath(value).drive else p
    return p


def _as_written(csv_path: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (csv_path.parent / p).resolve()


def relative_path(p: Path, base: Path) -> str:
    """`p` as a table in the folder `base` writes it: relative where it lies below that folder."""
    try:
        return str(p.resolve().relative_to(base))
    except ValueError:
        return str(p)
