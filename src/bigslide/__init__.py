"""bigslide: train pathology models end to end on gigapixel whole-slide images.

The core (this package) has no GUI dependency; the napari plugin lives in `bigslide.napari`.
"""

from bigslide.errors import BigslideError, ConfigError, DataError, RegionError, SlideError, TrainingError
from bigslide.grid import TileGrid
from bigslide.regions import Region, load_regions, save_regions
from bigslide.slide import Slide, open_slide
from bigslide.tissue import tissue_mask

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
    "TrainingError",
    "__version__",
    "load_regions",
    "open_slide",
    "save_regions",
    "tissue_mask",
]
