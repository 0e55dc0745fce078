from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from shapely.geometry import MultiPolygon, Point, Polygon, box

from bigslide.errors import RegionError
from bigslide.tiling.regions import (
    EXCLUDE_CLASS,
    Region,
    centres_inside,
    centres_sampled,
    check_inside,
    load_regions,
    save_regions,
)

SQUARE = [[0, 0], [100, 0], [100, 100], [0, 100], [0, 0]]
HOLE = [[25, 25], [75, 25], [75, 75], [25, 75], [25, 25]]


def _feature(geometry: Any, properties: Any = None) -> dict:
    return {"type": "Feature", "geometry": geometry, "properties": properties or {}}


def _write(tmp_path: Path, data: Any, name: str = "regions.geojson") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_round_trip_polygon_multipolygon_holes_and_classes(tmp_path: Path) -> None:
    regions = [
        Region(Polygon(SQUARE, [HOLE]), "Tumor"),
        Region(MultiPolygon([box(200, 0, 300, 50), Polygon(SQUARE, [HOLE])]), "Stroma"),
        Region(box(10.5, 20.25, 30, 40), ""),
    ]
    path = save_regions(regions, tmp_path / "out.geojson")
    data = json.loads(path.read_text())
    assert data["type"] == "FeatureCollection"
    assert [f["properties"] for f in data["features"]] == [
        {"objectType": "annotation", "classification": {"name": "Tumor"}},
        {"objectType": "annotation", "classification": {"name": "Stroma"}},
        {"objectType": "annotation"},
    ]
    assert [f["geometry"]["type"] for f in data["features"]] == ["Polygon", "MultiPolygon", "Polygon"]
    loaded = load_regions(path)
    assert [r.name for r in loaded] == ["Tumor", "Stroma", ""]
    for before, after in zip(regions, loaded):
        assert after.geometry.equals(before.geometry)
    assert loaded[0].geometry.area == 100 * 100 - 50 * 50
    assert len(loaded[0].geometry.interiors) == 1


@pytest.mark.parametrize(
    ("document", "names"),
    [
        (
            {
                "type": "FeatureCollection",
                "features": [
                    _feature({"type": "Polygon", "coordinates": [SQUARE]}, {"classification": {"name": "A"}})
                ],
            },
            ["A"],
        ),
        (_feature({"type": "Polygon", "coordinates": [SQUARE]}, {"name": "named"}), ["named"]),
        (
            [
                _feature({"type": "Polygon", "coordinates": [SQUARE]}),
                _feature({"type": "Polygon", "coordinates": [HOLE]}, {"classification": "Old"}),
            ],
            ["", "Old"],
        ),
    ],
    ids=["collection", "single-feature", "feature-list"],
)
def test_accepted_layouts(tmp_path: Path, document: Any, names: list[str]) -> None:
    assert [r.name for r in load_regions(_write(tmp_path, document))] == names


def test_open_ring_is_closed(tmp_path: Path) -> None:
    path = _write(tmp_path, _feature({"type": "Polygon", "coordinates": [SQUARE[:-1]]}))
    assert load_regions(path)[0].geometry.area == 10000


GOOD = _feature({"type": "Polygon", "coordinates": [SQUARE]})


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (_feature({"type": "LineString", "coordinates": [[0, 0], [1, 1]]}), "'LineString' is not supported"),
        (
            _feature({"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [0, 0]]]}),
            "at least 3 distinct points",
        ),
        (
            _feature({"type": "Polygon", "coordinates": [[[0, 0], ["a", 1], [5, 5], [0, 9]]]}),
            "finite numbers",
        ),
        (
            _feature({"type": "Polygon", "coordinates": [[[0, 0], [None, 1], [5, 5], [0, 9]]]}),
            "finite numbers",
        ),
        (_feature({"type": "Polygon", "coordinates": "oops"}), "list of rings"),
        (_feature({"type": "MultiPolygon", "coordinates": []}), "non-empty"),
        (_feature({"type": "Polygon", "coordinates": [[[0, 0], [5, 0], [10, 0], [0, 0]]]}), "no area"),
        ({"type": "Feature", "properties": {}}, "geometry"),
    ],
)
def test_malformed_feature_names_file_and_index(tmp_path: Path, bad: dict, words: str) -> None:
    path = _write(tmp_path, {"type": "FeatureCollection", "features": [GOOD, bad]})
    with pytest.raises(RegionError) as info:
        load_regions(path)
    message = str(info.value)
    assert str(path) in message
    assert "feature 1" in message
    assert words in message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "not valid JSON"),
        ('{"type": "Point"}', "FeatureCollection"),
        ('{"type": "FeatureCollection"}', "'features'"),
    ],
)
def test_malformed_document_names_file(tmp_path: Path, text: str, words: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(RegionError) as info:
        load_regions(path)
    assert str(path) in str(info.value)
    assert words in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RegionError, match="no such regions file"):
        load_regions(tmp_path / "absent.geojson")


def test_centres_inside_matches_pointwise_shapely() -> None:
    regions = [Region(Polygon(SQUARE, [HOLE]), "a"), Region(box(150, 150, 260, 240), "b")]
    rng = np.random.default_rng(0)
    coords = rng.integers(-20, 280, (2000, 2))
    inside = centres_inside(coords, 10, regions)
    truth = [any(r.geometry.contains(Point(x + 5, y + 5)) for r in regions) for x, y in coords]
    np.testing.assert_array_equal(inside, truth)
    assert 0 < inside.sum() < len(coords)


def test_centres_inside_examples() -> None:
    regions = [Region(Polygon(SQUARE, [HOLE]))]
    coords = np.array([[0, 0], [45, 45], [90, 90], [100, 0], [95, 95]])
    # centres (5,5) in; (50,50) in the hole; (95,95) in; (105,5) outside; (100,100) on the corner
    np.testing.assert_array_equal(centres_inside(coords, 10, regions), [True, False, True, False, False])
    assert centres_inside(coords, 10, []).tolist() == [False] * 5


@pytest.mark.parametrize(
    ("geometry", "ok"),
    [
        (box(10, 10, 20, 20), True),
        (box(-50, -50, 1, 1), True),
        (box(-50, -50, 0, 0), False),
        (box(1000, 0, 1100, 100), False),
        (box(0, 800, 100, 900), False),
    ],
)
def test_check_inside(geometry: Polygon, ok: bool) -> None:
    regions = [Region(box(0, 0, 5, 5)), Region(geometry, "lesion")]
    if ok:
        check_inside(regions, (1000, 800), "slide.svs")
        return
    with pytest.raises(RegionError) as info:
        check_inside(regions, (1000, 800), "slide.svs")
    assert "slide.svs: region 1 ('lesion')" in str(info.value)


# -- areas to leave out: QuPath's ignored classes and data.exclude_classes --------------------------------
GRID = np.array([[x, y] for y in range(0, 400, 20) for x in range(0, 400, 20)], float)  # 20 px tiles


@pytest.mark.parametrize(
    ("regions", "exclude_classes", "expected"),
    [
        # one annotation classified Ignore*: every tile but those inside it
        ([Region(box(0, 0, 200, 400), "Ignore*")], (), lambda c: c[:, 0] + 10 > 200),
        # an area to sample from with an area to leave out inside it
        (
            [Region(box(0, 0, 400, 200), "Tumor"), Region(box(100, 0, 200, 200), "Ignore*")],
            (),
            lambda c: (c[:, 1] + 10 < 200) & ~((c[:, 0] + 10 > 100) & (c[:, 0] + 10 < 200)),
        ),
        # a class named in data.exclude_classes is left out like Ignore*
        ([Region(box(0, 0, 200, 400), "Necrosis")], ("Necrosis",), lambda c: c[:, 0] + 10 > 200),
        # the same class, not named: an area to sample from
        ([Region(box(0, 0, 200, 400), "Necrosis")], (), lambda c: c[:, 0] + 10 < 200),
        # any class ending in * is QuPath's ignored class
        ([Region(box(0, 0, 200, 400), "Pen marks*")], (), lambda c: c[:, 0] + 10 > 200),
    ],
)
def test_areas_to_leave_out(regions: list[Region], exclude_classes: tuple[str, ...], expected: Any) -> None:
    np.testing.assert_array_equal(centres_sampled(GRID, 20, regions, exclude_classes), expected(GRID))


def test_an_ignored_multipolygon_with_a_hole_leaves_its_hole_sampled() -> None:
    ring = Polygon(box(0, 0, 400, 400).exterior.coords, [box(100, 100, 300, 300).exterior.coords])
    kept = centres_sampled(GRID, 20, [Region(MultiPolygon([ring]), "Ignore*")])
    centre = GRID + 10
    inside_hole = (centre > 100).all(axis=1) & (centre < 300).all(axis=1)
    np.testing.assert_array_equal(kept, inside_hole)


def test_an_ignored_area_survives_a_qupath_round_trip(tmp_path: Path) -> None:
    regions = [Region(box(0, 0, 400, 200), "Tumor"), Region(box(100, 0, 200, 200), EXCLUDE_CLASS)]
    path = save_regions(regions, tmp_path / "qupath.geojson")
    features = json.loads(path.read_text())["features"]
    assert features[1]["properties"]["classification"] == {"name": "Ignore*"}
    loaded = load_regions(path)
    assert [r.excluded() for r in loaded] == [False, True]
    np.testing.assert_array_equal(centres_sampled(GRID, 20, loaded), centres_sampled(GRID, 20, regions))
