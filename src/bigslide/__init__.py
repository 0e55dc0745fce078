"""bigslide: train pathology models end to end on gigapixel whole-slide images.

The core (this package) has no GUI dependency; the napari plugin lives in `bigslide.napari`.
"""

import os
from importlib import import_module
from typing import TYPE_CHECKING, Any

# Before torch is imported: its CPU allocator then asks the kernel for 2 MiB pages for tensors of 2 MiB and
# more. A bag's pixels made floats are hundreds of MB, fresh each step; mapped 4 KiB at a time they cost
# more than the conversion itself (`bigslide bench predict`'s model step took 5.3 s against 8.2 s). A
# value the user set is kept; where the kernel has no transparent huge pages nothing changes.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from bigslide.errors import BigslideError, ConfigError, DataError, RegionError, SlideError, TrainingError

if TYPE_CHECKING:
    from bigslide.tiling.grid import TileGrid
    from bigslide.tiling.pixel_classes import TissueSettings
    from bigslide.tiling.regions import Region, load_regions, save_regions
    from bigslide.tiling.tissue import tissue_mask
    from bigslide.wsi.slide import Slide, open_slide

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
    "TileGrid": "bigslide.tiling.grid",
    "Region": "bigslide.tiling.regions",
    "load_regions": "bigslide.tiling.regions",
    "save_regions": "bigslide.tiling.regions",
    "Slide": "bigslide.wsi.slide",
    "open_slide": "bigslide.wsi.slide",
    "tissue_mask": "bigslide.tiling.tissue",
    "TissueSettings": "bigslide.tiling.pixel_classes",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bigslide' has no attribute {name!r}")
