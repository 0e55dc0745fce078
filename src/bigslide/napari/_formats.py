"""The file names the reader takes, and those only whole-slide images have."""

NOT_TIFF = (".mrxs", ".vms", ".vmu")
"""Slide formats whose named file is no TIFF (3DHISTECH's index, Hamamatsu's VMS): read through OpenSlide."""
SUFFIXES = (".svs", ".tif", ".tiff", ".ndpi", ".ome.tif", ".ome.tiff", ".dcm", ".scn", ".bif", *NOT_TIFF)
SLIDE_ONLY_PATTERNS = tuple(
    f"*{suffix}"
    for name in ("svs", "ndpi", "dcm", "mrxs", "scn", "bif", "vms", "vmu")
    for suffix in (f".{name}", f".{name.upper()}")
)
"""Names only whole-slide images have: napari is told to open them with this reader. (TIFFs are also
other microscopy images: for those the choice stays the user's, see the user guide.)"""
