"""Overlays sit exactly on the tissue they score, on every slide: stated µm/px, the user's fallback for a
file that states none, and another scanner's 0.25 µm/px, side by side in one µm world.

The truth is the exported PNG (`overlay_png`), which maps thumbnail pixels to grid cells from level-0
coordinates alone; the canvas must show the same cell over the same level-0 pixels.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from bigslide.explain.heatmap import ScoreGrid
from bigslide.napari._placement import placement_of
from bigslide.napari._roles import slide_layers
from tests.gui.test_results import (  # imports torch before any viewer exists (Mesa/triton)
    tiny_checkpoint,
    unstated_copy,
)

CELL = 48  # level-0 px per heatmap cell


def distinct_grid(shape: tuple[int, int], origin: tuple[float, float], seed: int) -> ScoreGrid:
    """Every cell a different score (some missing), so a cell one off shows a different colour."""
    rng = np.random.default_rng(seed)
    scores = rng.permutation(shape[0] * shape[1]).reshape(shape).astype(np.float32)
    scores[rng.random(shape) < 0.15] = np.nan
    return ScoreGrid(scores, float(CELL), origin, None, "scores")


def canvas_cells(slide: Any, heatmap: Any, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of the heatmap cell napari draws over level-0 positions (x, y), through world µm."""
    # level-0 position p lies in pixel floor(p); napari's data coordinate of that pixel's centre is p - 0.5
    data = np.stack([y - 0.5, x - 0.5], axis=1)
    # translate + scale · data on all points at once, checked against napari's own transform on a probe
    world = np.asarray(slide.translate) + np.asarray(slide.scale) * data
    cells = (world - np.asarray(heatmap.translate)) / np.asarray(heatmap.scale)
    probe = len(data) // 2
    np.testing.assert_allclose(world[probe], slide.data_to_world(data[probe]))
    np.testing.assert_allclose(cells[probe], heatmap.world_to_data(world[probe]))
    return np.floor(cells[:, 0] + 0.5).astype(int), np.floor(cells[:, 1] + 0.5).astype(int)


def assert_canvas_matches_png(slide: Any, heatmap: Any, png: Path, grid: ScoreGrid) -> int:
    """Every thumbnail pixel of the PNG lies under the cell whose colour the PNG gives it."""
    image = np.asarray(Image.open(png).convert("L"), dtype=np.float64)
    th, tw = image.shape
    w0, h0 = (d for d in slide.metadata["level_dimensions"][0])
    # the PNG's own rule: pixel (r, c) shows the level-0 point at its centre
    rr, cc = np.meshgrid(np.arange(th), np.arange(tw), indexing="ij")
    x = ((cc + 0.5) * w0 / tw).ravel()
    y = ((rr + 0.5) * h0 / th).ravel()
    col_png = (x - grid.origin[0]) / CELL
    row_png = (y - grid.origin[1]) / CELL
    # skip the few pixels whose centre falls on a cell border (either side is right there)
    clear = (np.abs(col_png - np.round(col_png)) > 1e-3) & (np.abs(row_png - np.round(row_png)) > 1e-3)
    rows, cols = grid.scores.shape
    inside = clear & (row_png >= 0) & (row_png < rows) & (col_png >= 0) & (col_png < cols)
    r_png, c_png = np.floor(row_png[inside]).astype(int), np.floor(col_png[inside]).astype(int)
    scored = np.isfinite(grid.scores[r_png, c_png])
    r_canvas, c_canvas = canvas_cells(slide, heatmap, x[inside], y[inside])
    np.testing.assert_array_equal(r_canvas, r_png)
    np.testing.assert_array_equal(c_canvas, c_png)
    # and the colour there is that cell's: gray, min-max over the scored cells, drawn opaque
    values = grid.scores[r_png[scored], c_png[scored]]
    finite = grid.scores[np.isfinite(grid.scores)]
    expected = np.round((values - finite.min()) / np.ptp(finite) * 255)
    np.testing.assert_allclose(image.ravel()[inside][scored], expected, atol=1.0)
    return int(scored.sum())


@pytest.fixture
def three_slides(make_slide: Any, slide_image: np.ndarray) -> dict[str, Any]:
    return {
        "stated 0.5": make_slide(slide_image, flavour="svs", mpp=0.5, name="stated"),
        "unstated": make_slide(slide_image[:800, :1100], flavour="tiff", mpp=None, name="unstated"),
        "stated 0.25": make_slide(slide_image[:900], flavour="tiff", mpp=0.25, name="scanner-025"),
    }


def test_overlays_cover_the_pngs_pixels_on_every_slide(
    viewer: Any, dock: Any, three_slides: dict[str, Any], tmp_path: Path
) -> None:
    slides_panel = dock("Slides")
    results = dock("Results")
    results.colormap.setCurrentText("gray")
    results.normalisation.setCurrentText("raw")
    results.opacity.setValue(100)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*nconsistent units.*")
        [unstated] = viewer.open(three_slides["unstated"].path, plugin="bigslide")
        assert [str(u) for u in unstated.units] == ["micrometer", "micrometer"]  # provisional 1 µm/px
        np.testing.assert_allclose(unstated.scale, (1.0, 1.0))
        slides_panel.slide_mpp.setValue(0.5)  # the panel's "slide µm/px if unstated"
        assert [str(u) for u in unstated.units] == ["micrometer", "micrometer"]
        np.testing.assert_allclose(unstated.scale, (0.5, 0.5))
        [stated] = viewer.open(three_slides["stated 0.5"].path, plugin="bigslide")
        [fine] = viewer.open(three_slides["stated 0.25"].path, plugin="bigslide")
        np.testing.assert_allclose(fine.scale, (0.25, 0.25))

        grids, heatmaps = {}, {}
        for seed, layer in enumerate((unstated, stated, fine)):
            w0, h0 = layer.metadata["level_dimensions"][0]
            origin = (float(CELL * 2 + 7), float(CELL + 3))  # not on the cell lattice of (0, 0)
            shape = ((h0 - int(origin[1])) // CELL, (w0 - int(origin[0])) // CELL)
            grids[layer.name] = distinct_grid(shape, origin, seed)
            heatmaps[layer.name] = results.add_grid(grids[layer.name], layer, f"{layer.name} scores")
        for layer in viewer.layers:
            assert [str(u) for u in layer.units] == ["micrometer", "micrometer"], layer.name

    # side by side in the world, at each slide's physical size, never on top of each other
    boxes = sorted((s.extent.world[:, 1] for s in slide_layers(viewer)), key=lambda b: b[0])
    for left, right in itertools.pairwise(boxes):
        assert left[1] < right[0]
    width_um = {s.name: float(np.ptp(s.extent.world[:, 1])) for s in slide_layers(viewer)}
    assert width_um["stated"] == pytest.approx(1300 * 0.5, abs=1)
    assert width_um["scanner-025"] == pytest.approx(1300 * 0.25, abs=1)
    assert width_um["unstated"] == pytest.approx(1100 * 0.5, abs=1)

    for layer in (unstated, stated, fine):
        heatmap = heatmaps[layer.name]
        results.heatmap_box.setCurrentText(heatmap.name)
        png = results.export_png(tmp_path / f"{layer.name}.png")
        assert png is not None
        assert assert_canvas_matches_png(layer, heatmap, png, grids[layer.name]) > 1000

    # a new fallback moves the unstated slide's overlay with it: same level-0 pixels, new µm
    slides_panel.slide_mpp.setValue(0.25)
    np.testing.assert_allclose(unstated.scale, (0.25, 0.25))
    assert placement_of(unstated).mpp == (0.25, 0.25)
    results.heatmap_box.setCurrentText(heatmaps["unstated"].name)
    png = results.export_png(tmp_path / "unstated-0.25.png")
    assert assert_canvas_matches_png(unstated, heatmaps["unstated"], png, grids["unstated"]) > 1000
    # moving a slide carries its overlay
    unstated.translate = (100.0, -5000.0)
    assert assert_canvas_matches_png(unstated, heatmaps["unstated"], png, grids["unstated"]) > 1000


def test_a_heatmap_from_a_checkpoint_lands_on_an_unstated_slide(
    viewer: Any, dock: Any, qtbot: Any, tiny_set: Path, tmp_path: Path, make_slide: Any
) -> None:
    """The reported case: a slide with no µm/px given 0.5 in the panel, its attention from Results."""
    checkpoint = tiny_checkpoint(tiny_set, tmp_path / "run", "abmil_acc", {"hidden": 32, "attention_dim": 16})
    written = unstated_copy(tiny_set, make_slide, "tcga-like")
    dock("Slides").slide_mpp.setValue(0.5)
    [slide] = viewer.open(written.path, plugin="bigslide")
    panel = dock("Results")
    panel.checkpoint.setText(str(checkpoint))
    panel.device.setCurrentText("cpu")
    assert panel.run() is not None
    qtbot.waitUntil(panel.run_button.isEnabled, timeout=60_000)
    [attention] = [layer for layer in viewer.layers if layer.metadata.get("bigslide_role") == "heatmap"]
    grid = attention.metadata["grid"]
    # every scored cell's centre is the centre of the level-0 tile it scores, in world µm
    for r, c in np.argwhere(np.isfinite(grid.scores)):
        row, col = slide.world_to_data(attention.data_to_world((r, c)))
        centre_x = grid.origin[0] + (c + 0.5) * grid.cell_size_level0
        centre_y = grid.origin[1] + (r + 0.5) * grid.cell_size_level0
        np.testing.assert_allclose((col + 0.5, row + 0.5), (centre_x, centre_y), atol=1e-6)
    corner = slide.world_to_data(attention.data_to_world(np.array(attention.data.shape) - 0.5))
    assert np.all(np.asarray(corner) <= np.array(written.levels[0].shape[:2]) + grid.cell_size_level0)
    assert "(" in panel.result.text()  # the outcome, not "Running …"


def world_boxes(viewer: Any) -> dict[str, tuple[float, float]]:
    """(left, right) world µm of every slide, by name."""
    return {
        s.name: (float(s.extent.world[0][-1]), float(s.extent.world[1][-1])) for s in slide_layers(viewer)
    }


@pytest.mark.parametrize("panels_first", [False, True])
def test_slides_open_side_by_side_in_either_order_and_move_when_a_pixel_size_is_typed(
    viewer: Any,
    dock: Any,
    qtbot: Any,
    three_slides: dict[str, Any],
    notifications: list[Any],
    panels_first: bool,
) -> None:
    from tests.gui.test_typed_numbers import type_into

    if panels_first:
        slides_panel = dock("Slides")
    for key in ("unstated", "stated 0.5", "stated 0.25"):
        viewer.open(three_slides[key].path, plugin="bigslide")
        qtbot.wait(50)  # napari checks the layers' units when it next draws
    if not panels_first:
        slides_panel = dock("Slides")
    qtbot.wait(50)
    assert viewer.layers.extent.units is not None  # one unit for all: napari keeps using it
    boxes = world_boxes(viewer)
    order = sorted(boxes, key=lambda name: boxes[name][0])
    assert order == ["unstated", "stated", "scanner-025"]  # opened left to right
    for left, right in itertools.pairwise(order):
        assert boxes[left][1] < boxes[right][0]
    assert boxes["unstated"][1] - boxes["unstated"][0] == pytest.approx(1100 * 1.0, abs=1)  # provisional
    gaps = [boxes[b][0] - boxes[a][1] for a, b in itertools.pairwise(order)]
    # marked as waiting: in a notification and in its Slides row
    assert any("unstated" in str(n.message) and "no pixel size" in str(n.message) for n in notifications)
    row = next(i for i, r in enumerate(slides_panel.session.rows) if r.path.name.startswith("unstated"))
    assert slides_panel.table.item(row, slides_panel.column("µm/px")).text() == "missing"

    type_into(qtbot, slides_panel.slide_mpp, "0.5")
    boxes = world_boxes(viewer)
    assert boxes["unstated"][1] - boxes["unstated"][0] == pytest.approx(1100 * 0.5, abs=1)
    # the slides to its right moved with its right edge: the same gaps, no overlap, no hole
    assert [boxes[b][0] - boxes[a][1] for a, b in itertools.pairwise(order)] == pytest.approx(gaps, abs=1e-6)
    assert slides_panel.table.item(row, slides_panel.column("µm/px")).text() == "0.5 (typed)"
    qtbot.wait(50)
    assert not any("nconsistent units" in str(n.message) for n in notifications)


def test_a_comparison_stands_just_left_of_its_slide_and_fills_the_canvas_however_many_slides_are_open(
    viewer: Any, dock: Any, qtbot: Any, three_slides: dict[str, Any]
) -> None:
    """The retrained slide is the rightmost of two: its "before" copy goes just left of it, the slide on
    its left (and its map) makes room, and the pair is what the canvas shows; closing the comparison puts
    the slide on the left back."""
    from bigslide.napari._compare import (
        COMPARISON,
        beside_steps,
        caption,
        frame,
        give_back_room_steps,
        removal_steps,
    )
    from bigslide.napari._placement import SLIDE_GAP
    from bigslide.napari._roles import layers_with_role

    results = dock("Results")
    for key in ("stated 0.5", "stated 0.25"):
        viewer.open(three_slides[key].path, plugin="bigslide")
    [first, slide] = slide_layers(viewer)
    heat = results.add_grid(distinct_grid((8, 8), (0.0, 0.0), seed=4), first, f"{first.name} scores")
    qtbot.wait(50)
    first_box, heat_box = world_boxes(viewer)[first.name], np.array(heat.extent.world)
    assert first_box[1] < float(slide.extent.world[0][-1])  # side by side, the retrained one on the right

    for _ in beside_steps(viewer, slide, distinct_grid((8, 8), (0.0, 0.0), seed=5), "before retraining"):
        pass
    path = slide.metadata["path"]
    caption(viewer, slide, "after retraining", path)
    copy = viewer.layers[f"{slide.name} — before retraining"]
    width = float(np.ptp(slide.extent.world[:, -1]))
    copy_left, copy_right = (float(v) for v in copy.extent.world[:, -1])
    slide_left, slide_right = (float(v) for v in slide.extent.world[:, -1])
    assert copy_right + SLIDE_GAP * width == pytest.approx(slide_left, rel=1e-9)  # just left of it
    np.testing.assert_allclose(copy.extent.world[:, -2], slide.extent.world[:, -2])  # in its row
    moved = world_boxes(viewer)[first.name]
    assert moved[1] + SLIDE_GAP * width <= copy_left + 1e-6  # the slide on the left made room
    shift = moved[0] - first_box[0]
    assert shift < 0
    assert moved[1] - moved[0] == pytest.approx(first_box[1] - first_box[0])  # moved, not resized
    # its map moved with it
    np.testing.assert_allclose(heat.extent.world, heat_box + np.array([[0, shift], [0, shift]]))

    frame(viewer, [slide, *layers_with_role(viewer, COMPARISON, path)])
    qtbot.wait(50)
    height, canvas_width = viewer.canvas.size
    camera = viewer.scene.camera
    shown_x = canvas_width / camera.zoom  # world µm across the canvas
    centre_x = float(camera.center[-1])
    assert centre_x - shown_x / 2 <= copy_left
    assert slide_right <= centre_x + shown_x / 2
    pair_height = 1.25 * float(np.ptp(slide.extent.world[:, -2]))  # with the captions above
    assert min(shown_x / (slide_right - copy_left), height / camera.zoom / pair_height) < 1.1  # filled

    # retrained again: the new copy takes the same room, and nothing moves further
    for _ in beside_steps(viewer, slide, distinct_grid((8, 8), (0.0, 0.0), seed=6), "before retraining"):
        pass
    assert world_boxes(viewer)[first.name] == pytest.approx(moved)
    assert viewer.layers[f"{slide.name} — before retraining"].extent.world[0][-1] == pytest.approx(copy_left)

    for _ in itertools.chain(give_back_room_steps(viewer), removal_steps(viewer, COMPARISON)):
        pass
    assert not layers_with_role(viewer, COMPARISON)
    assert world_boxes(viewer)[first.name] == pytest.approx(first_box)
    np.testing.assert_allclose(heat.extent.world, heat_box)
