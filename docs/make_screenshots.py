"""Regenerate the plugin screenshots in docs/images (run under a display, e.g. `xvfb-run -a`).

    xvfb-run -a python docs/make_screenshots.py

Opens the synthetic sample slide, draws a sampling region, previews its tiles, trains a tiny model
for two steps, overlays its attention map and a lesion-fraction heatmap, and saves each panel.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import napari
import numpy as np
import shapely
from PIL import Image
from qtpy.QtWidgets import QApplication

IMAGES = Path(__file__).parent / "images"
MAX_BYTES = 300_000


def process(ms: int = 200) -> None:
    app = QApplication.instance()
    for _ in range(max(1, ms // 20)):
        app.processEvents()
        QApplication.instance().thread().msleep(20)


def save(image: np.ndarray | object, name: str) -> None:
    path = IMAGES / name
    if isinstance(image, np.ndarray):
        Image.fromarray(image[..., :3]).save(path, optimize=True)
    else:
        image.save(str(path))  # a QPixmap
    # keep the repository light: shrink until the file is small enough
    while path.stat().st_size > MAX_BYTES:
        picture = Image.open(path)
        picture.resize((picture.width * 3 // 4, picture.height * 3 // 4), Image.Resampling.LANCZOS).save(
            path, optimize=True
        )
    print(f"{path} {path.stat().st_size // 1000} kB")


def wait_for(worker: object) -> None:
    done: list[bool] = []
    worker.finished.connect(lambda: done.append(True))  # type: ignore[attr-defined]
    while not done:
        process(100)


def main() -> None:
    from bigslide.explain.heatmap import ScoreGrid
    from bigslide.grid import TileGrid
    from bigslide.regions import load_regions
    from bigslide.slide import open_slide
    from bigslide.synthetic.slide_set import make_slide_set

    IMAGES.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bigslide-shots-"))
    viewer = napari.Viewer()
    viewer.window._qt_window.resize(1500, 950)
    slide, lesions = viewer.open_sample("bigslide", "slide")
    _, slides = viewer.window.add_plugin_dock_widget("bigslide", "Slides")
    _, regions = viewer.window.add_plugin_dock_widget("bigslide", "Sampling regions")
    _, train = viewer.window.add_plugin_dock_widget("bigslide", "Train")
    _, results = viewer.window.add_plugin_dock_widget("bigslide", "Results")
    process(500)

    # sampling region around the lesions, with its tile preview
    layer = regions.new_regions_layer()
    layer.add_polygons([np.array([[150.0, 250.0], [150.0, 2800.0], [1900.0, 2800.0], [1900.0, 250.0]])])
    slides.tile_size.setValue(128)
    regions.preview.setChecked(True)
    wait_for(regions.preview_worker)
    viewer.reset_view()
    process(500)
    save(viewer.screenshot(canvas_only=False), "regions.png")
    save(regions.grab(), "regions_panel.png")

    # a labelled training set in the slides panel
    csv = make_slide_set(work / "set", n_slides=4, size=(512, 512), seed=1)
    slides.load_csv(csv)
    slides.set_label(0, "tumor")  # the sample slide holds lesions
    slides.tile_size.setValue(32)
    wait_for(slides.count_tiles())
    save(slides.grab(), "slides_panel.png")

    # a tiny training run
    train.set_method("abmil_acc", hidden=32, attention_dim=16)
    train.data_form.set_values({"bag_size": 8, "augment": False})
    train.max_steps.setValue(4)
    train.device.setCurrentText("cpu")
    train.out_dir.setText(str(work / "run"))
    wait_for(train.start())
    process(300)
    save(train.grab(), "train_panel.png")

    # heatmap over the slide: the planted lesions' coverage per 64 px tile
    regions.preview.setChecked(False)
    viewer.layers.remove(layer)
    with open_slide(slide.metadata["path"]) as s:
        grid = TileGrid.from_slide(s, 64, min_tissue=0.3)
    union = shapely.union_all([r.geometry for r in load_regions(lesions.metadata["path"])])
    x, y = grid.coords[:, 0].astype(float), grid.coords[:, 1].astype(float)
    fraction = shapely.area(shapely.intersection(shapely.box(x, y, x + 64, y + 64), union)) / 64**2
    scores = ScoreGrid.from_tiles(
        grid.coords,
        fraction + 0.05 * np.random.default_rng(0).random(len(x)),
        64,
        mpp=grid.mpp,
        name="lesion score",
    )
    results.checkpoint.setText(str(train.last_checkpoint))
    results.add_grid(scores, slide, "sample slide lesion score")
    results.heatmap_box.setCurrentText("sample slide lesion score")
    results.normalisation.setCurrentText("raw")
    results.opacity.setValue(55)
    viewer.reset_view()
    process(800)
    save(viewer.screenshot(canvas_only=False), "app.png")
    viewer.scene.camera.zoom *= 1.6
    process(500)
    save(viewer.screenshot(canvas_only=True), "heatmap_overlay.png")
    save(results.grab(), "results_panel.png")
    viewer.close()


if __name__ == "__main__":
    main()
