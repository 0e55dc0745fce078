"""Screenshots of a demo test slide in napari: lesion outlines and the trained attention, at two zooms.

    bigslide demo                                          # writes runs/demo/heatmaps/<slide>.attention.npz
    xvfb-run -a python docs/make_demo_screenshots.py [runs/demo]

Saves docs/images/demo_slide_whole.png (the whole slide) and docs/images/demo_slide_zoom.png (one
lesion at cell level, where the tumour nuclei are visible).
"""

from __future__ import annotations

import sys
from pathlib import Path

import napari
import numpy as np
from PIL import Image
from qtpy.QtWidgets import QApplication

IMAGES = Path(__file__).parent / "images"


def process(rounds: int = 20) -> None:
    for _ in range(rounds):
        QApplication.instance().processEvents()
        QApplication.instance().thread().msleep(25)


def save(shot: np.ndarray, name: str) -> None:
    # 256 adaptive colours keep the repository light (the slide's glass noise defeats PNG otherwise)
    Image.fromarray(shot[..., :3]).quantize(256).save(IMAGES / name, optimize=True)


def main(run: Path) -> None:
    from bigslide.data.sources import demo_dir
    from bigslide.explain.heatmap import ScoreGrid
    from bigslide.napari._layers import add_heatmap, slide_layer_data
    from bigslide.napari._sample_data import _lesion_layer
    from bigslide.wsi.slide import open_slide

    npz = sorted((run / "heatmaps").glob("*.attention.npz"))[0]
    stem = npz.name.split(".")[0]
    slide_path = next(demo_dir().glob(f"{stem}.*s"))
    slide = open_slide(slide_path)
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1200, 900)
    data, kwargs, _ = slide_layer_data(slide, stem)
    slide_layer = viewer.add_image(data, **kwargs)
    grid = ScoreGrid.load_npz(npz)
    add_heatmap(viewer, grid, slide_layer, name="attention")
    shapes, shape_kwargs, _ = _lesion_layer(slide, demo_dir() / f"{stem}.lesions.geojson", stem, (0.0, 0.0))
    lesions = viewer.add_shapes(shapes, **shape_kwargs)
    viewer.canvas.overlays.scale_bar.visible = True
    viewer.reset_view()
    process()
    IMAGES.mkdir(exist_ok=True)
    save(viewer.screenshot(canvas_only=True), "demo_slide_whole.png")

    first = np.asarray(lesions.data[0])  # (row, col) level-0 vertices; the layer's scale makes them µm
    centre = first.mean(axis=0) * np.asarray(lesions.scale)
    viewer.scene.camera.center = tuple(centre)
    viewer.scene.camera.zoom = viewer.scene.camera.zoom * 4
    viewer.layers["attention"].opacity = 0.3
    process()
    save(viewer.screenshot(canvas_only=True), "demo_slide_zoom.png")
    print(f"{IMAGES / 'demo_slide_whole.png'}, {IMAGES / 'demo_slide_zoom.png'} from {npz}")
    viewer.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/demo"))
