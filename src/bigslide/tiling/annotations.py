"""Teaching annotations: areas a pathologist classes on a slide, read from and written to QuPath GeoJSON.

Each annotation is a polygon in level-0 pixels (x right, y down) with a class: one of the task's classes
(tissue that shows it: where the model should look) or "Not lesion" (tissue that shows none of them:
necrosis, a fold, normal glands). The file follows QuPath's export: a FeatureCollection of Features
whose class is `properties.classification.name` (with its colour as `[r, g, b]`). Features of a class
ending in `*` (QuPath's `Ignore*`, `Region*`) and unclassified ones are not teaching annotations and
are passed over; a class the task does not know is refused, naming the file and the feature.

A tile is annotated when its centre lies inside an annotation; where annotations overlap, the one
later in the file wins (it was drawn on top).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import shapely
from shapely.geometry import MultiPolygon, Polygon, mapping, shape

from bigslide.errors import DataError
from bigslide.files import atomic_write_text
from bigslide.tiling.regions import plain_geojson, read_features

Polygonal: TypeAlias = Polygon | MultiPolygon

NOT_LESION = "Not lesion"
"""The class of tissue that shows none of the task's classes."""
NOT_LESION_NAMES = ("not lesion", "background")  # how the file may spell it (any case)
LESION = "Lesion"
"""The one class of tasks without classes (survival, regression): tissue that shows what is predicted."""
UNLABELLED = -1
"""A tile's instance label outside every annotation."""
SUFFIX = ".annotations.geojson"

NOT_LESION_COLOUR = (0, 160, 255)
_PALETTE = ((200, 0, 0), (255, 200, 0), (160, 90, 160), (80, 180, 80), (255, 120, 40), (120, 60, 20))


@dataclass(frozen=True)
class Annotation:
    """A classed area in level-0 pixels; `name` is the class as written in the file or chosen."""

    geometry: Polygonal
    name: str


def instance_classes(task_classes: Sequence[str]) -> list[str]:
    """The classes an annotation may have, in label order: the task's classes (or `LESION` for a task
    without classes), then `NOT_LESION` (its label is the last index)."""
    return [*(task_classes or [LESION]), NOT_LESION]


def canonical(name: str) -> str:
    """The spelling compared: case and runs of spaces do not matter (`Tumor ` is `tumor`)."""
    return " ".join(name.split()).casefold()


def class_index(name: str, classes: Sequence[str], where: str) -> int:
    """The instance label of class `name` among `instance_classes(...)`; a `DataError` naming `where`
    and the known classes when the task has no such class."""
    wanted = canonical(name)
    if wanted in NOT_LESION_NAMES:
        return len(classes) - 1
    for index, known in enumerate(classes):
        if canonical(known) == wanted:
            return index
    raise DataError(
        f"{where}: class {name!r} is none of the task's classes; use one of "
        + ", ".join(repr(c) for c in classes)
    )


def class_colour(name: str, classes: Sequence[str]) -> tuple[int, int, int]:
    """The colour an annotation of class `name` is drawn and saved with (QuPath shows it)."""
    if canonical(name) in NOT_LESION_NAMES:
        return NOT_LESION_COLOUR
    names = [canonical(c) for c in classes if canonical(c) not in NOT_LESION_NAMES]
    index = names.index(canonical(name)) if canonical(name) in names else len(names)
    return _PALETTE[index % len(_PALETTE)]


def annotations_path(table: str | Path, slide: str | Path) -> Path:
    """Where a slide's annotations are saved: `annotations/<slide file name>.annotations.geojson` in
    the folder of the slide table."""
    return Path(table).parent / "annotations" / f"{Path(slide).name}{SUFFIX}"


def read_annotations(path: str | Path) -> list[Annotation]:
    """The teaching annotations of a GeoJSON file (FeatureCollection, Feature or list of Features)."""
    path = Path(path)
    annotations = []
    for index, feature in enumerate(read_features(path, "annotations", DataError)):
        where = f"{path}: feature {index}"
        name = _class_name(feature, where)
        if not name or name.endswith("*"):
            continue
        annotations.append(Annotation(_geometry(feature, where), name))
    return annotations


def write_annotations(
    annotations: Sequence[Annotation], path: str | Path, classes: Sequence[str] = ()
) -> Path:
    """Write `annotations` as QuPath GeoJSON (atomically: a reader never sees half a file). `classes`
    (the task's) pick each class's colour."""
    features = []
    for annotation in annotations:
        colour = list(class_colour(annotation.name, classes))
        features.append(
            {
                "type": "Feature",
                "id": str(uuid.uuid4()),
                "geometry": plain_geojson(mapping(annotation.geometry)),
                "properties": {
                    "objectType": "annotation",
                    "classification": {"name": annotation.name, "color": colour},
                },
            }
        )
    text = json.dumps({"type": "FeatureCollection", "features": features})
    return atomic_write_text(path, text)


def label_tiles(
    annotations: Sequence[Annotation],
    coords: np.ndarray,
    tile_size_level0: float,
    classes: Sequence[str],
    source: str | Path = "annotations",
) -> np.ndarray:
    """(N,) int64 instance label of each tile with top-left level-0 (x, y) `coords`: the index in
    `classes` (`instance_classes(...)`) of the annotation its centre lies in, `UNLABELLED` elsewhere."""
    coords = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
    labels = np.full(len(coords), UNLABELLED, dtype=np.int64)
    if not annotations or not len(coords):
        return labels
    centre = coords + tile_size_level0 / 2
    for index, annotation in enumerate(annotations):
        label = class_index(annotation.name, classes, f"{source}: annotation {index}")
        inside = shapely.contains_xy(annotation.geometry, centre[:, 0], centre[:, 1])
        labels[np.asarray(inside, dtype=bool)] = label
    return labels


def annotated_count(annotations: Sequence[Annotation], coords: np.ndarray, tile_size_level0: float) -> int:
    """How many tiles (level-0 top-left `coords`) have their centre inside a teaching annotation."""
    coords = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
    if not annotations or not len(coords):
        return 0
    centre = coords + tile_size_level0 / 2
    union = shapely.union_all([a.geometry for a in annotations])
    return int(np.count_nonzero(shapely.contains_xy(union, centre[:, 0], centre[:, 1])))


def _class_name(feature: Any, where: str) -> str:
    if not isinstance(feature, dict):
        raise DataError(f"{where}: not a GeoJSON Feature")
    properties = feature.get("properties")
    classification = properties.get("classification") if isinstance(properties, dict) else None
    if isinstance(classification, dict):
        classification = classification.get("name")
    return classification.strip() if isinstance(classification, str) else ""


def _geometry(feature: dict[str, Any], where: str) -> Polygonal:
    raw = feature.get("geometry")
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("Polygon", "MultiPolygon"):
        raise DataError(f"{where}: geometry {kind!r} encloses no area (use Polygon or MultiPolygon)")
    try:
        geometry = shape(raw)
    except (ValueError, TypeError, AttributeError, IndexError) as err:
        raise DataError(f"{where}: not a valid {kind} ({err})") from None
    bounds = geometry.bounds
    if not bounds or not all(math.isfinite(v) for v in bounds):
        raise DataError(f"{where}: coordinates must be finite numbers")
    if not geometry.is_valid:
        geometry = shapely.make_valid(geometry)
        parts = [g for g in getattr(geometry, "geoms", [geometry]) if isinstance(g, Polygon | MultiPolygon)]
        geometry = shapely.union_all(parts) if parts else Polygon()
    if not isinstance(geometry, Polygon | MultiPolygon) or geometry.area <= 0:
        raise DataError(f"{where}: the {kind} has no area")
    return geometry
