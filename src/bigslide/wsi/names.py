"""Names for the files written about slides: a slide's stem, and names unique within a cohort."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from bigslide.wsi.dicom_series import DICOM_SUFFIX

WSI_SUFFIXES = (
    *(".ome.tiff", ".ome.tif", ".svs", ".tiff", ".tif", ".ndpi"),
    *(".mrxs", ".scn", ".bif", ".vms", ".vmu"),
)
"""Names of whole-slide image files (a DICOM slide is a folder of `.dcm` files)."""
_NAMED_SUFFIXES = (*WSI_SUFFIXES, ".png", ".jpg", ".jpeg")


def is_slide_name(path: str | Path, *, images: bool = False) -> bool:
    """Whether `path` is named as a whole-slide image file (`images`: or as a PNG or JPEG image)."""
    return Path(path).name.lower().endswith(_NAMED_SUFFIXES if images else WSI_SUFFIXES)


def slide_stem(path: str | Path) -> str:
    """A slide's name for the files written about it: the file name without its slide suffix (dots in
    the name stay: DICOM files are often named by UID). A DICOM file is named with its folder,
    `case/level_0.dcm` -> `case-level_0`, because a series' files are named by level or UID."""
    path = Path(path)
    if path.suffix.lower() == DICOM_SUFFIX:
        return f"{path.parent.name}-{path.stem}"
    for suffix in _NAMED_SUFFIXES:
        if path.name.lower().endswith(suffix):
            return path.name[: -len(suffix)]
    return path.name


def output_names(paths: Iterable[str | Path]) -> dict[Path, str]:
    """A name for each slide's output files (heatmaps, tissue-check thumbnails), unique among `paths`:
    its `slide_stem`, or where stems clash (`case1/HE.svs`, `case2/HE.svs`; letter case ignored, as some
    file systems do) its stem behind as many of its folders as set it apart (`case1-HE`, `case2-HE`), then
    its whole file name, then a digest of its path; slides of one stem in one folder (`a.png`, `a.jpg`)
    by their file names."""
    unique = list(dict.fromkeys(Path(p) for p in paths))
    # a.png beside a.jpg in one folder: their file names set them apart, their folders never do
    beside = Counter((p.parent, slide_stem(p).lower()) for p in unique)
    base = {p: p.name if beside[(p.parent, slide_stem(p).lower())] > 1 else slide_stem(p) for p in unique}
    names = dict(base)
    for depth in range(1, max((len(p.parts) for p in unique), default=0) + 1):
        clashes = Counter(n.lower() for n in names.values())
        clashing = [p for p in unique if clashes[names[p].lower()] > 1]
        if not clashing:
            break
        for p in clashing:
            names[p] = "-".join([*(q.name for q in reversed(p.parents[:depth]) if q.name), base[p]])
    for last_resort in (_with_suffix, _with_digest):  # a.png beside a.jpg; A/s.svs beside a/s.svs
        clashes = Counter(n.lower() for n in names.values())
        names = {p: last_resort(p, n) if clashes[n.lower()] > 1 else n for p, n in names.items()}
    return names


def _with_suffix(path: Path, name: str) -> str:
    return name[: -len(slide_stem(path))] + path.name


def _with_digest(path: Path, name: str) -> str:
    return f"{name}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
