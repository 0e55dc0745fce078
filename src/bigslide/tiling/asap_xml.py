"""ASAP's XML annotations (the CAMELYON16 and CAMELYON17 lesion outlines) as the GeoJSON Features the region
and annotation readers take.

An `<Annotation Type="Polygon" PartOfGroup="Tumor">` holds `<Coordinate Order="0" X=".." Y=".."/>` points
in level-0 pixels (x right, y down), as QuPath's GeoJSON does. Polygons, splines (their control points) and
rectangles enclose an area; dots and point sets become points, which the readers refuse as enclosing
none. The group is the class (none for ASAP's "None").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from bigslide.errors import BigslideError

AREA_TYPES = ("polygon", "spline", "rectangle")
POINT_TYPES = ("dot", "pointset")


def is_xml(text: str) -> bool:
    """Whether an annotation file's text is XML rather than GeoJSON."""
    return text.lstrip("\ufeff \t\r\n").startswith("<")


def asap_features(text: str, path: Path, error: type[BigslideError]) -> list[dict[str, Any]]:
    """The annotations of an ASAP XML file as GeoJSON Features; an `error` naming `path` for XML that
    is not ASAP's or an annotation whose points are not numbers."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        raise error(f"{path}: not valid XML ({exc})") from None
    if root.tag != "ASAP_Annotations":
        raise error(
            f"{path}: an XML file whose root is <{root.tag}>, not ASAP's <ASAP_Annotations>; regions and "
            "annotations are QuPath GeoJSON or ASAP XML"
        )
    return [_feature(a, i, path, error) for i, a in enumerate(root.iter("Annotation"))]


def _feature(
    annotation: ElementTree.Element, index: int, path: Path, error: type[BigslideError]
) -> dict[str, Any]:
    where = f"{path}: annotation {index} ({annotation.get('Name', 'unnamed')!r})"
    points = []
    for point in sorted(
        annotation.iter("Coordinate"), key=lambda c: _number(c.get("Order", "0"), where, error)
    ):
        points.append([_number(point.get("X"), where, error), _number(point.get("Y"), where, error)])
    kind = (annotation.get("Type") or "polygon").lower()
    if kind in POINT_TYPES:
        geometry: dict[str, Any] = {"type": "MultiPoint", "coordinates": points}
    elif kind in AREA_TYPES:
        ring = points + points[:1] if points and points[0] != points[-1] else points
        geometry = {"type": "Polygon", "coordinates": [ring]}
    else:
        raise error(f"{where}: ASAP annotation type {annotation.get('Type')!r} is not one bigslide reads")
    group = annotation.get("PartOfGroup") or ""
    properties: dict[str, Any] = {"name": annotation.get("Name", "")}
    if group and group != "None":
        properties["classification"] = {"name": group}
    return {"type": "Feature", "geometry": geometry, "properties": properties}


def _number(raw: str | None, where: str, error: type[BigslideError]) -> float:
    try:
        return float((raw or "").replace(",", "."))  # some locales write decimal commas
    except ValueError:
        raise error(f"{where}: {raw!r} is not a number") from None
