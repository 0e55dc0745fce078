"""Open slides and their tile grids once per dataset (slides are opened lazily and kept open)."""

from __future__ import annotations

import threading
from pathlib import Path

from bigslide.data.table import SlideEntry
from bigslide.errors import RegionError
from bigslide.grid import TileGrid
from bigslide.regions import load_regions
from bigslide.resolution import check_mpp, slide_mpp
from bigslide.slide import Slide, open_slide
from bigslide.tissue import TissueSettings


def open_with_mpp(path: str | Path, fallback_mpp: float | None = None) -> Slide:
    """Open a slide to read at a physical resolution: a file that states no pixel size gets
    `fallback_mpp` (data.slide_mpp), else it is an error naming the slide."""
    slide = open_slide(path)
    if slide.mpp is None and fallback_mpp is not None:
        slide.mpp = (fallback_mpp, fallback_mpp)
    try:
        slide_mpp(slide)
    except Exception:
        slide.close()
        raise
    return slide


class SlideCache:
    """`slide_mpp` (data.slide_mpp, `--slide-mpp`) is the level-0 pixel size given to slides whose files
    state none; without it such a slide is an error naming it (it cannot be read at a physical
    resolution). Safe to use from the loader's threads."""

    def __init__(self, *, slide_mpp: float | None = None) -> None:
        check_mpp(slide_mpp, "data.slide_mpp")
        self.slide_mpp = slide_mpp
        self._slides: dict[Path, Slide] = {}
        self._grids: dict[tuple, TileGrid] = {}
        self._lock = threading.Lock()

    def open(self, path: Path) -> Slide:
        with self._lock:
            slide = self._slides.get(path)
            if slide is None:
                slide = open_with_mpp(path, self.slide_mpp)
                self._slides[path] = slide
            return slide

    def grid(
        self,
        entry: SlideEntry,
        tile_size: int,
        target_mpp: float,
        min_tissue: float,
        tissue: TissueSettings = TissueSettings(),  # noqa: B008 (frozen)
    ) -> TileGrid:
        key = (entry.path, entry.regions, tile_size, target_mpp, min_tissue, tissue)
        grid = self._grids.get(key)
        if grid is None:
            regions = load_regions(entry.regions) if entry.regions else None
            slide = self.open(entry.path)
            try:
                grid = TileGrid.from_slide(
                    slide,
                    tile_size,
                    min_tissue=min_tissue,
                    regions=regions,
                    target_mpp=target_mpp,
                    tissue=tissue,
                )
            except RegionError as err:  # the message names the slide; name the regions file too
                raise RegionError(f"{entry.regions}: {err}") from None
            self._grids[key] = grid
        return grid

    def close(self) -> None:
        with self._lock:
            for slide in self._slides.values():
                slide.close()
            self._slides.clear()
