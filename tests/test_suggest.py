"""Where to teach next: the places suggested from a model's attention, their reasons, the file QuPath
reads, and an answer turned into a teaching annotation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import shapely
import torch

from bigslide.cli.main import main
from bigslide.engine import train
from bigslide.errors import DataError
from bigslide.explain.heatmap import ScoreGrid
from bigslide.explain.suggest import (
    REVIEW_CLASS,
    SlideScores,
    Suggestion,
    flat_attention,
    normal_class,
    read_suggestions,
    save_answer,
    suggest,
    write_suggestions,
)
from bigslide.synthetic.slides import make_synthetic_slide
from bigslide.tiling.annotations import Annotation, label_tiles, read_annotations, write_annotations
from bigslide.tiling.regions import read_features
from tests.test_engine import drain, small_config

CELL = 64.0


def grid(scores: np.ndarray, origin: tuple[float, float] = (0.0, 0.0), name: str = "attention") -> ScoreGrid:
    return ScoreGrid(np.asarray(scores, np.float32), CELL, origin, None, name)


def flat(rows: int = 8, cols: int = 8, hot: dict[tuple[int, int], float] | None = None) -> np.ndarray:
    scores = np.full((rows, cols), 1.0 / (rows * cols), np.float32)
    for (r, c), v in (hot or {}).items():
        scores[r, c] = v
    return scores / scores.sum()


def test_a_normal_slides_strongest_attention_is_suggested_first_as_a_false_alarm() -> None:
    normal = SlideScores(Path("n.svs"), grid(flat(hot={(2, 5): 0.5, (6, 1): 0.2}, rows=8)), "normal")
    tumour = SlideScores(Path("t.svs"), grid(flat(hot={(4, 4): 0.3})), "tumor")
    places = suggest([normal, tumour], 4, normal="normal", area_tiles=1)
    first = places[0]
    assert first.slide == Path("n.svs")
    assert first.kind == "false_alarm"
    assert first.rank == 1
    assert first.box == (5 * CELL, 2 * CELL, 6 * CELL, 3 * CELL)  # the hottest cell of the normal slide
    assert first.reason.startswith("high attention (")
    assert first.reason.endswith("on a slide labelled normal")
    # the tumour slide's strongest tile is asked about too, as a question
    looked = [p for p in places if p.kind == "looked_at"]
    assert looked
    assert looked[0].slide == Path("t.svs")
    assert looked[0].reason.endswith("is it the lesion?")
    assert looked[0].box == (4 * CELL, 4 * CELL, 5 * CELL, 5 * CELL)
    assert [p.rank for p in places] == list(range(1, len(places) + 1))


def test_kinds_are_mixed_no_slide_takes_every_place_and_areas_do_not_overlap() -> None:
    rng = np.random.default_rng(0)
    slides = []
    for i in range(4):
        scores = rng.random((10, 10)).astype(np.float32) ** 4
        spread = rng.random((10, 10)).astype(np.float32) * 0.3
        slides.append(
            SlideScores(Path(f"s{i}.svs"), grid(scores), "normal" if i % 2 else "tumor", grid(spread))
        )
    places = suggest(slides, 8, normal="normal", area_tiles=3)
    assert len(places) == 8
    assert {p.kind for p in places} == {"false_alarm", "uncertain", "looked_at"}
    per_slide = {s.slide: sum(p.slide == s.slide for p in places) for s in slides}
    assert max(per_slide.values()) <= 4  # 2 x 8 places / 4 slides
    for i, a in enumerate(places):
        assert a.polygon.area == pytest.approx((3 * CELL) ** 2)
        for b in places[i + 1 :]:
            if a.slide == b.slide:
                assert a.polygon.intersection(b.polygon).area == 0
    uncertain = [p for p in places if p.kind == "uncertain"]
    assert all(p.slide in (Path("s0.svs"), Path("s2.svs")) for p in uncertain)  # not on normal slides
    assert all("dropout samples" in p.reason for p in uncertain)


def test_a_normal_slide_attended_evenly_is_asked_about_only_when_nothing_else_is_left() -> None:
    # the normal slide's strongest tile is 1.49x its mean: no false alarm; the tumour slide's is 2.2x
    even = SlideScores(Path("n.svs"), grid(flat(hot={(3, 3): 1.5 / 64})), "normal")
    peaked = SlideScores(Path("t.svs"), grid(flat(rows=2, cols=2, hot={(0, 0): 0.9})), "tumor")
    first, second = suggest([even, peaked], 2, normal="normal", area_tiles=1)
    assert (first.slide, first.kind) == (Path("t.svs"), "looked_at")
    # the tumour slide has one place above its mean: then the normal slide's turn comes, worded as weak
    assert (second.slide, second.kind) == (Path("n.svs"), "false_alarm")
    assert second.box == (3 * CELL, 3 * CELL, 4 * CELL, 4 * CELL)
    assert second.reason.startswith("attention (1.49x")
    # a normal slide that does attend strongly somewhere keeps its two turns in four
    alarmed = SlideScores(Path("a.svs"), grid(flat(hot={(5, 5): 0.4})), "normal")
    kinds = [p.kind for p in suggest([alarmed, peaked], 2, normal="normal", area_tiles=1)]
    assert kinds == ["false_alarm", "looked_at"]


def test_areas_already_annotated_are_skipped() -> None:
    scores = flat(hot={(2, 2): 0.5, (6, 6): 0.3})
    drawn = [Annotation(shapely.box(1 * CELL, 1 * CELL, 4 * CELL, 4 * CELL), "Not lesion")]
    slide = SlideScores(Path("n.svs"), grid(scores, origin=(0.0, 0.0)), "normal", annotations=drawn)
    places = suggest([slide], 1, normal="normal", area_tiles=3)
    assert places[0].box == (5 * CELL, 5 * CELL, 8 * CELL, 8 * CELL)  # the second hottest; the first is drawn


def test_attention_near_its_slides_mean_is_not_called_high() -> None:
    slide = SlideScores(Path("n.svs"), grid(flat(hot={(1, 1): 1.5 / 64})), "normal")  # 1.49x the mean
    (place,) = suggest([slide], 1, normal="normal", area_tiles=1)
    assert place.reason.startswith("attention (1.49x the slide's mean) on a slide labelled normal")


def test_a_model_that_attends_evenly_is_said_to_suggest_near_random_places() -> None:
    even = SlideScores(Path("n.svs"), grid(flat(hot={(1, 1): 1.5 / 64})), "normal")  # 1.49x the mean
    places = suggest([even], 1, normal="normal", area_tiles=1)
    note = flat_attention(places)
    assert note is not None
    assert "strongest place 1.49x its slide's mean, below 2x" in note
    assert "near random" in note
    peaked = SlideScores(Path("p.svs"), grid(flat(hot={(1, 1): 3.0 / 64})), "normal")
    assert flat_attention(suggest([peaked], 1, normal="normal", area_tiles=1)) is None
    assert flat_attention([]) is None


def test_without_a_normal_class_no_false_alarm_is_claimed_and_bad_counts_are_refused() -> None:
    slide = SlideScores(Path("n.svs"), grid(flat(hot={(1, 1): 0.4})), "normal")
    assert {p.kind for p in suggest([slide], 3, normal=None)} == {"looked_at"}
    assert normal_class(["tumor", "Normal"]) == "Normal"
    assert normal_class(["pos", "neg"]) == "neg"
    assert normal_class(["carcinoma", "Non-tumour"]) == "Non-tumour"
    assert normal_class(["a", "b"]) is None
    with pytest.raises(DataError, match="count"):
        suggest([slide], 0, normal=None)


def test_suggestions_are_qupath_geojson_of_a_class_bigslide_does_not_train_on(tmp_path: Path) -> None:
    places = [
        Suggestion(Path("/data/a.svs"), (0.0, 0.0, 192.0, 192.0), "false_alarm", "high attention", 3.2, 1),
        Suggestion(Path("/data/b.svs"), (64.0, 128.0, 256.0, 320.0), "uncertain", "uncertain: …", 0.2, 2),
    ]
    written = write_suggestions(places, tmp_path / "suggestions.geojson")
    assert written[0] == tmp_path / "suggestions.geojson"
    assert [p.name for p in written[1:]] == ["a.suggestions.geojson", "b.suggestions.geojson"]
    assert read_suggestions(written[0]) == places
    assert read_suggestions(written[2]) == places[1:]  # one slide's file, for QuPath's import
    features = read_features(written[0], "suggestions", DataError)
    assert features[0]["properties"]["classification"]["name"] == REVIEW_CLASS
    assert features[0]["properties"]["name"] == "1. high attention"  # what QuPath lists
    assert features[0]["geometry"]["type"] == "Polygon"
    assert read_annotations(written[0]) == []  # not a teaching annotation until answered
    (tmp_path / "other.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": [{}]}))
    with pytest.raises(DataError, match=r"other\.geojson: feature 0"):
        read_suggestions(tmp_path / "other.geojson")


def test_an_answer_becomes_a_teaching_annotation_beside_those_drawn(tmp_path: Path) -> None:
    file = tmp_path / "annotations" / "a.svs.annotations.geojson"
    drawn = Annotation(shapely.box(1000, 1000, 1100, 1100), "tumor")
    write_annotations([drawn], file, ["normal", "tumor"])
    place = Suggestion(Path("a.svs"), (0.0, 0.0, 192.0, 192.0), "false_alarm", "high attention", 2.0, 1)
    save_answer(place, "Not lesion", file, ["normal", "tumor"])
    saved = read_annotations(file)
    assert [a.name for a in saved] == ["tumor", "Not lesion"]
    assert saved[1].geometry.equals(place.polygon)
    coords = np.array([[0, 0], [64, 64], [128, 128], [192, 192], [1000, 1000]])
    labels = label_tiles(saved, coords, 64, ["normal", "tumor", "Not lesion"])
    assert labels.tolist() == [2, 2, 2, -1, 1]  # the answered area's tiles now teach "Not lesion"
    with pytest.raises(DataError, match="answer: class 'stroma'"):
        save_answer(place, "stroma", file, ["normal", "tumor"])
    save_answer(place, "tumor", tmp_path / "new" / "b.geojson")  # a slide without annotations yet
    assert [a.name for a in read_annotations(tmp_path / "new" / "b.geojson")] == ["tumor"]


def test_the_attention_spread_is_the_same_map_twice_and_zero_for_a_head_that_ignores_features() -> None:
    from bigslide.engine.setup import build_method
    from bigslide.methods.mil import MILMethod

    config = small_config(Path("unused.csv"), Path("unused"), "abmil_acc", hidden=16, chunk_size=4)
    config.model.backbone = "test_resnet"
    method = build_method(config, ["normal", "tumor"], torch.device("cpu"), stain=None)
    assert isinstance(method, MILMethod)
    z = torch.randn(30, method.mil_model.encoder.dim)
    spread = method.attention_spread(z, 8)
    assert spread.shape == (30,)
    assert np.all(spread >= 0)
    assert np.all(spread <= 0.5)
    assert spread.max() > 0
    np.testing.assert_array_equal(spread, method.attention_spread(z, 8))
    for p in method.mil_model.aggregator.parameters():
        p.data.zero_()  # every tile scored alike: ranks follow the index, whatever dropout draws
    assert method.attention_spread(z, 8).max() == 0


def test_suggest_from_a_checkpoint_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(4):
        make_synthetic_slide(tmp_path / f"s{i}.svs", size=(512, 384), lesions=i % 2, seed=50 + i)
    labels = ["normal", "tumor"]
    table = tmp_path / "slides.csv"
    table.write_text(
        "slide,label,split\n"
        + "".join(f"s{i}.svs,{labels[i % 2]},{'val' if i == 3 else 'train'}\n" for i in range(4))
    )
    c = small_config(table, tmp_path / "run", "abmil_acc", hidden=16, chunk_size=4)
    c.model.backbone, c.optim.epochs, c.run.tensorboard = "test_resnet", 1, False
    checkpoint = drain(train(c))[1].checkpoint
    # a Not-lesion outline saved beside the table, as the napari panel does, over all of slide 0
    write_annotations(
        [Annotation(shapely.box(0, 0, 512, 384), "Not lesion")],
        tmp_path / "annotations" / "s0.svs.annotations.geojson",
    )
    out = tmp_path / "suggestions.geojson"
    code = main(
        [
            "suggest",
            "--checkpoint",
            str(checkpoint),
            "--slides",
            str(table),
            "--count",
            "6",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    places = read_suggestions(out)
    assert 1 <= len(places) <= 6
    slides = {p.slide.name for p in places}
    assert slides <= {"s1.svs", "s2.svs"}  # training rows only; slide 0 is annotated all over
    assert any(p.kind == "false_alarm" and p.slide.name == "s2.svs" for p in places)
    said = capsys.readouterr().out
    assert f"suggestions on {len(slides)} slide" in said
    assert "1. s" in said
    assert "no class is named as lesion-free" not in said  # "normal" is
    if len(places) < 6:
        assert f"note: only {len(places)} place" in said
    assert (
        main(
            [
                "suggest",
                "--checkpoint",
                str(checkpoint),
                "--slides",
                str(table),
                "--normal-class",
                "x",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert "normal: 'x' is none of the model's classes" in capsys.readouterr().err
