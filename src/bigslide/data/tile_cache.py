"""Tile once: tissue masks and tile grids kept on disk per slide, so later runs start at once.

A cohort of thousands of slides spends minutes finding tissue and laying grids before its first step;
the result depends only on the slide file and the tiling settings. Each entry is an `.npz` file in the
cache folder (`data.tile_cache`; "auto": `.tiles` in the folder that holds the run folder, so the runs,
cross-validation folds and predictions made there share it), written atomically, named by a digest of

- the slide's absolute path, and the content of its regions file if it has one (napari writes the
  regions anew into each run's folder);
- every argument the grid builder is called with (`settings`: whatever `SlideCache` passes to
  `TileGrid.from_slide` goes through it, so a new tiling setting changes the key by construction), and
  the level-0 pixel size given to slides whose files state none;
- `TILING_VERSION` and the source of the modules that tile (`TILING_MODULES`): new code tiles anew.

Inside, beside the grid or mask, is the identity of the files it was made from: size and modification
time (ns) of the slide file (of each file of a slide that is a folder, and of an MRXS slide's data
folder). An entry whose slide changed since is made again and replaced. The
cache is a convenience: an entry that does not read is made again, and a folder that cannot be written
is warned about once and the run goes on without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.files import atomic_path
from bigslide.tiling.grid import TILING_VERSION, TileGrid
from bigslide.tiling.pixel_classes import TissueSettings
from bigslide.tiling.tissue import TissueMask
from bigslide.wsi.names import slide_stem

TILING_MODULES = (
    "bigslide.tiling.grid",
    "bigslide.tiling.tissue",
    "bigslide.tiling.tissue_measure",
    "bigslide.tiling.pixel_classes",
    "bigslide.tiling.ink",
    "bigslide.tiling.films",
    "bigslide.tiling.blur",
    "bigslide.tiling.cell_check",
    "bigslide.wsi.resolution",
    "bigslide.tiling.regions",
    "bigslide.tiling.asap_xml",
    "bigslide.wsi.slide",
    "bigslide.wsi.slide_view",
    "bigslide.wsi.tiff_levels",
    "bigslide.wsi.tiff_tiles",
    "bigslide.wsi.unreadable",
    "bigslide.wsi.openslide_backend",
    "bigslide.wsi.dicom_series",
    "bigslide.wsi.plain_image",
)
"""Modules whose code decides a slide's tissue mask and grid: a change in any of them tiles anew."""

FOLDER_NAME = ".tiles"


def tile_cache_for(setting: str | None, run_folder: str | Path) -> TileCache | None:
    """The cache `data.tile_cache` names for a run writing into `run_folder`: "auto" is `.tiles` in the
    folder holding `run_folder`; "none" (or empty) is no cache; anything else is the folder to use."""
    if setting is None or setting.strip().lower() in ("", "none"):
        return None
    if setting == "auto":
        return TileCache(Path(run_folder).resolve().parent / FOLDER_NAME)
    return TileCache(Path(setting).expanduser())


class TileCache:
    """Tissue masks and tile grids of slides, kept in `folder` (made when first written to)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.hits = 0
        self.misses = 0
        self._warned = False

    def __repr__(self) -> str:
        return f"TileCache({str(self.folder)!r})"

    def grid(
        self,
        slide: Path,
        regions: Path | None,
        settings: dict[str, Any],
        slide_mpp: float | None,
        build: Callable[[], TileGrid],
    ) -> TileGrid:
        """The grid `build()` makes of `slide` with these builder `settings`: from the cache when an entry
        made from the same files is there, else built now and kept."""
        grid = self.kept_grid(slide, regions, settings, slide_mpp)
        if grid is None:
            grid = build()
            path = self._entry("grid", slide, regions, {"settings": settings, "slide_mpp": slide_mpp})
            self._write(path, files_identity(slide), **grid.arrays())
            grid.slide_path = str(slide)
        return grid

    def kept_grid(
        self, slide: Path, regions: Path | None, settings: dict[str, Any], slide_mpp: float | None
    ) -> TileGrid | None:
        """The grid kept for `slide` with these builder `settings` (None when there is none, or the slide
        changed since); counted as a hit or a miss. Reads no pixel."""
        path = self._entry("grid", slide, regions, {"settings": settings, "slide_mpp": slide_mpp})
        grid = self._read(path, files_identity(slide), lambda: TileGrid.load(path))
        if grid is not None:
            grid.slide_path = str(slide)  # as this run names it
        return grid

    def mask(
        self, slide: Path, tissue: TissueSettings, slide_mpp: float | None, build: Callable[[], TissueMask]
    ) -> TissueMask:
        """The slide's tissue mask (`tissue_mask` with these `tissue` settings), from the cache or made now
        and kept."""
        path = self._entry("mask", slide, None, {"tissue": tissue, "slide_mpp": slide_mpp})
        identity = files_identity(slide)
        mask = self._read(path, identity, lambda: _load_mask(path))
        if mask is None:
            mask = build()
            shape = np.array(mask.mask.shape, np.int64)
            bits = np.packbits(mask.mask, axis=None)
            self._write(path, identity, bits=bits, shape=shape, downsample=np.float64(mask.downsample))
        return mask

    def file(
        self, kind: str, suffix: str, slide: Path, key: dict[str, Any], make: Callable[[Path], None]
    ) -> Path | None:
        """A file made from `slide` (e.g. the tissue check's thumbnail, `suffix` ".png"), kept in the cache
        under `kind` and `key` with the identity of the slide's files: its path, made by `make(path)` first
        when absent; None where the cache cannot be written."""
        path = self._entry(kind, slide, None, {**key, "files": files_identity(slide)}, suffix)
        if path.is_file():
            return path
        try:
            with atomic_path(path) as tmp:
                make(tmp)
        except OSError as err:
            self._warn(err)
            return None
        return path

    # -- entries ----------------------------------------------------------------------------------
    def _entry(
        self, kind: str, slide: Path, regions: Path | None, key: dict[str, Any], suffix: str = ".npz"
    ) -> Path:
        described = {
            "kind": kind,
            "slide": str(Path(slide).resolve()),
            "regions": _content_digest(regions) if regions else None,
            "key": key,
            "version": TILING_VERSION,
            "code": code_digest(),
        }
        digest = hashlib.sha256(json.dumps(described, sort_keys=True, default=_plain).encode()).hexdigest()
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", slide_stem(slide))[:48]
        return self.folder / f"{stem}-{digest[:24]}.{kind}{suffix}"

    def _read(self, path: Path, identity: list[Any], load: Callable[[], Any]) -> Any:
        try:
            with np.load(path, allow_pickle=False) as data:
                stored = json.loads(str(data["identity"]))
            found = load() if stored == identity else None
        except Exception:  # absent, partial or foreign (numpy, zlib and the grid's own errors): made anew
            found = None
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def _write(self, path: Path, identity: list[Any], **arrays: Any) -> None:
        try:
            with atomic_path(path) as tmp:
                np.savez_compressed(tmp, identity=np.array(json.dumps(identity)), **arrays)
        except OSError as err:
            self._warn(err)

    def _warn(self, err: OSError) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.folder}: cannot keep tile grids there ({err.strerror or err}); every run tiles "
                "its slides anew (set data.tile_cache to a writable folder, or none)",
                RuntimeWarning,
                stacklevel=5,
            )


def files_identity(slide: Path) -> list[Any]:
    """Size and modification time (ns) of every file the slide is read from."""
    files = [Path(slide)]
    data_folder = Path(slide).with_suffix("")  # MRXS: the slide file names a folder of data files
    if Path(slide).is_dir():
        files = sorted(p for p in Path(slide).iterdir() if p.is_file())
    elif data_folder.is_dir() and data_folder != Path(slide):
        files += sorted(p for p in data_folder.iterdir() if p.is_file())
    out: list[Any] = []
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            out.append([file.name, None, None])  # the build names the missing file
            continue
        out.append([file.name, stat.st_size, stat.st_mtime_ns])
    return out


def slide_bytes(slide: Path) -> int:
    """The size of the files the slide is read from, together (a missing one counts 0)."""
    return sum(size or 0 for _name, size, _mtime in files_identity(slide))


def grid_digest(grid: TileGrid) -> str:
    """A digest of everything a grid holds (its tiles, what was left out, its settings)."""
    digest = hashlib.sha256()
    for name, array in sorted(grid.arrays().items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:24]


@cache
def code_digest(modules: tuple[str, ...] = TILING_MODULES) -> str:
    """A digest of the source of `modules` (their names where a source cannot be read)."""
    digest = hashlib.sha256()
    for name in modules:
        digest.update(name.encode())
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()[:16]


def _plain(value: Any) -> Any:
    """A key's value as JSON can write it: settings dataclasses by their fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _content_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:  # the build names the file
        return None


def _load_mask(path: Path) -> TissueMask:
    with np.load(path, allow_pickle=False) as data:
        shape = tuple(int(v) for v in data["shape"])
        bits = np.unpackbits(data["bits"], count=int(np.prod(shape))).astype(bool)
        return TissueMask(bits.reshape(shape), float(data["downsample"]))
