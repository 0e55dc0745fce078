"""Sampling regions: drawn in level-0 pixels on the slide, saved as QuPath GeoJSON, previewed as tiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shapely

from bigslide.napari._session import scale_bar_of
from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.regions import Region, load_regions, save_regions
from bigslide.wsi.slide import open_slide
from tests.gui.test_typed_numbers import type_into
from tests.test_focus_rule import PATCH, soft_scan_with_a_blurred_patch


def test_sample_slide_and_lesions(viewer: Any) -> None:
    layers = viewer.open_sample("bigslide", "slide")
    slide, lesions = layers
    assert slide.multiscale
    assert slide.metadata["levels"] == 3
    assert lesions.metadata["bigslide_role"] == "lesions"
    np.testing.assert_allclose(lesions.scale, slide.scale)
    assert lesions.units == slide.units
    # lesion vertices are level-0 pixels: they lie on the lesion file's polygons
    truth = load_regions(lesions.metadata["path"])
    for shape, region in zip(lesions.data, truth):
        np.testing.assert_allclose(shape[:, ::-1], np.asarray(region.geometry.exterior.coords)[:-1])


def test_draw_save_load_regions(viewer: Any, dock: Any, tmp_path: Path, svs_slide: Any) -> None:
    [slide] = viewer.open(svs_slide.path, plugin="bigslide")
    panel = dock("Sampling regions")
    layer = panel.new_regions_layer()
    assert layer.mode == "add_polygon"
    np.testing.assert_allclose(layer.scale, slide.scale)
    # a user clicks at world positions (µm); napari stores them through the layer's scale
    world = np.array([[50.0, 40.0], [50.0, 400.0], [300.0, 400.0], [300.0, 40.0]])
    layer.add_polygons([layer.world_to_data(p) for p in world])
    saved = panel.save_geojson(tmp_path / "regions.geojson")
    assert saved is not None
    [region] = load_regions(saved)
    xy = np.asarray(region.geometry.exterior.coords)[:-1]
    # µm -> level-0 (x, y) at 0.5 µm/px; world 0 is the centre of pixel 0, i.e. level-0 position 0.5
    expected = world[:, ::-1] / svs_slide.mpp + 0.5
    np.testing.assert_allclose(np.sort(xy, axis=0), np.sort(expected, axis=0))
    assert panel.session.row(svs_slide.path).regions == saved.resolve()

    # a fresh layer loaded from the file has the same vertices
    viewer.layers.remove(layer)
    loaded = panel.load_geojson(saved)
    np.testing.assert_allclose(np.sort(loaded.data[0][:, ::-1], axis=0), np.sort(expected, axis=0))

    # regions of another, larger slide: refused naming where they lie, and the table keeps its file
    far = tmp_path / "another-slide.geojson"
    save_regions([Region(shapely.box(90_000, 90_000, 91_000, 91_000))], far)
    assert panel.load_geojson(far) is None
    assert "x 90000..91000, y 90000..91000 lies outside the slide" in panel.status.text(), panel.status.text()
    assert panel.session.row(svs_slide.path).regions == saved.resolve()

    # the slide closed with its regions drawn: Save says where they wait, and writes nothing
    viewer.layers.remove(slide)
    assert panel.save_geojson(tmp_path / "closed.geojson") is None
    assert panel.status.text().startswith(f"Nothing saved: the areas in '{loaded.name}' belong to "), (
        panel.status.text()
    )
    assert not (tmp_path / "closed.geojson").exists()


def test_the_tile_preview_follows_the_slides_panel_and_a_slide_without_pixel_size_once_given_one(
    viewer: Any, dock: Any, qtbot: Any, tmp_path: Path
) -> None:
    image = synthesize_slide((1024, 768), lesions=1, seed=8).rgb
    path = write_pyramid(tmp_path / "unstated.tif", downsample_pyramid(image, 2), mpp=None, tile=256)
    [slide] = viewer.open(path, plugin="bigslide")
    slides, panel = dock("Slides"), dock("Sampling regions")
    panel.slide_box.setCurrentText(slide.name)
    panel.preview.setChecked(True)
    qtbot.waitUntil(lambda: panel.status.text().startswith("Tile preview failed"), timeout=90_000)
    assert "'slide µm/px if unstated'" in panel.status.text()

    def tiles() -> Any:
        return next((lay for lay in viewer.layers if lay.metadata.get("bigslide_role") == "tiles"), None)

    type_into(qtbot, slides.slide_mpp, "0.5")  # what the failure asked for: the preview follows
    qtbot.waitUntil(lambda: tiles() is not None, timeout=90_000)
    assert "will be sampled" in panel.status.text(), panel.status.text()
    before = len(tiles().data)
    type_into(qtbot, slides.tile_size, str(2 * panel.session.tile_size))
    qtbot.waitUntil(lambda: tiles() is not None and 0 < len(tiles().data) < before, timeout=90_000)


def test_tile_preview_follows_regions(viewer: Any, dock: Any, qtbot: Any) -> None:
    slide, _ = viewer.open_sample("bigslide", "slide")
    panel = dock("Sampling regions")
    layer = panel.new_regions_layer()
    box = np.array([[200.0, 300.0], [200.0, 1500.0], [1400.0, 1500.0], [1400.0, 300.0]])  # level-0 (row, col)
    layer.add_polygons([box])
    panel.session.tile_size = 128
    with qtbot.waitSignal(panel.preview.toggled):
        panel.preview.setChecked(True)
    qtbot.waitUntil(
        lambda: any(lay.metadata.get("bigslide_role") == "tiles" for lay in viewer.layers), timeout=30_000
    )
    tiles = next(lay for lay in viewer.layers if lay.metadata.get("bigslide_role") == "tiles")
    with open_slide(slide.metadata["path"]) as s:
        from bigslide.tiling.regions import Region

        polygon = shapely.Polygon(box[:, ::-1])
        grid = TileGrid.from_slide(s, 128, min_tissue=panel.session.min_tissue, regions=[Region(polygon)])
    assert 0 < len(tiles.data) == len(grid)
    np.testing.assert_allclose(tiles.scale, slide.scale)
    for rect in tiles.data:
        centre = rect.mean(axis=0)[::-1]
        assert polygon.contains(shapely.Point(centre))
    assert viewer.layers.selection.active.name == layer.name  # drawing can go on
    panel.preview.setChecked(False)
    assert not any(lay.metadata.get("bigslide_role") == "tiles" for lay in viewer.layers)


def test_an_area_to_leave_out_is_saved_as_qupaths_ignore_class_and_read_back(
    viewer: Any, dock: Any, tmp_path: Path, svs_slide: Any, qtbot: Any
) -> None:
    viewer.open(svs_slide.path, plugin="bigslide")
    panel = dock("Sampling regions")
    panel.exclude_button.click()
    layer = viewer.layers.selection.active
    assert layer.metadata["bigslide_role"] == "exclusions"
    assert layer.mode == "add_polygon"
    square = np.array([[100.0, 100.0], [100.0, 400.0], [400.0, 400.0], [400.0, 100.0]])  # level-0 (row, col)
    layer.add_polygons([square])
    # drawn so it reads on H&E: a wide cyan outline over a dark veil, unlike the green sampling regions
    np.testing.assert_allclose(layer.edge_color[0], [0, 229 / 255, 1, 1], atol=1e-3)
    assert 0 < layer.face_color[0][3] < 0.5
    assert layer.edge_width[0] >= 6
    qtbot.waitUntil(lambda: scale_bar_of(viewer).visible)  # sizes read off the bar from the first slide on
    saved = panel.save_geojson(tmp_path / "left-out.geojson")
    assert saved is not None
    [region] = load_regions(saved)
    assert region.name == "Ignore*"
    assert region.excluded()

    viewer.layers.remove(layer)
    loaded = panel.load_geojson(saved)
    assert loaded.metadata["bigslide_role"] == "exclusions"
    np.testing.assert_allclose(np.sort(loaded.data[0], axis=0), np.sort(square, axis=0))


@pytest.fixture(scope="module")
def marked_slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bigslide.synthetic.marks import synthesize_marked_slide
    from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid

    marked = synthesize_marked_slide((768, 768), seed=31, mpp=2.0, inks=("blue", "green"))
    path = tmp_path_factory.mktemp("marked") / "marked.tif"
    return write_pyramid(path, downsample_pyramid(marked.rgb, 4), mpp=2.0, flavour="tiff")


def _preview(viewer: Any, dock: Any, qtbot: Any, path: Path) -> tuple[Any, Any, Any, TileGrid]:
    """Open the slide at `path`, tick the Sampling regions panel's tile preview and wait for its layer of
    tiles left out: (slide layer, panel, that layer, the grid the panel's tiling makes)."""
    [slide] = viewer.open(path, plugin="bigslide")
    panel = dock("Sampling regions")
    with qtbot.waitSignal(panel.preview.toggled):
        panel.preview.setChecked(True)
    qtbot.waitUntil(lambda: any(lay.metadata.get("left_out") for lay in viewer.layers), timeout=30_000)
    left_out = next(lay for lay in viewer.layers if lay.metadata.get("left_out"))
    s = panel.session
    with open_slide(path) as opened:
        grid = TileGrid.from_slide(opened, s.tile_size, target_mpp=s.target_mpp, min_tissue=s.min_tissue)
    return slide, panel, left_out, grid


def test_tile_preview_shows_the_tiles_left_out_in_another_colour(
    viewer: Any, dock: Any, qtbot: Any, marked_slide: Path
) -> None:
    slide, panel, left_out, grid = _preview(viewer, dock, qtbot, marked_slide)
    kept = next(
        lay for lay in viewer.layers if lay.metadata.get("bigslide_role") == "tiles" and lay is not left_out
    )
    assert kept.metadata["count"] == len(grid)
    assert grid.check.ink > 50
    labels = np.asarray(left_out.data)
    assert (labels == 1).sum() == grid.check.ink  # one cell per tile left out for ink (magenta)
    np.testing.assert_allclose(
        left_out.colormap.map(1)[:3], [0xE6 / 255, 0, 0xC8 / 255], atol=0.01
    )  # magenta
    np.testing.assert_allclose(left_out.scale, np.asarray(slide.scale) * grid.tile_size_level0)
    assert "for ink (magenta)" in panel.status.text()
    panel.preview.setChecked(False)
    assert not any(lay.metadata.get("bigslide_role") == "tiles" for lay in viewer.layers)


def test_saving_an_empty_leave_out_layer_names_that_layer(
    viewer: Any, dock: Any, tmp_path: Path, svs_slide: Any, notifications: list[Any]
) -> None:
    viewer.open(svs_slide.path, plugin="bigslide")
    panel = dock("Sampling regions")
    assert panel.save_geojson(tmp_path / "none.geojson") is None  # nothing made yet: say which buttons
    errors = [n.message for n in notifications if n.severity == "error"]
    assert "'New sampling regions' or 'New areas to leave out'" in errors[-1]
    panel.exclude_button.click()
    layer = viewer.layers.selection.active
    assert panel.save_geojson(tmp_path / "empty.geojson") is None
    errors = [n.message for n in notifications if n.severity == "error"]
    assert f"outline areas in '{layer.name}'" in errors[-1]  # the layer the person made, not another button
    assert "New sampling regions" not in errors[-1]
    assert not (tmp_path / "empty.geojson").exists()


@pytest.fixture(scope="module")
def soft_slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return soft_scan_with_a_blurred_patch(tmp_path_factory.mktemp("soft") / "soft.svs")


def test_tile_preview_paints_the_patch_out_of_focus_orange_and_not_the_soft_scan(
    viewer: Any, dock: Any, qtbot: Any, soft_slide: Path
) -> None:
    slide, panel, left_out, grid = _preview(viewer, dock, qtbot, soft_slide)
    rows, cols = np.nonzero(np.asarray(left_out.data) == 2)  # orange: out of focus
    assert len(rows) == grid.out_of_focus.sum() >= 15
    np.testing.assert_allclose(left_out.colormap.map(2)[:3], [1.0, 0x8C / 255, 0.0], atol=0.01)
    # on the canvas (pixel centres), the orange cells lie on the patch (level-0 columns PATCH); of the
    # soft scan around it, a tile or two at most
    centres = np.array([left_out.data_to_world((r, c)) for r, c in zip(rows, cols)])
    column = centres[:, -1] / slide.scale[-1]
    on_patch = (column > PATCH[0]) & (column < PATCH[1])
    assert on_patch.sum() >= 15
    assert (~on_patch).sum() <= 2
    assert f"{len(rows)} out of focus (orange" in panel.status.text()
