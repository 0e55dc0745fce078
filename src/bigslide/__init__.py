"""bigslide: train pathology models end to end on gigapixel whole-slide images.

The core (this package) has no GUI dependency; the napari plugin lives in `bigslide.napari`.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from bigslide.errors import BigslideError, ConfigError, DataError, RegionError, SlideError, TrainingError

if TYPE_CHECKING:
    from bigslide.grid import TileGrid
    from bigslide.regions import Region, load_regions, save_regions
    from bigslide.slide import Slide, open_slide
    from bigslide.tissue import TissueSettings, tissue_mask

__version__ = "0.1.0"

__all__ = [
    "BigslideError",
    "ConfigError",
    "DataError",
    "Region",
    "RegionError",
    "Slide",
    "SlideError",
    "TileGrid",
    "TissueSettings",
    "TrainingError",
    "__version__",
    "load_regions",
    "open_slide",
    "save_regions",
    "tissue_mask",
]

# Slide reading pulls in tiffslide, scikit-image and shapely: load it on first use, so the command line
# (`bigslide --help`) and the error classes import in a blink.
_LAZY = {
    "TileGrid": "bigslide.grid",
    "Region": "bigslide.regions",
    "load_regions": "bigslide.regions",
    "save_regions": "bigslide.regions",
    "Slide": "bigslide.slide",
    "open_slide": "bigslide.slide",
    "tissue_mask": "bigslide.tissue",
    "TissueSettings": "bigslide.tissue",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bigslide' has no attribute {name!r}")
