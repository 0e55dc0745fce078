"""Results panel: heatmaps sit exactly on the pixels they score, and trained checkpoints give them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shapely

from bigslide.engine import run_to_end, train
from bigslide.engine.config import DataConfig, MethodConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig
from bigslide.explain.heatmap import ScoreGrid
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.regions import load_regions
from bigslide.wsi.slide import open_slide
from tests.gui.paint_order import PaintOrder
from tests.gui.test_train import FROZEN_MS, LoopGaps

TILE = 32


def lesion_grid(slide_path: str, lesions: list[shapely.Polygon]) -> tuple[ScoreGrid, TileGrid]:
    """Scores = the fraction of each tile covered by lesion (what a perfect attention map shows)."""
    with open_slide(slide_path) as slide:
        grid = TileGrid.from_slide(slide, TILE, min_tissue=0.0)
    union = shapely.union_all(lesions)
    x, y = grid.coords[:, 0].astype(float), grid.coords[:, 1].astype(float)
    boxes = shapely.box(x, y, x + TILE, y + TILE)
    fraction = shapely.area(shapely.intersection(boxes, union)) / TILE**2
    return ScoreGrid.from_tiles(grid.coords, fraction, TILE, mpp=grid.slide_mpp), grid


@pytest.mark.parametrize("shift", [(0.0, 0.0), (1234.5, -321.0)])
def test_heatmap_lands_on_the_lesion(viewer: Any, dock: Any, shift: tuple[float, float]) -> None:
    slide, lesions = viewer.open_sample("bigslide", "slide")
    slide.translate = shift  # a slide moved in the world takes its heatmap along
    polygons = [r.geometry for r in load_regions(lesions.metadata["path"])]
    scores, _grid = lesion_grid(slide.metadata["path"], polygons)
    panel = dock("Results")
    heatmap = panel.add_grid(scores, slide, "lesion fraction")
    np.testing.assert_allclose(heatmap.scale, (TILE * 0.5, TILE * 0.5))

    data = scores.scores
    top = np.argwhere(data >= 0.999)  # cells wholly inside a lesion
    assert len(top) >= 4
    union = shapely.union_all(polygons)
    for r, c in top:
        # the cell's centre and (nearly) its corners: heatmap data -> world -> slide level-0 pixels
        for dr, dc in ((0, 0), (-0.45, -0.45), (0.45, 0.45), (-0.45, 0.45), (0.45, -0.45)):
            world = heatmap.data_to_world((r + dr, c + dc))
            row, col = slide.world_to_data(world)
            # data coordinates of napari are pixel centres: level-0 pixel k spans [k - 0.5, k + 0.5)
            x, y = col + 0.5, row + 0.5
            assert union.contains(shapely.Point(x, y))
        # and exactly the tile the score came from
        world = heatmap.data_to_world((r, c))
        row, col = slide.world_to_data(world)
        x0 = scores.origin[0] + c * TILE
        y0 = scores.origin[1] + r * TILE
        np.testing.assert_allclose((col, row), (x0 + (TILE - 1) / 2, y0 + (TILE - 1) / 2), atol=1e-6)


def test_a_new_map_goes_under_the_outlines_drawn_before_it(viewer: Any, dock: Any) -> None:
    """The true lesions (as annotations, regions and the tile preview) stay on top of maps drawn after them:
    a map lies just above its slide and its other maps."""
    slide, lesions = viewer.open_sample("bigslide", "slide")
    scores, _grid = lesion_grid(
        slide.metadata["path"], [r.geometry for r in load_regions(lesions.metadata["path"])]
    )
    panel = dock("Results")
    first = panel.add_grid(scores, slide, "lesion fraction")
    second = panel.add_grid(scores, slide, "lesion fraction, again")
    order = [layer.name for layer in viewer.layers]  # bottom to top
    assert order == [slide.name, first.name, second.name, lesions.name], order
    assert viewer.layers.selection.active is second  # the newest map is the one chosen, as napari does
    assert second.visible
    assert not first.visible  # one map of a slide shown at a time


def test_a_slide_opened_again_goes_under_the_maps_and_outlines_it_left(
    viewer: Any, dock: Any, tiny_set: Path
) -> None:
    """Closing a slide leaves its maps and outlines; opening it again (beside another slide now) puts them
    on it where it lies, above it: a followed run's next map is drawn into that map layer."""
    slide, lesions = viewer.open_sample("bigslide", "slide")
    path = slide.metadata["path"]
    scores, _grid = lesion_grid(path, [r.geometry for r in load_regions(lesions.metadata["path"])])
    heatmap = dock("Results").add_grid(scores, slide, "lesion fraction")
    before = {layer.name: np.array(layer.translate[-2:]) for layer in (slide, heatmap, lesions)}
    viewer.layers.remove(slide)
    viewer.open(tiny_set.parent / "slide_001.svs", plugin="bigslide")  # another slide, where it was
    [again] = viewer.open(path, plugin="bigslide")
    order = [layer.name for layer in viewer.layers]  # bottom to top
    assert order.index(again.name) < order.index(heatmap.name) < order.index(lesions.name), order
    moved = np.array(again.translate[-2:]) - before[slide.name]
    assert moved[1] > 0  # beside the other slide now ...
    for overlay in (heatmap, lesions):  # ... and its overlays with it
        np.testing.assert_allclose(np.array(overlay.translate[-2:]) - before[overlay.name], moved)


def test_a_map_made_ahead_is_filled_in_place_and_dropped_when_its_run_fails(viewer: Any, dock: Any) -> None:
    """A retrain makes the slide's map layer ahead, empty and hidden; the run's map is drawn into it (no
    layer made as the run ends), and a run that fails first leaves no empty layer behind."""
    from bigslide.napari._layers import add_empty_heatmap, is_empty_heatmap

    slide, lesions = viewer.open_sample("bigslide", "slide")
    scores, _grid = lesion_grid(
        slide.metadata["path"], [r.geometry for r in load_regions(lesions.metadata["path"])]
    )
    panel = dock("Results")
    ahead = add_empty_heatmap(viewer, scores, slide, name="sample slide attention")
    assert is_empty_heatmap(ahead)
    assert not ahead.visible
    assert [layer.name for layer in viewer.layers].index(ahead.name) == 1  # on its slide, under the outlines
    drawn = panel.add_grid(scores, slide, "sample slide attention")
    assert drawn is ahead
    assert ahead.visible
    assert not is_empty_heatmap(ahead)
    np.testing.assert_array_equal(np.isnan(ahead.data), np.isnan(scores.scores))

    empty = add_empty_heatmap(viewer, scores, slide, name="sample slide attention, again")
    panel.retrain._on_error(RuntimeError("out of memory"))
    assert empty not in viewer.layers
    assert ahead in viewer.layers  # a drawn map stays


def test_display_controls_and_exports(viewer: Any, dock: Any, tmp_path: Path) -> None:
    slide, lesions = viewer.open_sample("bigslide", "slide")
    scores, grid = lesion_grid(
        slide.metadata["path"], [r.geometry for r in load_regions(lesions.metadata["path"])]
    )
    panel = dock("Results")
    heatmap = panel.add_grid(scores, slide, "lesion fraction")
    panel.heatmap_box.setCurrentText(heatmap.name)
    panel.colormap.setCurrentText("viridis")
    panel.opacity.setValue(80)
    panel.normalisation.setCurrentText("raw")
    assert heatmap.colormap.name == "viridis"
    assert heatmap.opacity == pytest.approx(0.8)
    np.testing.assert_array_equal(np.isnan(heatmap.data), np.isnan(scores.scores))
    np.testing.assert_allclose(
        heatmap.data[np.isfinite(heatmap.data)], scores.scores[np.isfinite(scores.scores)]
    )
    panel.normalisation.setCurrentText("rank")
    ranked = heatmap.data[np.isfinite(heatmap.data)]
    raw = scores.scores[np.isfinite(scores.scores)]
    assert ranked.min() >= 0.0
    assert ranked.max() <= 1.0
    order = np.argsort(raw, kind="stable")
    assert np.all(np.diff(ranked[order]) >= 0)  # ranks keep the scores' order

    png = panel.export_png(tmp_path / "overlay.png")
    npz = panel.export_npz(tmp_path / "grid.npz")
    geojson = panel.export_geojson(tmp_path / "tiles.geojson")
    assert png is not None
    assert png.stat().st_size > 1000
    loaded = ScoreGrid.load_npz(npz)
    np.testing.assert_array_equal(loaded.scores, scores.scores)
    tiles = load_regions(geojson)
    assert len(tiles) == np.isfinite(scores.scores).sum() == len(grid)


def unstated_copy(tiny_set: Path, make_slide: Any, name: str) -> Any:
    """The tiny set's first slide written again as a TIFF that states no pixel size (`make_slide`'s)."""
    with open_slide(tiny_set.parent / "slide_000.svs") as source:
        pixels = np.asarray(source.read_region((0, 0), 0, source.dimensions))[..., :3]
    return make_slide(pixels, flavour="tiff", mpp=None, name=name)


def tiny_checkpoint(tiny_set: Path, out: Path, method: str, params: dict[str, Any]) -> Path:
    config = TrainConfig(
        data=DataConfig(csv=str(tiny_set), tile_size=32, bag_size=8, image_size=64, augment=False),
        model=ModelConfig(backbone="resnet18"),
        method=MethodConfig(method, params),
        optim=OptimConfig(epochs=1, max_steps=1),
        run=RunConfig(out_dir=str(out), device="cpu"),
    )
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    return result.checkpoint


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        ("abmil_acc", {"hidden": 32, "attention_dim": 16}, {"attention"}),
        (
            "patchgd",
            {"patch_size": 32, "latent_dim": 16, "epsilon": 2, "encoder_bn": "frozen"},
            {"Z-block norm", "Z-block PCA"},
        ),
    ],
)
def test_checkpoint_heatmaps(
    viewer: Any,
    dock: Any,
    qtbot: Any,
    tiny_set: Path,
    tmp_path: Path,
    method: str,
    params: dict[str, Any],
    expected: set[str],
) -> None:
    checkpoint = tiny_checkpoint(tiny_set, tmp_path / "run", method, params)
    slide_path = tiny_set.parent / "slide_000.svs"
    [slide] = viewer.open(slide_path, plugin="bigslide")
    panel = dock("Results")
    panel.checkpoint.setText(str(checkpoint))
    panel.device.setCurrentText("cpu")
    for attempt in ("first", "again"):
        with LoopGaps() as gaps:
            began = time.perf_counter()
            worker = panel.run()
            assert worker is not None
            returned: list[float] = []
            worker.returned.connect(lambda _p, seen=returned: seen.append(time.perf_counter()))
            assert not panel.run_button.isEnabled()
            qtbot.waitUntil(panel.run_button.isEnabled, timeout=60_000)  # enabled again when all is drawn
        inferring, drawing = gaps.split(returned[0])
        print(
            f"{method} ({attempt}): longest event-loop gaps "
            f"inferring {inferring:.0f} ms, drawing {drawing:.0f} ms; "
            f"inference took {returned[0] - began:.2f} s"
        )
        assert inferring < FROZEN_MS, f"inference with {method} froze the viewer for {inferring:.0f} ms"
        if attempt == "again":  # the maps are redrawn in their layers; napari builds a new layer in ~0.15 s
            assert drawing < FROZEN_MS, f"redrawing {method}'s heatmaps froze the viewer for {drawing:.0f} ms"
    heatmaps = [layer for layer in viewer.layers if layer.metadata.get("bigslide_role") == "heatmap"]
    names = {layer.name.removeprefix(f"{slide.name} ") for layer in heatmaps}
    assert expected <= names, names
    assert panel.prediction.probs.sum() == pytest.approx(1.0, abs=1e-5)
    for layer in heatmaps:
        grid = layer.metadata["grid"]
        scale, translate = grid.layer_transform()
        np.testing.assert_allclose(layer.scale, scale)
        np.testing.assert_allclose(layer.translate, translate)
        # the map covers the slide, not beyond it by more than one cell
        corner = slide.world_to_data(layer.data_to_world(np.array(layer.data.shape[:2]) - 0.5))
        assert np.all(np.asarray(corner) <= np.array([512, 512]) + grid.cell_size_level0)
    if method == "abmil_acc":
        [attention] = heatmaps
        with open_slide(slide_path) as s:
            tiles = len(TileGrid.from_slide(s, 32, min_tissue=0.6))
        assert np.isfinite(attention.metadata["grid"].scores).sum() == tiles


def test_a_slide_scanned_coarser_than_the_model_reads_is_said_under_its_prediction(
    viewer: Any, dock: Any, tmp_path: Path
) -> None:
    from bigslide.engine.slide_prediction import SlidePrediction
    from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
    from bigslide.synthetic.slides import synthesize_slide

    panel = dock("Results")
    for mpp, said in ((1.0, True), (0.5, False)):
        path = tmp_path / f"scan_{mpp}.svs"
        tissue = synthesize_slide((256, 256), lesions=0, seed=1).rgb
        write_pyramid(path, downsample_pyramid(tissue, 2), mpp=mpp)
        [slide] = viewer.open(path, plugin="bigslide")
        prediction = SlidePrediction(path, np.array([0.3, 0.7]), ["normal", "tumor"], {}, read_mpp=0.5)
        panel.show_prediction(prediction, slide)
        text = panel.result.text()
        assert "<b>tumor</b>" in text
        assert ("scanned at 1 µm/px, coarser than the 0.5 µm/px the model reads" in text) == said


def test_a_runs_folder_typed_as_the_checkpoint_runs_its_latest_checkpoint(
    dock: Any, qtbot: Any, tmp_path: Path
) -> None:
    last = tmp_path / "my run" / "checkpoints" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    panel = dock("Results")
    qtbot.keyClicks(panel.checkpoint, str(tmp_path / "my run"))
    assert panel.chosen_checkpoint() == last
    panel.checkpoint.clear()
    qtbot.keyClicks(panel.checkpoint, str(tmp_path))  # a folder of runs: itself, refused when run
    assert panel.chosen_checkpoint() == tmp_path


def test_a_prediction_is_set_beside_the_label_the_slides_table_gives(
    viewer: Any, dock: Any, tmp_path: Path
) -> None:
    from bigslide.engine.slide_prediction import SlidePrediction
    from bigslide.napari._session import session_for
    from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
    from bigslide.synthetic.slides import synthesize_slide

    panel = dock("Results")
    path = tmp_path / "labelled.svs"
    write_pyramid(path, downsample_pyramid(synthesize_slide((256, 256), lesions=0, seed=2).rgb, 2), mpp=0.5)
    [slide] = viewer.open(path, plugin="bigslide")
    prediction = SlidePrediction(path, np.array([0.3, 0.7]), ["normal", "tumor"], {})
    session = session_for(viewer)
    for label, said in (
        ("normal", "Labelled <b>normal</b> in the Slides table: called tumor instead."),
        ("tumor", "Labelled <b>tumor</b> in the Slides table: called right."),
        ("", None),  # no label: nothing to set it against
    ):
        session.add(path)
        session.update(path, label=label, split="")
        panel.show_prediction(prediction, slide)
        text = panel.result.text()
        assert "<b>tumor</b> (normal 0.30, tumor 0.70)" in text
        assert (said in text) if said else ("Slides table" not in text)
    # where the slide sat in training is said: a slide the model learnt from proves little
    for split, note in (("train", "a training slide"), ("test", "a test slide, held out")):
        session.update(path, label="tumor", split=split)
        panel.show_prediction(prediction, slide)
        assert f"Labelled <b>tumor</b> in the Slides table ({note}" in panel.result.text()
    # the label of a case of several slides is the case's: the slide alone is said to be alone
    session.update(path, case="p7")
    panel.show_prediction(prediction, slide)
    assert "Case 'p7'" not in panel.result.text()  # one slide: the case is the slide
    other = tmp_path / "second.svs"
    session.add(other)
    session.update(other, label="tumor", case="p7")
    panel.show_prediction(prediction, slide)
    text = panel.result.text()
    assert "Labelled <b>tumor</b> for case 'p7' in the Slides table" in text
    assert "Case 'p7' has 2 slides: this is this slide alone" in text


def test_a_predictions_words_are_on_screen_before_napari_makes_its_map(
    viewer: Any, dock: Any, qtbot: Any
) -> None:
    """napari makes a map's layer on the GUI thread (a quarter second on two cores for the first): the
    prediction's line is painted before that, not after it."""
    from qtpy.QtWidgets import QScrollArea

    from bigslide.engine.slide_prediction import SlidePrediction

    window = viewer.window._qt_window
    window.setGeometry(0, 0, 1600, 1000)
    window.show()
    slide, lesions = viewer.open_sample("bigslide", "slide")
    scores, _grid = lesion_grid(
        slide.metadata["path"], [r.geometry for r in load_regions(lesions.metadata["path"])]
    )
    panel = dock("Results")
    qtbot.waitExposed(window)
    for area in panel.findChildren(QScrollArea):
        area.ensureWidgetVisible(panel.result)
    qtbot.waitUntil(lambda: not panel.result.visibleRegion().isEmpty(), timeout=5000)
    order = PaintOrder(viewer, [panel.result])
    path = Path(slide.metadata["path"])
    prediction = SlidePrediction(path, np.array([0.2, 0.8]), ["normal", "tumor"], {"attention": scores})
    panel.show_prediction(prediction, slide)
    qtbot.waitUntil(lambda: bool(order.layers()), timeout=10_000)
    order.stop()
    assert any("<b>tumor</b>" in text for text in order.painted_before_the_first_layer()), order.seen


def test_a_map_for_a_slide_closed_meanwhile_says_so(viewer: Any, dock: Any) -> None:
    slide, _lesions = viewer.open_sample("bigslide", "slide")
    panel = dock("Results")
    panel.result.setText(f"Running last.pt on {slide.name}…")
    viewer.layers.remove(slide)  # closed while its map was computed
    panel.show_prediction(object(), slide)
    assert panel.result.text() == f"{slide.name} was closed before its map was ready: no map drawn."


def test_a_slide_stating_no_pixel_size_is_refused_naming_the_slides_panel_field(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, make_slide: Any
) -> None:
    """The Results panel says where to type the scanner's µm/px, not the config key of the command line."""
    checkpoint = tiny_checkpoint(tiny_set, tmp_path / "run", "abmil_acc", {"hidden": 32, "attention_dim": 16})
    written = unstated_copy(tiny_set, make_slide, "unstated-results")
    viewer.open(written.path, plugin="bigslide")
    panel = dock("Results")
    panel.checkpoint.setText(str(checkpoint))
    panel.device.setCurrentText("cpu")
    assert panel.run() is not None
    qtbot.waitUntil(panel.run_button.isEnabled, timeout=60_000)
    text = panel.result.text()
    assert "'slide µm/px if unstated'" in text, text
    assert "data.slide_mpp" not in text


@pytest.mark.parametrize(
    ("tumour", "shown"), [(0.5454, "tumor 0.5454"), (0.5512, "tumor 0.55"), (0.30, "tumor 0.30")]
)
def test_probabilities_never_read_on_the_wrong_side_of_the_threshold(tumour: float, shown: str) -> None:
    """At two decimals 0.5454 reads 0.55, above a threshold of 0.5462 it is below: the line then
    contradicted its own call ("normal (normal 0.45, tumor 0.55)", "decision: P(tumor) >= 0.5462")."""
    from types import SimpleNamespace

    from bigslide.engine.decision import Decision
    from bigslide.napari._prediction_line import prediction_line

    decision = Decision(threshold=0.5462, source="validation", balanced_accuracy=1.0, epoch=2)
    label = "tumor" if tumour >= decision.threshold else "normal"
    prediction = SimpleNamespace(
        task="classification",
        classes=["normal", "tumor"],
        probs=[1 - tumour, tumour],
        label=label,
        epochs=3,
        thinned=1,
        decision=decision,
        read_mpp=1.0,
    )
    line = prediction_line(prediction, "slide_001", None, None)
    assert f"<b>{label}</b> (normal " in line
    assert f"{shown})" in line
    assert "P(tumor) >= 0.5462" in line
