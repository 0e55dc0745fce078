"""Open slides and their tile grids once per dataset (slides are opened lazily and kept open)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

from bigslide.data.table import SlideEntry
from bigslide.errors import ConfigError, RegionError
from bigslide.grid import TileGrid
from bigslide.regions import load_regions
from bigslide.slide import Slide, open_slide


class SlideCache:
    """`mpp` (data.mpp, `--mpp`) is the pixel size given to slides whose files do not state one."""

    def __init__(self, *, mpp: float | None = None) -> None:
        if mpp is not None and not (math.isfinite(mpp) and mpp > 0):
            raise ConfigError(f"data.mpp must be a positive number of µm per pixel, got {mpp}")
        self.assumed_mpp = mpp
        self._slides: dict[Path, Slide] = {}
        self._grids: dict[tuple, TileGrid] = {}

    def open(self, path: Path) -> Slide:
        slide = self._slides.get(path)
        if slide is None:
            slide = open_slide(path)
            if slide.mpp is None and self.assumed_mpp is not None:
                slide.mpp = (self.assumed_mpp, self.assumed_mpp)
            elif slide.mpp is None:
                warnings.warn(
                    f"{path}: no pixel size (mpp) in the file; assuming 1 µm/px, so distances and heatmap "
                    "scales are in pixels (set data.mpp, or --mpp on the command line)",
                    stacklevel=2,
                )
            self._slides[path] = slide
        return slide

    def grid(self, entry: SlideEntry, tile_size: int, level: int, min_tissue: float) -> TileGrid:
        key = (entry.path, entry.regions, tile_size, level, min_tissue)
        grid = self._grids.get(key)
        if grid is None:
            regions = load_regions(entry.regions) if entry.regions else None
            slide = self.open(entry.path)
            try:
                grid = TileGrid.from_slide(
                    slide, tile_size, level=level, min_tissue=min_tissue, regions=regions
                )
            except RegionError as err:  # the message names the slide; name the regions file too
                raise RegionError(f"{entry.regions}: {err}") from None
            self._grids[key] = grid
        return grid

    def close(self) -> None:
        for slide in self._slides.values():
            slide.close()
        self._slides.clear()
