"""The file names the reader takes, and those only whole-slide images have."""

SUFFIXES = (".svs", ".tif", ".tiff", ".ndpi", ".ome.tif", ".ome.tiff", ".dcm")
SLIDE_ONLY_PATTERNS = ("*.svs", "*.SVS", "*.ndpi", "*.NDPI", "*.dcm", "*.DCM")
"""Names only whole-slide images have: napari is told to open them with this reader. (TIFFs are also
other microscopy images: for those the choice stays the user's, see the user guide.)"""
