"""The file names the reader takes, those only whole-slide images have, and the outline files panels load."""

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

OUTLINE_FILES = "QuPath GeoJSON or ASAP XML (*.geojson *.json *.xml)"
"""The file dialogs' filter for regions and annotations (`bigslide.tiling.regions.read_features`)."""
