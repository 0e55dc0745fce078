"""Teaching annotations: QuPath GeoJSON in and out, tile labels, the slide table's column, bags that always
hold the annotated tiles, and runs that learn from them (or say why they cannot)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import shapely

from bigslide.data.bags import BagDataset
from bigslide.data.sources import slide_dataset
from bigslide.data.table import SlideTable
from bigslide.engine import TrainConfig, train
from bigslide.engine.checkpoint import load_checkpoint, save_checkpoint
from bigslide.engine.events import Message
from bigslide.engine.finetune import write_finetune_folder
from bigslide.errors import ConfigError, DataError
from bigslide.synthetic.slides import make_synthetic_slide
from bigslide.tiling.annotations import (
    NOT_LESION,
    UNLABELLED,
    Annotation,
    annotations_path,
    instance_classes,
    label_tiles,
    read_annotations,
    write_annotations,
)
from bigslide.tiling.regions import load_regions
from tests.test_engine import drain, small_config

CLASSES = instance_classes(["normal", "tumor"])  # normal 0, tumor 1, Not lesion 2

# What QuPath 0.5 writes with File > Export objects as GeoJSON ("Pretty JSON", FeatureCollection).
QUPATH_EXPORT = {
    "type": "FeatureCollection",
    "features": [
        {
            "type": "Feature",
            "id": "5d7b6a4e-0a7e-4a57-9a8c-1f0e6a1f0c11",
            "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [64, 0], [64, 64], [0, 64], [0, 0]]]},
            "properties": {
                "objectType": "annotation",
                "classification": {"name": "Tumor", "color": [200, 0, 0]},
                "isLocked": False,
            },
        },
        {
            "type": "Feature",
            "id": "aa",
            "geometry": {
                "type": "MultiPolygon",
                "coordinates": [
                    [[[128, 0], [192, 0], [192, 64], [128, 64], [128, 0]]],
                    [[[256, 0], [320, 0], [320, 64], [256, 64], [256, 0]]],
                ],
            },
            "properties": {"objectType": "annotation", "classification": {"name": "Background"}},
        },
        {  # QuPath's areas to leave out and unclassified outlines teach nothing
            "type": "Feature",
            "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [9, 0], [9, 9], [0, 0]]]},
            "properties": {"objectType": "annotation", "classification": {"name": "Ignore*"}},
        },
        {
            "type": "Feature",
            "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [500, 0], [500, 500], [0, 0]]]},
            "properties": {"objectType": "annotation"},
        },
    ],
}


def test_a_qupath_export_reads_as_classed_areas_and_writes_back_as_qupath_reads_it(tmp_path: Path) -> None:
    source = tmp_path / "qupath.geojson"
    source.write_text(json.dumps(QUPATH_EXPORT))
    annotations = read_annotations(source)
    assert [a.name for a in annotations] == ["Tumor", "Background"]
    assert annotations[0].geometry.equals(shapely.box(0, 0, 64, 64))
    assert annotations[1].geometry.area == 2 * 64 * 64

    written = write_annotations(annotations, tmp_path / "out" / "slide.svs.annotations.geojson", ["tumor"])
    data = json.loads(written.read_text())
    assert data["type"] == "FeatureCollection"
    for feature, annotation in zip(data["features"], annotations, strict=True):
        assert feature["properties"]["objectType"] == "annotation"
        assert feature["properties"]["classification"]["name"] == annotation.name
        assert len(feature["properties"]["classification"]["color"]) == 3  # [r, g, b], as QuPath writes
        assert isinstance(feature["id"], str)
    again = read_annotations(written)
    assert [(a.name, a.geometry.wkt) for a in again] == [(a.name, a.geometry.wkt) for a in annotations]


def test_tiles_are_labelled_by_the_annotation_their_centre_lies_in_the_later_one_on_top() -> None:
    annotations = [
        Annotation(shapely.box(0, 0, 200, 100), "tumor"),
        Annotation(shapely.box(100, 0, 200, 100), NOT_LESION),  # drawn later, on top
        Annotation(shapely.box(0, 200, 100, 300), " Normal "),  # spelled as the table does not
    ]
    # tiles of 64 px: centres (32, 32) in the first box only, (132, 32) in the first two, (32, 232) in the
    # third, (332, 332) and (182, 182) in none
    coords = np.array([[0, 0], [100, 0], [0, 200], [300, 300], [150, 150]])
    labels = label_tiles(annotations, coords, 64, CLASSES)
    np.testing.assert_array_equal(labels, [1, 2, 0, UNLABELLED, UNLABELLED])


def test_a_class_the_task_does_not_know_is_refused_naming_the_file_and_annotation(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"slide\.geojson: annotation 1: class 'Necrosis'.*'normal', 'tumor'"):
        label_tiles(
            [Annotation(shapely.box(0, 0, 9, 9), "tumor"), Annotation(shapely.box(0, 0, 9, 9), "Necrosis")],
            np.zeros((1, 2)),
            8,
            CLASSES,
            tmp_path / "slide.geojson",
        )
    points = tmp_path / "points.geojson"
    points.write_text(
        json.dumps(
            [
                {
                    "type": "Feature",
                    "geometry": {"type": "Point", "coordinates": [1, 2]},
                    "properties": {"classification": {"name": "tumor"}},
                }
            ]
        )
    )
    with pytest.raises(DataError, match=r"points\.geojson: feature 0: geometry 'Point' encloses no area"):
        read_annotations(points)


@pytest.fixture(scope="module")
def annotated_slides(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two small synthetic slides, the first with annotations (a lesion area and a normal one)."""
    folder = tmp_path_factory.mktemp("annotated")
    paths = [folder / f"s{i}.svs" for i in range(2)]
    for i, path in enumerate(paths):
        make_synthetic_slide(path, size=(768, 512), lesions=1 - i, seed=5 + i)
    table = folder / "slides.csv"
    # about 8 tiles of 32 level-0 px in a lesion area and 6 in a normal one, where the slide has tissue
    drawn = [
        Annotation(shapely.box(288, 64, 416, 128), "tumor"),
        Annotation(shapely.box(512, 256, 608, 320), "Not lesion"),
    ]
    write_annotations(drawn, annotations_path(table, paths[0]))
    table.write_text(
        "slide,label,split,annotations\n"
        f"s0.svs,tumor,train,annotations/{paths[0].name}.annotations.geojson\ns1.svs,normal,train,\n"
    )
    return table, paths[0]


def test_the_slide_table_reads_and_writes_the_annotations_column(
    annotated_slides: tuple[Path, Path], tmp_path: Path
) -> None:
    table_path, slide = annotated_slides
    table = SlideTable.from_csv(table_path)
    assert table.entries[0].annotations == annotations_path(table_path, slide).resolve()
    assert table.entries[1].annotations is None
    assert "annotations" in table.columns
    saved = table.to_csv(table_path.parent / "copy.csv")
    assert SlideTable.from_csv(saved).entries[0].annotations == table.entries[0].annotations
    broken = tmp_path / "broken.csv"
    broken.write_text(f"slide,label,annotations\n{slide},tumor,nowhere.geojson\n")
    with pytest.raises(
        DataError, match=r"broken\.csv, row 2: annotations file not found: .*nowhere\.geojson"
    ):
        SlideTable.from_csv(broken)


def test_every_training_bag_holds_the_annotated_tiles_at_the_bag_size(
    annotated_slides: tuple[Path, Path],
) -> None:
    table = SlideTable.from_csv(annotated_slides[0])
    plain = BagDataset(table, tile_size=32, bag_size=32, seed=3)
    taught = BagDataset(table, tile_size=32, bag_size=32, seed=3, instance_classes=CLASSES)
    assert taught.annotated is not None
    grid = taught.grids[0]
    expected = label_tiles(
        read_annotations(table.entries[0].annotations), grid.coords, grid.tile_size_level0, CLASSES
    )  # type: ignore[arg-type]
    annotated = set(np.flatnonzero(expected != UNLABELLED))
    assert 6 <= len(annotated) <= 16
    assert {1, 2} <= set(expected[list(annotated)])
    for epoch in range(3):
        taught.set_epoch(epoch)
        bag = taught[0]
        assert len(bag.x) == 32
        assert annotated <= set(taught.tile_indices(0))
        # each tile's label is the one its coordinates have
        assert bag.instance_labels is not None
        assert bag.coords is not None
        again = label_tiles(
            read_annotations(table.entries[0].annotations), bag.coords, grid.tile_size_level0, CLASSES
        )  # type: ignore[arg-type]
        np.testing.assert_array_equal(bag.instance_labels, again)
        # a slide without annotations samples as it would without any
        plain.set_epoch(epoch)
        np.testing.assert_array_equal(taught.tile_indices(1), plain.tile_indices(1))
        assert (taught[1].instance_labels == UNLABELLED).all()


def test_more_annotated_tiles_than_half_a_bag_fill_half_of_it(annotated_slides: tuple[Path, Path]) -> None:
    table = SlideTable.from_csv(annotated_slides[0])
    taught = BagDataset(table, tile_size=32, bag_size=6, seed=3, instance_classes=CLASSES)
    draws = []
    for epoch in range(4):
        taught.set_epoch(epoch)
        labels = taught[0].instance_labels
        assert labels is not None
        assert len(labels) == 6
        assert (labels != UNLABELLED).sum() >= 3  # half, and others may be drawn among the rest
        draws.append(tuple(taught.tile_indices(0)))
    assert len(set(draws)) > 1  # a fresh draw each epoch


def test_only_training_bags_of_bag_methods_use_annotations(annotated_slides: tuple[Path, Path]) -> None:
    config = TrainConfig().data
    config.tile_size, config.bag_size = 32, 8
    table = SlideTable.from_csv(annotated_slides[0])
    kwargs = {"seed": 0, "slides": None}
    assert slide_dataset(config, "bag", table, train=True, **kwargs).annotated is not None  # type: ignore[arg-type, union-attr]
    assert slide_dataset(config, "bag", table, train=False, **kwargs).annotated is None  # type: ignore[arg-type, union-attr]
    config.instance_weight = 0
    assert slide_dataset(config, "bag", table, train=True, **kwargs).annotated is None  # type: ignore[arg-type, union-attr]
    config.instance_weight = 1
    with pytest.raises(ConfigError, match=r"instance_weight.*one image, without tiles to label"):
        slide_dataset(config, "image", table, train=True, **kwargs)  # type: ignore[arg-type]


def _annotated_config(table: Path, out: Path, method: str = "abmil_acc", **params: object) -> TrainConfig:
    config = small_config(table, out, method, hidden=16, **params)
    config.model.backbone = "test_resnet"
    config.optim.epochs = 1
    config.run.tensorboard = False
    return config


def test_a_run_says_what_the_annotations_teach_and_a_fine_tune_starts_from_its_checkpoint(
    annotated_slides: tuple[Path, Path], tmp_path: Path
) -> None:
    table = annotated_slides[0]
    config = _annotated_config(table, tmp_path / "first", chunk_size=4)
    config.data.instance_weight = 0.0
    events, first = drain(train(config))
    assert not [e for e in events if isinstance(e, Message) and "annotations" in e.text]

    tuned = _annotated_config(table, tmp_path / "tuned", chunk_size=4)
    tuned.data.instance_loss = "tiles"
    tuned.model.init_from = str(first.checkpoint)
    tuned.to_yaml(tmp_path / "tuned" / "config.yaml")
    replayed = TrainConfig.from_yaml(tmp_path / "tuned" / "config.yaml")  # as `bigslide train` reads it
    assert replayed.model.init_from == str(first.checkpoint)
    replayed.optim.lr, replayed.optim.max_steps = 1e-12, 1  # one step that moves no weight visibly
    events, _ = drain(train(replayed))
    texts = [e.text for e in events if isinstance(e, Message) and not e.text.startswith("tile grids")]
    assert texts[0].startswith(f"started from the weights of {first.checkpoint} (abmil_acc, 1 epoch trained")
    taught = f"{_count(table)} annotated tiles in 1 training slide teach a tile classifier (weight 1)"
    assert texts[1] == f"annotations: {taught}"
    saved = load_checkpoint(tmp_path / "tuned" / "checkpoints" / "last.pt")
    start = load_checkpoint(first.checkpoint)  # type: ignore[arg-type]
    for key, value in start["model"].items():  # the fine-tune began from those weights
        assert np.allclose(saved["model"][key].double(), value.double(), rtol=0, atol=1e-9), key
    assert {"tiles.weight", "tiles.bias"} <= set(saved["model"])


def _count(table: Path) -> int:
    t = SlideTable.from_csv(table)
    ds = BagDataset(t, tile_size=32, bag_size=6, instance_classes=CLASSES)
    return sum(ds.annotated.count(r) for r in range(len(t)))  # type: ignore[union-attr]


def test_a_fine_tune_from_other_classes_or_another_model_is_refused(
    annotated_slides: tuple[Path, Path], tmp_path: Path
) -> None:
    table = annotated_slides[0]
    first = drain(train(_annotated_config(table, tmp_path / "first", chunk_size=4)))[1]
    other = _annotated_config(table, tmp_path / "other", chunk_size=4, aggregator="transmil")
    other.data.instance_loss = "tiles"
    other.model.init_from = str(first.checkpoint)
    with pytest.raises(
        ConfigError, match=r"model.init_from: .*last\.pt: its weights \(abmil_acc\) do not fit"
    ):
        drain(train(other))
    relabelled = tmp_path / "relabelled.csv"
    relabelled.write_text(SlideTable.from_csv(table).like([]).columns[0] + ",label,split\n"
                          f"{annotated_slides[1]},a,train\n{table.parent / 's1.svs'},b,train\n")  # fmt: skip
    config = _annotated_config(relabelled, tmp_path / "relabelled", chunk_size=4)
    config.model.init_from = str(first.checkpoint)
    with pytest.raises(
        ConfigError, match=r"predicts classification \['normal', 'tumor'\], this run .*\['a', 'b'\]"
    ):
        drain(train(config))


def test_a_transmil_run_taught_by_attention_stops_before_training(
    annotated_slides: tuple[Path, Path], tmp_path: Path
) -> None:
    config = _annotated_config(annotated_slides[0], tmp_path / "run", chunk_size=4, aggregator="transmil")
    with pytest.raises(ConfigError, match="gives no tile an attention score of its own"):
        drain(train(config))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_fine_tune_folder_keeps_the_checkpoints_settings_and_a_copy_of_the_annotations(
    annotated_slides: tuple[Path, Path], tmp_path: Path
) -> None:
    table_path, slide = annotated_slides
    config = _annotated_config(table_path, tmp_path / "first", chunk_size=4)
    config.data.source = "demo"  # a checkpoint of `bigslide demo`: the fine-tune reads its own table
    config.data.csv = None
    config.optim.lr = 3e-4
    checkpoint = tmp_path / "first" / "checkpoints" / "last.pt"
    save_checkpoint(
        {"config": config.to_dict(), "classes": ["normal", "tumor"], "method": "abmil_acc", "model": {}},
        checkpoint,
    )
    table = SlideTable.from_csv(table_path)
    tuned = write_finetune_folder(checkpoint, tmp_path / "tuned", table, epochs=3, instance_weight=0.5)
    replayed = TrainConfig.from_yaml(tmp_path / "tuned" / "config.yaml")
    for read in (tuned, replayed):
        assert (read.data.source, read.data.csv) == (
            "csv",
            str((tmp_path / "tuned" / "slides.csv").resolve()),
        )
        assert (read.optim.epochs, read.optim.lr, read.data.instance_weight) == (3, 3e-4, 0.5)
        assert read.model.init_from == str(checkpoint.resolve())
        assert read.method.params == {"hidden": 16, "chunk_size": 4}
    copied = SlideTable.from_csv(tmp_path / "tuned" / "slides.csv").entries[0].annotations
    assert copied == (tmp_path / "tuned" / "annotations" / f"{slide.name}.annotations.geojson").resolve()
    assert copied.read_text() == table.entries[0].annotations.read_text()  # type: ignore[union-attr]
    anew = write_finetune_folder(checkpoint, tmp_path / "anew", table, epochs=7, anew=True)
    assert anew.model.init_from is None  # trained from the model's own starting weights
    assert (anew.optim.epochs, anew.optim.lr, anew.method.params) == (
        7,
        3e-4,
        {"hidden": 16, "chunk_size": 4},
    )
    assert TrainConfig.from_yaml(tmp_path / "anew" / "config.yaml").model.init_from is None
    with pytest.raises(DataError, match="no slide of the training set has saved annotations"):
        write_finetune_folder(checkpoint, tmp_path / "bare", table.like(table.entries[1:]), epochs=1)


# As ASAP writes the CAMELYON16 and CAMELYON17 lesion outlines (level-0 pixels, x right, y down).
ASAP_EXPORT = """<?xml version="1.0"?>
<ASAP_Annotations>
\t<Annotations>
\t\t<Annotation Name="Annotation 0" Type="Polygon" PartOfGroup="Tumor" Color="#F4FA58">
\t\t\t<Coordinates>
\t\t\t\t<Coordinate Order="2" X="64" Y="64" />
\t\t\t\t<Coordinate Order="0" X="0" Y="0" />
\t\t\t\t<Coordinate Order="1" X="64" Y="0" />
\t\t\t\t<Coordinate Order="3" X="0" Y="64" />
\t\t\t</Coordinates>
\t\t</Annotation>
\t\t<Annotation Name="Annotation 1" Type="Rectangle" PartOfGroup="Background" Color="#64FE2E">
\t\t\t<Coordinates>
\t\t\t\t<Coordinate Order="0" X="128.5" Y="0" />
\t\t\t\t<Coordinate Order="1" X="192.5" Y="0" />
\t\t\t\t<Coordinate Order="2" X="192.5" Y="64" />
\t\t\t\t<Coordinate Order="3" X="128.5" Y="64" />
\t\t\t</Coordinates>
\t\t</Annotation>
\t\t<Annotation Name="Annotation 2" Type="Polygon" PartOfGroup="None" Color="#F4FA58">
\t\t\t<Coordinates>
\t\t\t\t<Coordinate Order="0" X="0" Y="0" /><Coordinate Order="1" X="500" Y="0" />
\t\t\t\t<Coordinate Order="2" X="500" Y="500" />
\t\t\t</Coordinates>
\t\t</Annotation>
\t</Annotations>
\t<AnnotationGroups>
\t\t<Group Name="Tumor" PartOfGroup="None" Color="#ff0000"><Attributes /></Group>
\t</AnnotationGroups>
</ASAP_Annotations>
"""


def test_an_asap_xml_file_reads_as_its_groups_classed_areas(tmp_path: Path) -> None:
    source = tmp_path / "tumor_001.xml"
    source.write_text(ASAP_EXPORT)
    annotations = read_annotations(source)
    assert [a.name for a in annotations] == ["Tumor", "Background"]  # the group is the class; "None" is none
    assert annotations[0].geometry.equals(shapely.box(0, 0, 64, 64))  # points in their Order
    assert annotations[1].geometry.equals(shapely.box(128.5, 0, 192.5, 64))
    assert [r.name for r in load_regions(source)] == ["Tumor", "Background", "Annotation 2"]


def test_asap_points_and_other_xml_are_refused_naming_the_file(tmp_path: Path) -> None:
    dots = tmp_path / "dots.xml"
    dots.write_text(
        '<ASAP_Annotations><Annotations><Annotation Name="cells" Type="PointSet" PartOfGroup="Tumor">'
        '<Coordinates><Coordinate Order="0" X="1" Y="2" /></Coordinates></Annotation></Annotations>'
        "</ASAP_Annotations>"
    )
    with pytest.raises(DataError, match=r"dots\.xml: feature 0: geometry 'MultiPoint' encloses no area"):
        read_annotations(dots)
    other = tmp_path / "other.xml"
    other.write_text("<Annotations><Region /></Annotations>")
    with pytest.raises(DataError, match=r"other\.xml: an XML file whose root is <Annotations>, not ASAP's"):
        read_annotations(other)
