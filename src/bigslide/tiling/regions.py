"""Annotated regions in level-0 pixels, read from and written to QuPath-style GeoJSON (and read from ASAP
XML, `bigslide.tiling.asap_xml`).

QuPath exports annotations as a FeatureCollection (or a list of Features) whose geometries are in
level-0 pixel coordinates (x right, y down) and whose class sits in `properties.classification.name`.

A region is an area to sample from, or an area to leave out: QuPath's ignored classes (a name ending in
"*", e.g. "Ignore*") and the classes named in `data.exclude_classes` remove their area. Tiles are sampled
inside the areas to sample from (anywhere, when a file holds only areas to leave out) and outside every
area to leave out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import shapely
from shapely.geometry import MultiPolygon, Polygon, box, mapping

from bigslide.errors import BigslideError, RegionError
from bigslide.files import atomic_write_text
from bigslide.tiling.asap_xml import asap_features, is_xml

Polygonal: TypeAlias = Polygon | MultiPolygon


@dataclass(frozen=True)
class Region:
    """A polygonal region (holes allowed) in level-0 pixels, with its class name ("" when unclassified)."""

    geometry: Polygonal
    name: str = ""

    def label(self, index: int) -> str:
        return f"region {index}" + (f" ({self.name!r})" if self.name else "")

    def excluded(self, exclude_classes: Sequence[str] = ()) -> bool:
        """Whether this is an area to leave out: QuPath's ignored classes end in "*"."""
        return self.name.endswith(IGNORED_SUFFIX) or self.name in exclude_classes


IGNORED_SUFFIX = "*"
EXCLUDE_CLASS = "Ignore*"
"""The class bigslide gives the areas to leave out it writes (QuPath's own ignored class)."""


def load_regions(path: str | Path) -> list[Region]:
    """Read Polygon / MultiPolygon features from a GeoJSON file (FeatureCollection, Feature or list)."""
    path = Path(path)
    features = read_features(path, "regions", RegionError)
    return [_parse_feature(feature, index, path) for index, feature in enumerate(features)]


def save_regions(regions: Sequence[Region], path: str | Path) -> Path:
    """Write `regions` as a QuPath-compatible GeoJSON FeatureCollection of annotations.

    A region without a name is written without a classification, so QuPath shows it unclassified.
    """
    path = Path(path)
    features = []
    for region in regions:
        properties: dict[str, Any] = {"objectType": "annotation"}
        if region.name:
            properties["classification"] = {"name": region.name}
        features.append(
            {"type": "Feature", "geometry": plain_geojson(mapping(region.geometry)), "properties": properties}
        )
    # written under a temporary name and renamed: a reader (QuPath, a run) never sees half a file
    return atomic_write_text(path, json.dumps({"type": "FeatureCollection", "features": features}))


def centres_inside(coords: np.ndarray, tile_size_level0: int, regions: Sequence[Region]) -> np.ndarray:
    """Bool mask: True where the tile centre lies strictly inside any region (holes excluded)."""
    coords = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
    if not regions or len(coords) == 0:
        return np.zeros(len(coords), bool)
    union = shapely.union_all([r.geometry for r in regions])
    centre = coords + tile_size_level0 / 2
    return np.asarray(shapely.contains_xy(union, centre[:, 0], centre[:, 1]), dtype=bool)


def centres_sampled(
    coords: np.ndarray, tile_size_level0: int, regions: Sequence[Region], exclude_classes: Sequence[str] = ()
) -> np.ndarray:
    """Bool mask: True where the tile centre lies inside an area to sample from (anywhere, when every
    region is an area to leave out) and outside every area to leave out. No region at all: no tile."""
    coords = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
    if not regions:
        return np.zeros(len(coords), bool)
    include, exclude = split_regions(regions, exclude_classes)
    keep = centres_inside(coords, tile_size_level0, include) if include else np.ones(len(coords), bool)
    if exclude:
        keep &= ~centres_inside(coords, tile_size_level0, exclude)
    return keep


def split_regions(
    regions: Sequence[Region], exclude_classes: Sequence[str] = ()
) -> tuple[list[Region], list[Region]]:
    """(areas to sample from, areas to leave out)."""
    include = [r for r in regions if not r.excluded(exclude_classes)]
    return include, [r for r in regions if r.excluded(exclude_classes)]


def check_inside(regions: Sequence[Region], dimensions: tuple[int, int], source: str | Path) -> None:
    """Raise RegionError naming the first region that has no area inside the slide of `dimensions`."""
    slide_box = box(0, 0, dimensions[0], dimensions[1])
    for index, region in enumerate(regions):
        if region.geometry.intersection(slide_box).area <= 0:
            xmin, ymin, xmax, ymax = region.geometry.bounds
            raise RegionError(
                f"{source}: {region.label(index)} with bounds x {xmin:g}..{xmax:g}, y {ymin:g}..{ymax:g} "
                f"lies outside the slide ({dimensions[0]} x {dimensions[1]} px)"
            )


def read_features(path: Path, what: str, error: type[BigslideError]) -> list[Any]:
    """The Features of a GeoJSON file (a FeatureCollection, a Feature or a list of Features), as QuPath
    exports them, or of an ASAP XML file (`bigslide.tiling.asap_xml`); a file that is none of these is an
    `error` naming the file, the kind of file `what` ("regions", "annotations") when it is missing."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None
    if is_xml(text):
        return asap_features(text, path, error)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, list):
        return data
    if isinstance(data, dict) and data.get("type") == "FeatureCollection":
        features = data.get("features")
        if not isinstance(features, list):
            raise error(f"{path}: FeatureCollection has no 'features' list")
        return features
    if isinstance(data, dict) and data.get("type") == "Feature":
        return [data]
    raise error(f"{path}: expected a GeoJSON FeatureCollection, Feature or list of Features")


def _parse_feature(feature: Any, index: int, path: Path) -> Region:
    where = f"{path}: feature {index}"
    if not isinstance(feature, dict) or not isinstance(feature.get("geometry"), dict):
        raise RegionError(f"{where}: not a GeoJSON Feature with a geometry")
    geometry = feature["geometry"]
    kind = geometry.get("type")
    coordinates = geometry.get("coordinates")
    if kind == "Polygon":
        shape: Polygonal = _polygon(coordinates, where)
    elif kind == "MultiPolygon":
        if not isinstance(coordinates, list) or not coordinates:
            raise RegionError(f"{where}: MultiPolygon needs a non-empty list of polygons")
        shape = MultiPolygon([_polygon(part, f"{where} part {i}") for i, part in enumerate(coordinates)])
    else:
        raise RegionError(f"{where}: geometry type {kind!r} is not supported (use Polygon or MultiPolygon)")
    if not shape.is_valid:
        shape = _polygonal(shapely.make_valid(shape))
    if shape.is_empty or shape.area <= 0:
        raise RegionError(f"{where}: polygon has no area")
    return Region(shape, _name(feature.get("properties")))


def _polygon(rings: Any, where: str) -> Polygon:
    if not isinstance(rings, list) or not rings:
        raise RegionError(f"{where}: Polygon needs a list of rings")
    parsed = [_ring(ring, f"{where} ring {i}") for i, ring in enumerate(rings)]
    return Polygon(parsed[0], parsed[1:])


def _ring(ring: Any, where: str) -> list[tuple[float, float]]:
    if not isinstance(ring, list):
        raise RegionError(f"{where}: a ring must be a list of [x, y] points")
    points = []
    for point in ring:
        if (
            not isinstance(point, list | tuple)
            or len(point) < 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in point[:2])
            or not all(math.isfinite(v) for v in point[:2])
        ):
            raise RegionError(f"{where}: point {point!r} is not a pair of finite numbers")
        points.append((float(point[0]), float(point[1])))
    distinct = len(set(points))
    if distinct < 3:
        raise RegionError(f"{where}: a ring needs at least 3 distinct points, got {distinct}")
    return points


def _polygonal(geometry: Any) -> Polygonal:
    """The polygonal part of a repaired geometry (make_valid may add stray lines or points)."""
    if isinstance(geometry, Polygon | MultiPolygon):
        return geometry
    parts = [g for g in getattr(geometry, "geoms", []) if isinstance(g, Polygon | MultiPolygon)]
    polygons: list[Polygon] = []
    for part in parts:
        polygons.extend(part.geoms if isinstance(part, MultiPolygon) else [part])
    return MultiPolygon(polygons)


def _name(properties: Any) -> str:
    if not isinstance(properties, dict):
        return ""
    classification = properties.get("classification")
    if isinstance(classification, dict) and isinstance(classification.get("name"), str):
        return str(classification["name"])
    if isinstance(classification, str):
        return classification
    name = properties.get("name")
    return name if isinstance(name, str) else ""


def plain_geojson(value: Any) -> Any:
    """A geometry's GeoJSON as JSON writes it: shapely's mapping() uses tuples, JSON wants lists."""
    if isinstance(value, dict):
        return {k: plain_geojson(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_geojson(v) for v in value]
    return value
