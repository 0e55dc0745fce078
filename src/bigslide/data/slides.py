"""Slides and their tile grids for one dataset: at most `MAX_OPEN_SLIDES` open at once, grids made once.

A cohort is thousands of slides, and an open slide holds file descriptors and its files' tile-offset
tables: the least recently used slide is closed beyond the limit (a slide being read stays open), so a
table of any length stays within the common limit of 1,024 open files. Grids and tissue masks come from
the tile cache (`bigslide.data.tile_cache`) when one is given, without opening the slide at all.

With decode workers (`workers`, the run's `DecodeProcesses`), whatever decodes a slide's pixels — its grid
with the tissue, ink and focus measures, its tissue mask, its tissue-check thumbnail — runs in a worker
process (`SlideCache.run`), on the worker's own open slides (`process_slides`), several slides at once
(`SlideCache.map`): this process only orchestrates.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bigslide.data.table import SlideEntry
from bigslide.data.tile_cache import TileCache
from bigslide.errors import RegionError, SlideError
from bigslide.files import open_files_limit
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.pixel_classes import TissueSettings
from bigslide.tiling.regions import Region, load_regions
from bigslide.tiling.tissue import TissueMask, tissue_mask
from bigslide.wsi.resolution import check_mpp, mpp_at_odds, slide_mpp
from bigslide.wsi.slide import Slide, open_slide

MAX_OPEN_SLIDES = 32
"""Slides a process keeps open (each holds one or two file descriptors, and a decode worker's copy too),
fewer under a limit of open files below 512 (`open_slides_limit`)."""


def open_slides_limit() -> int:
    """MAX_OPEN_SLIDES, or fewer where this process may open fewer than 512 files: a sixteenth of them
    (at least 2), so that two descriptors per slide leave most of the limit to everything else."""
    limit = open_files_limit()
    return MAX_OPEN_SLIDES if limit is None else max(2, min(MAX_OPEN_SLIDES, limit // 16))


T = TypeVar("T")


class Workers(Protocol):
    """Processes that run a function of a slide's pixels (`bigslide.data.processes.DecodeProcesses`)."""

    workers: int

    def call(self, fn: Callable[..., T], *args: Any, what: str) -> T: ...


def open_with_mpp(
    path: str | Path, fallback_mpp: float | None = None, table_mpp: float | None = None
) -> Slide:
    """Open a slide to read at a physical resolution: a file that states no pixel size gets `table_mpp`
    (its row's mpp in the slide table), else `fallback_mpp` (data.slide_mpp), else it is an error naming
    the slide. A file that states one is read at it, and a table's mpp at odds with it is an error: one of
    the two is wrong, and a slide read at the wrong scale shows the model tiles of another magnification."""
    slide = open_slide(path)
    try:
        if slide.mpp is None:
            given = table_mpp if table_mpp is not None else fallback_mpp
            slide.mpp = (given, given) if given is not None else None
        elif table_mpp is not None and mpp_at_odds(slide.mpp[0], table_mpp):
            raise SlideError(
                f"{path}: the slide table gives {table_mpp:g} µm/px, but the file states {slide.mpp[0]:.4g}; "
                "correct the table's mpp, or leave it empty to read the slide at its file's"
            )
        slide_mpp(slide)
    except Exception:
        slide.close()
        raise
    return slide


class SlideCache:
    """`slide_mpp` (data.slide_mpp, `--slide-mpp`) is the level-0 pixel size given to slides whose files
    state none, unless their table rows give one (`state`); without either such a slide is an error naming
    it (it cannot be read at a physical resolution). `tiles`: where grids and tissue masks are kept
    between runs (None: made by every run). `workers`: the processes that decode pixels (None: this
    process). Safe to use from the loader's threads."""

    def __init__(
        self,
        *,
        slide_mpp: float | None = None,
        tiles: TileCache | None = None,
        max_open: int | None = None,
        workers: Workers | None = None,
    ) -> None:
        check_mpp(slide_mpp, "data.slide_mpp")
        self.slide_mpp = slide_mpp
        self.tiles = tiles
        self.workers = workers
        self.max_open = open_slides_limit() if max_open is None else max_open
        self._open: OrderedDict[Path, list[Any]] = OrderedDict()  # path -> [slide, users], oldest first
        self._mpp: dict[Path, tuple[float, float] | None] = {}
        self._grids: dict[tuple, TileGrid] = {}
        self._stated: dict[Path, float] = {}  # slide table rows' µm/px (their `mpp` column), by resolved path
        self._lock = threading.Lock()

    def state(self, entries: Iterable[SlideEntry] | Mapping[Path, float | None]) -> None:
        """Read these slides at their table rows' µm/px (`SlideEntry.mpp`, where given; in a mapping, None:
        the row gives none, as a decode worker is told when a table's mpp was taken away): a slide already
        open at another is opened again when next read."""
        given = entries if isinstance(entries, Mapping) else {e.path: e.mpp for e in entries if e.mpp}
        with self._lock:
            for path, mpp in given.items():
                if mpp is None and not self._stated:  # nothing to take away (every read says so)
                    continue
                key = Path(path).resolve()
                if self._stated.get(key) == mpp:
                    continue
                if mpp is None:
                    del self._stated[key]
                else:
                    self._stated[key] = mpp
                for opened in [p for p in self._open if Path(p).resolve() == key]:
                    self._mpp.pop(opened, None)
                    if not self._open[opened][1]:
                        self._open.pop(opened)[0].close()

    def table_mpp(self, path: str | Path) -> float | None:
        """The µm/px the slide's table row gives (`state`), if any."""
        return self._stated.get(Path(path).resolve()) if self._stated else None

    def fallback(self, path: Path) -> float | None:
        """The µm/px the slide is read at if its file states none: its row's, else `slide_mpp`."""
        given = self.table_mpp(path)
        return self.slide_mpp if given is None else given

    @contextmanager
    def opened(self, path: Path) -> Iterator[Slide]:
        """The open slide at `path`, kept open while the block runs."""
        path = Path(path)
        with self._lock:
            held = self._open.pop(path, None)
            if held is None:
                held = [open_with_mpp(path, self.slide_mpp, self.table_mpp(path)), 0]
                self._mpp[path] = held[0].mpp
            held[1] += 1
            self._open[path] = held  # the most recently used goes last
            self._close_unused()
        try:
            yield held[0]
        finally:
            with self._lock:
                held[1] -= 1
                self._close_unused()

    def mpp(self, path: Path) -> tuple[float, float] | None:
        """The slide's level-0 (x, y) µm/px as it is read (the file's, else `slide_mpp`)."""
        path = Path(path)
        if path not in self._mpp:
            with self.opened(path):
                pass
        return self._mpp[path]

    def open_count(self) -> int:
        return len(self._open)

    def run(self, fn: Callable[..., T], *args: Any, what: str) -> T:
        """`fn(slides, *args)`: in a decode worker on its own slides (read as these are) when there are
        workers, else here with `slides` this cache. `what` names the work in the error when workers die
        on it."""
        if self.workers is None:
            return fn(self, *args)
        folder = self.tiles.folder if self.tiles is not None else None
        stated = self._stated_for(args)
        return self.workers.call(_with_process_slides, fn, self.slide_mpp, stated, folder, args, what=what)

    def _stated_for(self, args: tuple[Any, ...]) -> dict[Path, float | None]:
        """The table rows' µm/px a worker needs for `args`: of the slides they name (paths, entries,
        predictions; None where the table gives none, since a worker outlives a table), else all of them."""
        named = {Path(a) for a in args if isinstance(a, (str, Path))}
        named |= {Path(a.path) for a in args if isinstance(a, SlideEntry)}
        named |= {Path(a.slide) for a in args if isinstance(getattr(a, "slide", None), (str, Path))}
        if not named:
            return dict(self._stated)
        return {p: self.table_mpp(p) for p in named}

    def map(
        self, fn: Callable[..., T], items: Sequence[tuple[Any, ...]], what: Callable[[tuple[Any, ...]], str]
    ) -> list[T | Exception]:
        """`run(fn, *item)` for every item, on every worker at once (in order here without workers): each
        result, or the error it raised."""

        def one(item: tuple[Any, ...]) -> T | Exception:
            try:
                return self.run(fn, *item, what=what(item))
            except Exception as err:  # the caller decides: skip the slide, report it, or raise
                return err

        if self.workers is None or len(items) < 2:
            return [one(item) for item in items]
        with ThreadPoolExecutor(
            min(len(items), self.workers.workers), thread_name_prefix="bigslide-tile"
        ) as ex:
            return list(ex.map(one, items))

    def grid(
        self,
        entry: SlideEntry,
        tile_size: int,
        target_mpp: float,
        min_tissue: float,
        tissue: TissueSettings = TissueSettings(),
    ) -> TileGrid:
        grid = self.grids([entry], tile_size, target_mpp, min_tissue, tissue)[0]
        if isinstance(grid, Exception):
            raise grid
        return grid

    def grids(
        self,
        entries: Sequence[SlideEntry],
        tile_size: int,
        target_mpp: float,
        min_tissue: float,
        tissue: TissueSettings = TissueSettings(),
    ) -> list[TileGrid | Exception]:
        """Each slide's tile grid (or the error that stopped it), made once per cache, on every worker at
        once when there are workers."""
        # Every argument of the grid builder goes through `settings`: the tile cache's key is made of it.
        settings = {
            "tile_size": tile_size,
            "target_mpp": target_mpp,
            "min_tissue": min_tissue,
            "tissue": tissue,
        }
        self.state(entries)
        keys = [
            (entry.path, entry.regions, self.table_mpp(entry.path), *settings.items()) for entry in entries
        ]
        todo = {key: entry for entry, key in zip(entries, keys) if key not in self._grids}
        if self.tiles is not None and self.workers is not None:  # kept grids are read here: no pixel
            for key, entry in list(todo.items()):
                kept = self.tiles.kept_grid(
                    Path(entry.path), entry.regions, settings, self.fallback(entry.path)
                )
                if kept is not None:
                    self._mpp.setdefault(Path(entry.path), kept.slide_mpp)
                    self._grids[key] = kept
                    del todo[key]
        made = self.map(_tiled, [(entry, settings) for entry in todo.values()], _tiling_what)
        errors: dict[tuple, Exception] = {}
        for (key, entry), result in zip(todo.items(), made):
            if isinstance(result, Exception):
                errors[key] = result
                continue
            grid, _hit = result  # a miss here (counted above), unless a worker found one kept meanwhile
            self._mpp.setdefault(Path(entry.path), grid.slide_mpp)
            self._grids[key] = grid
        return [errors.get(key) or self._grids[key] for key in keys]

    def tiled(self, entry: SlideEntry, settings: dict[str, Any]) -> tuple[TileGrid, bool]:
        """The slide's grid with `TileGrid.from_slide` arguments `settings`, from the tile cache or made
        here now; and whether it came from the cache."""
        if self.tiles is None:
            return self._build_grid(entry, settings), False
        path = Path(entry.path)
        hits = self.tiles.hits
        build = lambda: self._build_grid(entry, settings)  # noqa: E731
        grid = self.tiles.grid(path, entry.regions, settings, self.fallback(path), build)
        return grid, self.tiles.hits > hits

    def _build_grid(self, entry: SlideEntry, settings: dict[str, Any]) -> TileGrid:
        regions = load_regions(entry.regions) if entry.regions else None
        with self.opened(entry.path) as slide:
            try:
                return TileGrid.from_slide(slide, regions=regions, **settings)
            except RegionError as err:  # the message names the slide; name the regions file too
                raise RegionError(f"{entry.regions}: {err}") from None

    def tissue_mask(
        self,
        path: Path,
        tissue: TissueSettings = TissueSettings(),
    ) -> TissueMask:
        """`tissue_mask` of the slide, from the tile cache when there is one (made in a worker when there
        are workers)."""
        return self.run(
            _masked, Path(path), tissue, what=f"{path}: a decode worker process died while finding its tissue"
        )

    def masked(self, path: Path, tissue: TissueSettings) -> TissueMask:
        """`tissue_mask` of the slide, from the tile cache or made here now."""

        def build() -> TissueMask:
            with self.opened(path) as slide:
                return tissue_mask(slide, settings=tissue)

        return (
            build() if self.tiles is None else self.tiles.mask(Path(path), tissue, self.fallback(path), build)
        )

    def close(self) -> None:
        with self._lock:
            for slide, _users in self._open.values():
                slide.close()
            self._open.clear()

    def _close_unused(self) -> None:
        """Close the least recently used slides nobody reads until at most `max_open` are open."""
        excess = len(self._open) - self.max_open
        for path in [p for p, (_slide, users) in self._open.items() if not users][: max(0, excess)]:
            self._open.pop(path)[0].close()


_PROCESS_SLIDES: dict[tuple[float | None, Path | None], SlideCache] = {}


def process_slides(slide_mpp: float | None, tiles: Path | None = None) -> SlideCache:
    """This process's own slides read with the fallback µm/px `slide_mpp`, grids kept in the tile cache
    folder `tiles` (None: none): made on first use and kept for the process's life (a decode worker's)."""
    key = (slide_mpp, tiles)
    slides = _PROCESS_SLIDES.get(key)
    if slides is None:
        slides = _PROCESS_SLIDES[key] = SlideCache(
            slide_mpp=slide_mpp, tiles=TileCache(tiles) if tiles else None
        )
    return slides


def _with_process_slides(
    fn: Callable[..., T],
    slide_mpp: float | None,
    stated: dict[Path, float | None],
    tiles: Path | None,
    args: tuple[Any, ...],
) -> T:
    slides = process_slides(slide_mpp, tiles)
    slides.state(stated)
    return fn(slides, *args)


def tile_slide(
    slides: SlideCache,
    path: Path,
    tile_size: int,
    target_mpp: float,
    min_tissue: float,
    regions: Sequence[Region] | None,
    tissue: TissueSettings,
) -> TileGrid:
    """The slide's grid sampled from `regions` as they are now (e.g. being drawn; none kept in the tile
    cache) with the `tissue` settings, for `SlideCache.run`: in a decode worker when the slides have them."""
    with slides.opened(path) as slide:
        return TileGrid.from_slide(
            slide,
            tile_size,
            target_mpp=target_mpp,
            min_tissue=min_tissue,
            regions=regions,
            tissue=tissue,
        )


def _tiled(slides: SlideCache, entry: SlideEntry, settings: dict[str, Any]) -> tuple[TileGrid, bool]:
    return slides.tiled(entry, settings)


def _masked(slides: SlideCache, path: Path, tissue: TissueSettings) -> TissueMask:
    return slides.masked(path, tissue)


def _tiling_what(item: tuple[Any, ...]) -> str:
    return f"{item[0].path}: a decode worker process died while tiling it"
