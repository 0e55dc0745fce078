"""Regenerate the plugin screenshots in docs/images on a 1600 × 1000 virtual screen.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python docs/make_screenshots.py

With the bundled demo slides (the ones `bigslide demo` trains on) it: shows each check that refuses a
Start; opens a slide whose file states no pixel size (a held-out demo slide rewritten without one, the
way many TCGA JPEG-2000 SVS files are) and gives it 0.5 µm/px in the Slides panel; trains ABMIL-ACC from
the Train panel while the Results panel follows that slide epoch by epoch; trains PatchGD; and overlays
both models' maps on the unstated slide and on a second scanner's 0.25 µm/px slide, side by side in µm.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from qtpy.QtWidgets import QApplication

IMAGES = Path(__file__).parent / "images"
MAX_BYTES = 400_000
FOLLOW_EPOCHS = (1, 4, 8)  # the followed heatmap is saved after these epochs


def process(ms: int = 200) -> None:
    app = QApplication.instance()
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        app.processEvents()
        time.sleep(0.01)


def dismiss_toasts() -> None:
    """Close napari's notification pop-ups, so a window screenshot shows the state it is taken for."""
    from napari._qt.dialogs.qt_notification import NapariQtNotification

    for widget in QApplication.allWidgets():
        if isinstance(widget, NapariQtNotification):
            widget.close()
    process(100)


def save(image: np.ndarray | Any, name: str) -> None:
    path = IMAGES / name
    if isinstance(image, np.ndarray):
        Image.fromarray(image[..., :3]).save(path, optimize=True)
    else:
        image.save(str(path))  # a QPixmap
    while path.stat().st_size > MAX_BYTES:  # keep the repository light
        picture = Image.open(path)
        picture.resize((picture.width * 3 // 4, picture.height * 3 // 4), Image.Resampling.LANCZOS).save(
            path, optimize=True
        )
    print(f"{path} {path.stat().st_size // 1000} kB")


def wait_until(condition: Any, timeout: float = 600) -> None:
    end = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > end:
            raise TimeoutError("the screenshot run waited too long")
        process(50)


def unstated_copy(source: Path, out: Path) -> Path:
    """The slide's pyramid written again as a TIFF that states no pixel size."""
    from bigslide.synthetic.pyramid import write_pyramid
    from bigslide.wsi.slide import open_slide

    with open_slide(source) as slide:
        levels = [
            np.asarray(slide.read_region((0, 0), level, slide.level_dimensions[level]))[..., :3]
            for level in range(slide.level_count)
        ]
    return write_pyramid(out, levels, mpp=None, flavour="tiff")


def main() -> None:
    import napari

    from bigslide.data.sources import demo_dir
    from bigslide.data.table import SlideTable
    from bigslide.napari._roles import slide_layers
    from bigslide.synthetic.slide_set import make_slide_set
    from bigslide.synthetic.slides import make_synthetic_slide

    IMAGES.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bigslide-shots-"))
    csv = make_slide_set(demo_dir())
    table = SlideTable.from_csv(csv)
    held_out = next(e for e in table.entries if e.split == "test" and e.label == "tumor")
    tcga_like = unstated_copy(held_out.path, work / "TCGA-like-no-mpp.tif")
    scanner = work / "second-scanner-0.25.svs"
    make_synthetic_slide(scanner, size=(2048, 2048), lesions=2, seed=7, mpp=0.25)

    viewer = napari.Viewer()
    window = viewer.window._qt_window
    window.setGeometry(0, 0, 1600, 1000)
    _, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
    wait_until(lambda: panels.ready)  # built once the warm-up has loaded PyTorch
    slides, train, results = panels.slides, panels.train, panels.results
    process(500)

    # -- the training set and the checks before Start -------------------------------------------------
    slides.load_csv(csv)
    slides.target_mpp.setValue(1.0)  # the demo's 10x, where a tumour is plain to see
    slides.tile_size.setValue(32)
    panels.tabs.setCurrentWidget(slides)
    process(300)
    save(slides.grab(), "slides_panel.png")
    train.set_method("abmil_acc")
    train.backbone.setCurrentText("test_resnet")
    train.epochs.setValue(FOLLOW_EPOCHS[-1])
    train.lr.setValue(0.002)
    train.data_form.set_values({"bag_size": 24})
    train.device.setCurrentText("cpu")
    train.out_dir.setText(str(work / "runs"))
    panels.tabs.setCurrentWidget(train)
    rows = slides.session.rows
    saved = [(r.label, r.split) for r in rows]
    for row in rows:
        row.label = "tumor"
    train.start()
    process(300)
    save(train.grab(), "pitfall_one_class.png")
    for row, (label, _split) in zip(rows, saved):
        row.label, row.split = label, "train" if _split != "test" else "test"
    train.start()
    process(300)
    save(train.grab(), "pitfall_no_validation.png")
    for row, (label, split) in zip(rows, saved):
        row.label, row.split = label, split

    # -- a slide that states no µm/px: refused, then given 0.5 in the Slides panel -------------------
    [unstated] = viewer.open(tcga_like, plugin="bigslide")
    slides.set_label(len(rows) - 1, "tumor")
    slides.session.update(unstated.metadata["path"], split="test")  # held out: shown, not trained on
    train.start()
    process(300)
    save(train.grab(), "pitfall_unstated_mpp.png")
    slides.slide_mpp.setValue(0.5)
    process(200)

    # -- train ABMIL-ACC while Results follows the unstated slide -------------------------------------
    results.slide_box.setCurrentText(unstated.name)
    results.device.setCurrentText("cpu")
    results.follow.setChecked(True)
    shots: dict[int, bool] = {}
    viewer.reset_view()
    assert train.start() is not None
    wait_until(lambda: train.progress.value() >= 3)
    process(300)
    dismiss_toasts()
    save(viewer.screenshot(canvas_only=False), "window_training.png")
    save(train.grab(), "train_panel.png")
    while True:
        busy = train.worker is not None or results.worker is not None or bool(results.pending_grids)
        prediction = results.prediction
        if prediction is not None and not results.pending_grids and prediction.epochs not in shots:
            shots[prediction.epochs] = True
            if prediction.epochs in FOLLOW_EPOCHS:
                process(300)
                save(viewer.screenshot(canvas_only=True), f"follow_epoch_{prediction.epochs}.png")
        if not busy:
            break
        process(100)
    print(f"the Results panel drew the followed slide after epochs {sorted(shots)}")
    abmil_checkpoint = train.last_checkpoint
    results.follow.setChecked(False)

    # -- PatchGD on whole images at 2 µm/px ---------------------------------------------------------
    slides.target_mpp.setValue(2.0)
    train.set_method("patchgd", patch_size=32, head="pool", epsilon=1, encoder_bn="frozen")
    train.data_form.set_values({"image_size": 256})
    train.epochs.setValue(3)
    assert train.start() is not None
    wait_until(lambda: train.worker is None)
    patchgd_checkpoint = train.last_checkpoint

    # -- a sampling region on the second scanner's slide, with the tiles it keeps ---------------------
    [fine] = viewer.open(scanner, plugin="bigslide")
    regions = panels.regions
    panels.tabs.setCurrentWidget(regions)
    regions.slide_box.setCurrentText(fine.name)
    drawn = regions.new_regions_layer()
    drawn.add_polygons([np.array([[250.0, 300.0], [250.0, 1700.0], [1500.0, 1700.0], [1500.0, 300.0]])])
    slides.target_mpp.setValue(1.0)
    regions.preview.setChecked(True)
    wait_until(lambda: any(layer.metadata.get("bigslide_role") == "tiles" for layer in viewer.layers))
    viewer.layers.selection.active = fine
    viewer.reset_view()  # both slides in view; then the second one fills it
    extent = fine.extent.world
    viewer.scene.camera.center = tuple((extent[0] + extent[1]) / 2)
    viewer.scene.camera.zoom *= 1.9
    process(800)
    save(viewer.screenshot(canvas_only=True), "regions.png")
    save(regions.grab(), "regions_panel.png")
    regions.preview.setChecked(False)
    viewer.layers.remove(drawn)

    # -- both maps on the unstated slide, attention on the 0.25 µm/px slide, side by side in µm -----
    panels.tabs.setCurrentWidget(results)
    for checkpoint, slide in ((patchgd_checkpoint, unstated), (abmil_checkpoint, fine)):
        results.slide_box.setCurrentText(slide.name)
        results.checkpoint.setText(str(checkpoint))
        results.run()
        wait_until(lambda: results.worker is None and not results.pending_grids)
    # the Z-block norm (the size of each patch's encoding, not a lesion score): its cells cover the whole
    # image, so its edges show the placement; PatchGD's class evidence from a 3-epoch run does not
    # localise lesions on this set, so it would show a failure of the model, not of the placement
    norm = next(layer for layer in viewer.layers if layer.name.endswith("Z-block norm"))
    results.heatmap_box.setCurrentText(norm.name)
    results.colormap.setCurrentText("inferno")
    scale_bar = viewer.canvas.overlays.scale_bar
    scale_bar.visible = True
    scale_bar.position = "top_right"
    for layer in slide_layers(viewer):
        print(f"{layer.name}: scale {tuple(layer.scale)} {[str(u) for u in layer.units]}")
    viewer.reset_view()
    process(800)
    dismiss_toasts()
    save(viewer.screenshot(canvas_only=False), "tcga_like.png")
    save(results.grab(), "results_panel.png")
    viewer.close()


if __name__ == "__main__":
    main()
