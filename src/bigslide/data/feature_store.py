"""Per-slide feature files in the layout CLAM and TRIDENT write: `<folder>/<slide stem>.h5`.

Datasets: `features` (N, D) float32, one row per tile, and `coords` (N, 2) int, the level-0 (x, y) of each
tile's top-left corner. bigslide's own files say what made them, so that features of other weights or
tiles are never reused: on `features`, the encoder (`encoder`, the backbone name, and `encoder_sha256`, a
hash of its weights); on `coords`, the tile (`patch_size`, pixels at `target_mpp` µm/px; `patch_size_level0`)
and the slide's level-0 `slide_mpp` (x, y), with TRIDENT's `level0_magnification` / `target_magnification`
beside them so TRIDENT's own readers take the file too; on the file, `format` and `format_version`.

Files of other tools carry none of this (CLAM's `extract_features_fp.py` writes no attributes; TRIDENT writes
`patch_size_level0` and magnifications on `coords`): they are "foreign", taken only when the run says so.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from bigslide.errors import DataError
from bigslide.files import temporary_beside

FORMAT = "bigslide-features"
FORMAT_VERSION = 1
MAGNIFICATION_UM = 10.0  # 20x = 0.5 µm/px, as `bigslide.wsi.resolution` converts
REMEDY = "use another data.features folder, or delete the file to extract it again"


@dataclass(frozen=True)
class StoreSettings:
    """What a run's feature files must have been made with.

    `encoder` / `encoder_sha256` are None for a run without an encoder of its own (foreign features):
    then only the tile and resolution of bigslide's files are checked."""

    encoder: str | None
    encoder_sha256: str | None
    tile_size: int
    target_mpp: float


@dataclass(frozen=True)
class FeatureFile:
    """One slide's stored features: where they are, what they hold, and whether bigslide made them."""

    path: Path
    rows: int
    dim: int
    coords: np.ndarray  # (rows, 2) int64 level-0 top-left (x, y)
    tile_size_level0: int
    foreign: bool
    slide_mpp: tuple[float, ...] | None = None  # bigslide files: the slide's level-0 (x, y) µm/px
    slide_bytes: int | None = None  # bigslide files: the size of the slide file it was made from

    def read(self, indices: np.ndarray | None = None) -> np.ndarray:
        """The features of rows `indices` (increasing; None = every row) as float32 (rows, dim)."""
        with h5py.File(self.path, "r") as f:
            dataset = f["features"]
            if indices is None or len(indices) == self.rows:
                rows = dataset[()]
            else:
                rows = dataset[np.asarray(indices, dtype=np.int64)]  # h5py wants increasing indices
        return np.asarray(rows, dtype=np.float32)


def feature_path(folder: str | Path, slide: str | Path) -> Path:
    """`<folder>/<slide stem>.h5`, the name TRIDENT gives (CLAM's too for single-suffix slides)."""
    return Path(folder) / f"{Path(slide).stem}.h5"


def check_unique_names(folder: str | Path, slides: Sequence[str | Path]) -> None:
    """Two slides whose names share a stem would share a feature file: an error naming both."""
    seen: dict[Path, str | Path] = {}
    for slide in slides:
        path = feature_path(folder, slide)
        other = seen.setdefault(path, slide)
        if Path(other) != Path(slide):
            raise DataError(f"{other} and {slide} would share the feature file {path}; rename one of them")


def write_feature_file(
    path: str | Path,
    features: np.ndarray,
    coords: np.ndarray,
    settings: StoreSettings,
    *,
    tile_size_level0: int,
    slide_mpp: tuple[float, float],
    slide_name: str,
    slide_bytes: int,
) -> Path:
    """Write a bigslide feature file whole or not at all: a temporary file beside `path`, then a rename."""
    path = Path(path)
    if settings.encoder is None or settings.encoder_sha256 is None:
        raise ValueError("bigslide feature files name their encoder")
    if len(features) != len(coords):
        raise ValueError(f"{len(features)} feature rows for {len(coords)} tiles")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Stale temporary files are left alone: another process (a second rank, a parallel run) may be writing
    # the same slide's file now; its rename, like this one, replaces the file whole.
    fd, tmp = temporary_beside(path)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = FORMAT_VERSION
            rows = f.create_dataset("features", data=np.asarray(features, dtype=np.float32))
            rows.attrs["encoder"] = settings.encoder
            rows.attrs["encoder_sha256"] = settings.encoder_sha256
            rows.attrs["name"] = slide_name
            tiles = f.create_dataset("coords", data=np.asarray(coords, dtype=np.int64).reshape(-1, 2))
            tiles.attrs["patch_size"] = int(settings.tile_size)
            tiles.attrs["patch_size_level0"] = int(tile_size_level0)
            tiles.attrs["target_mpp"] = float(settings.target_mpp)
            tiles.attrs["slide_mpp"] = np.asarray(slide_mpp, dtype=np.float64)
            tiles.attrs["target_magnification"] = MAGNIFICATION_UM / settings.target_mpp
            tiles.attrs["level0_magnification"] = MAGNIFICATION_UM / float(slide_mpp[0])
            tiles.attrs["name"] = slide_name
            tiles.attrs["slide_bytes"] = int(slide_bytes)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def open_feature_file(path: str | Path, settings: StoreSettings, *, foreign_dim: int = 0) -> FeatureFile:
    """Read and check a feature file's layout and attributes; any mismatch is a `DataError` naming the file
    and the attribute.

    A bigslide file must match `settings` (its tiles are checked against the run's grid by
    `ExpectedTiles.check`). A file without bigslide's attributes is taken only when `foreign_dim` (the width
    the run was told) is set, and must be that wide.
    """
    path = Path(path)
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise DataError(f"{path}: not a readable HDF5 feature file ({err})") from None
    with f:
        for name in ("features", "coords"):
            if not isinstance(f.get(name), h5py.Dataset):
                raise DataError(f"{path}: no '{name}' dataset (a feature file holds 'features' and 'coords')")
        features, coords_set = f["features"], f["coords"]
        if features.ndim != 2 or coords_set.ndim != 2 or coords_set.shape[1] != 2:
            raise DataError(
                f"{path}: 'features' must be (N, D) and 'coords' (N, 2); they are {features.shape} and "
                f"{coords_set.shape}"
            )
        if features.shape[0] != coords_set.shape[0]:
            raise DataError(f"{path}: {features.shape[0]} feature rows for {coords_set.shape[0]} coords")
        if features.shape[0] == 0:
            raise DataError(f"{path}: holds no tile")
        coords = np.asarray(coords_set[()], dtype=np.int64)
        rows, dim = (int(n) for n in features.shape)
        foreign = _text(f.attrs.get("format")) != FORMAT
        if foreign:
            if not foreign_dim:
                raise DataError(
                    f"{path}: has no bigslide attributes (encoder, tile size, µm/px), so what made it cannot "
                    "be checked; to train on files of another tool (CLAM, TRIDENT) as they are, set "
                    f"data.features_foreign: true and data.feature_dim: {dim}"
                )
            if dim != foreign_dim:
                raise DataError(f"{path}: features are {dim} wide, data.feature_dim says {foreign_dim}")
            size0 = _foreign_tile_size(coords, coords_set.attrs)
            return FeatureFile(path, rows, dim, coords, size0, foreign=True)
        version = int(f.attrs.get("format_version", 0))
        if version != FORMAT_VERSION:
            raise DataError(f"{path}: format_version {version}; this bigslide reads {FORMAT_VERSION}")
        _check_bigslide(path, features.attrs, coords_set.attrs, settings)
        size0 = int(coords_set.attrs["patch_size_level0"])
        stored_mpp = tuple(float(v) for v in np.ravel(coords_set.attrs["slide_mpp"]))
        made_from = coords_set.attrs.get("slide_bytes")  # files written before it was kept have none
    if foreign_dim and dim != foreign_dim:
        raise DataError(f"{path}: features are {dim} wide, data.feature_dim says {foreign_dim}")
    return FeatureFile(
        path,
        rows,
        dim,
        coords,
        size0,
        foreign=False,
        slide_mpp=stored_mpp,
        slide_bytes=None if made_from is None else int(made_from),
    )


@dataclass(frozen=True)
class ExpectedTiles:
    """This run's tiles of one slide, which a bigslide file must hold row for row."""

    coords: np.ndarray
    tile_size_level0: int
    slide_mpp: tuple[float, float]
    slide_bytes: int

    def check(self, file: FeatureFile) -> None:
        """A `DataError` naming the file and the attribute when a bigslide file holds other tiles, or was
        made from another slide file (files are named by the slide's stem alone)."""
        path, coords, size0, slide_mpp = file.path, file.coords, file.tile_size_level0, file.slide_mpp or ()
        if file.slide_bytes is not None and file.slide_bytes != self.slide_bytes:
            raise DataError(
                f"{path}: made from a slide file of {file.slide_bytes} bytes, this slide's is "
                f"{self.slide_bytes}: another slide of the same name (slide_bytes); {REMEDY}"
            )
        if not _close(slide_mpp, self.slide_mpp):
            raise DataError(
                f"{path}: made with slide_mpp={_show(slide_mpp)} (level-0 µm/px), the slide reads as "
                f"{_show(self.slide_mpp)}; {REMEDY}"
            )
        if size0 != self.tile_size_level0:
            raise DataError(
                f"{path}: made with patch_size_level0={size0}, this run's tiles are {self.tile_size_level0} "
                f"level-0 pixels; {REMEDY}"
            )
        if coords.shape != self.coords.shape or not np.array_equal(coords, self.coords):
            raise DataError(
                f"{path}: its coords ({len(coords)} tiles) are not this run's tile grid ({len(self.coords)} "
                f"tiles: data.min_tissue, the tissue settings (data.reject_ink, ...) or the slide's regions "
                f"differ); {REMEDY}"
            )


def _check_bigslide(path: Path, on_features: Any, on_coords: Any, settings: StoreSettings) -> None:
    wanted: list[tuple[Any, str, object]] = []
    if settings.encoder is not None:
        wanted += [
            (on_features, "encoder", settings.encoder),
            (on_features, "encoder_sha256", settings.encoder_sha256),
        ]
    wanted += [(on_coords, "patch_size", settings.tile_size), (on_coords, "target_mpp", settings.target_mpp)]
    what = {
        "encoder": "model.backbone",
        "encoder_sha256": "the encoder's weights (model.pretrained, model.weights, run.seed)",
        "patch_size": "data.tile_size",
        "target_mpp": "data.target_mpp",
    }
    for name in ("patch_size_level0", "slide_mpp"):  # read by `ExpectedTiles.check`
        if name not in on_coords:
            raise DataError(f"{path}: attribute {name} is missing; {REMEDY}")
    for attrs, name, expected in wanted:
        if name not in attrs:
            raise DataError(f"{path}: attribute {name} is missing; {REMEDY}")
        stored = attrs[name]
        same = (
            _close((float(stored),), (float(expected),))  # type: ignore[arg-type]
            if isinstance(expected, float)
            else _plain(stored) == expected
        )
        if not same:
            raise DataError(
                f"{path}: made with {name}={_plain(stored)!r}, this run has {what[name]} = {expected!r}; "
                + REMEDY
            )


def _foreign_tile_size(coords: np.ndarray, attrs: Any) -> int:
    """The level-0 side of a foreign file's heatmap cells: the most common step between neighbouring tiles
    of a row (CLAM and TRIDENT tile on regular grids, CLAM each tissue contour from its own corner), else
    TRIDENT's `patch_size_level0`, else 1 (a single tile)."""
    order = np.lexsort((coords[:, 0], coords[:, 1]))
    x, y = coords[order, 0], coords[order, 1]
    steps = np.diff(x)[np.diff(y) == 0]
    steps = steps[steps > 0]
    if len(steps):
        values, counts = np.unique(steps, return_counts=True)
        return int(values[np.argmax(counts)])
    if "patch_size_level0" in attrs:
        return max(1, int(attrs["patch_size_level0"]))
    return 1


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode()
    return None if value is None else str(value)


def _plain(value: object) -> object:
    """An attribute as a plain Python value (h5py gives numpy scalars and, for old files, bytes)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _close(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b))


def _show(mpp: Sequence[float]) -> str:
    return "(" + ", ".join(f"{v:g}" for v in mpp) + ")"
