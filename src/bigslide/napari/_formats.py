"""The file names the reader takes, and those only whole-slide images have."""

from bigslide.wsi.dicom_series import DICOM_SUFFIX
from bigslide.wsi.names import WSI_SUFFIXES

NOT_TIFF = (".mrxs", ".vms", ".vmu")
"""Slide formats whose named file is no TIFF (3DHISTECH's index, Hamamatsu's VMS): read through OpenSlide."""
SUFFIXES = (*WSI_SUFFIXES, DICOM_SUFFIX)
SLIDE_ONLY_PATTERNS = tuple(
    f"*{suffix}"
    for name in ("svs", "ndpi", "dcm", "mrxs", "scn", "bif", "vms", "vmu")
    for suffix in (f".{name}", f".{name.upper()}")
)
"""Names only whole-slide images have: napari is told to open them with this reader. (TIFFs are also
other microscopy images: for those the choice stays the user's, see the user guide.)"""
