"""Why a file would not open as a TIFF slide, in words a person can act on: what its error means, and
whether the installed tifffile or zarr is one tiffslide does not support."""

from __future__ import annotations


def in_words(exc: Exception) -> str:
    """Why a file would not open as a TIFF slide, without the decoder's bytes and exception names."""
    text = str(exc)
    if "not a TIFF file" in text or "not a BigTIFF" in text:
        return "it does not begin as a TIFF file does: damaged, cut short, or not a slide"
    if isinstance(exc, KeyError | IndexError) or not text:
        return "a part of its pyramid is missing or damaged"
    if "axes=" in text and "not supported" in text:
        return (
            f"its image is stored as separate planes ({text}): a fluorescence image of several channels, or "
            "RGB saved plane by plane; bigslide reads brightfield RGB with its colours interleaved"
        )
    return text


def reader_conflict() -> str:
    """'; tiffslide X needs tifffile<Y, this environment has tifffile Z' when an installed tifffile or zarr
    is outside what tiffslide declares (it then misreads every file with an error about zarr groups, which
    looks like a broken slide), else ''."""
    from importlib import metadata

    from packaging.requirements import Requirement

    try:
        declared = metadata.requires("tiffslide") or []
    except metadata.PackageNotFoundError:
        return ""
    for text in declared:
        need = Requirement(text)
        if need.name.lower() not in ("tifffile", "zarr") or need.marker is not None:
            continue
        try:
            have = metadata.version(need.name)
        except metadata.PackageNotFoundError:
            continue
        if not need.specifier.contains(have, prereleases=True):
            return (
                f"; tiffslide {metadata.version('tiffslide')} needs {need}, this environment has {need.name} "
                f"{have}: install one it supports (pip install '{need}')"
            )
    return ""
