"""The text of a CSV slide table: its separator, encoding and column names, as spreadsheets save it."""

from __future__ import annotations

import csv
from pathlib import Path

from bigslide.errors import DataError

SEPARATORS = {",": "commas", ";": "semicolons", "\t": "tabs"}
NUMBER_COLUMNS = ("time", "event", "target", "mpp")
KNOWN_COLUMNS = frozenset({"slide", "split", "regions", "case", "annotations", *NUMBER_COLUMNS, "label"})
"""Column names read whatever their letters' case."""
PIXEL_SIZE_COLUMNS = ("mpp", "mpp_x", "mpp-x", "µm/px", "um/px", "microns_per_pixel", "um_per_pixel")
"""Names a slide's level-0 µm per pixel goes by in tables; each is read as `mpp`."""


def read_table_text(path: Path) -> tuple[list[str], list[dict[str, str]], str]:
    """The header, the rows and the separator of a CSV slide table. A spreadsheet saves with `;` or tabs
    where a comma is the decimal mark: the header line says which (the slide column's name holds none);
    UTF-8 (with or without Excel's byte-order mark), else Windows' Western code page, as Excel saves it."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such slide table") from None
    except OSError as err:  # a folder, a file that cannot be read
        raise DataError(f"{path}: cannot be read as a slide table ({err.strerror or err})") from None
    if b"\x00" in raw[:4096]:
        workbook = (
            " (a spreadsheet workbook? save it as CSV)"
            if raw.startswith((b"PK\x03\x04", b"\xd0\xcf"))
            else ""
        )
        raise DataError(f"{path}: not a text CSV file{workbook}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:  # Excel on Windows saves CSV in the system's code page: accented paths
        text = raw.decode("cp1252", errors="replace")
    lines = text.splitlines()
    header = lines[0] if lines else ""
    separator = max(SEPARATORS, key=lambda s: (header.count(s), s == ","))
    reader = csv.DictReader(lines, delimiter=separator)
    # "Split" or "CASE" is the column a person means: read under another name, it was silently dropped
    names = {c: _column_name(c) for c in reader.fieldnames or []}
    columns = list(names.values())
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        said = ", ".join(repr(c.strip()) for c in names if names[c] in twice)
        raise DataError(f"{path}: columns {said} are one column ({', '.join(twice)}): keep one of them")
    rows = [{names[k]: (v or "").strip() for k, v in raw.items() if k is not None} for raw in reader]
    return columns, rows, separator


def _column_name(name: str) -> str:
    name = name.strip()
    if name.lower() in PIXEL_SIZE_COLUMNS:
        return "mpp"
    return name.lower() if name.lower() in KNOWN_COLUMNS else name
