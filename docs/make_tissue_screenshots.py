"""Screenshots of the tissue check (run under `xvfb-run -a -s "-screen 0 1600x1000x24"`):

- `tissue_preview.png`: the napari window, 1600 x 1000, with a marked slide (pen strokes of blue and red
  ink around, onto and across H&E-like tissue, dust, bubble rims, a blurred, a pale and a fatty patch) and
  the Sampling regions panel's tile preview: kept tiles yellow, tiles left out for ink magenta, out of
  focus orange; an area to leave out (QuPath's `Ignore*`) as a wide cyan outline over a dark veil;
- `tissue_check_before.png` / `tissue_check.png`: the tissue-check thumbnails a run writes for that
  slide with the greyscale rule (the earlier default) and with the stain rule (the default);
- `tissue_preview_pens_off.png` / `tissue_preview_pens.png`: the tile preview of a slide of the tissue
  bench's held-out set (seed 2959360: a light greyish-blue pen round the tissue, a violet, a green and a
  black one), with the Slides panel's *pen marks on the glass* cleared and ticked (the default).

    xvfb-run -a -s "-screen 0 1600x1000x24" python docs/make_tissue_screenshots.py
    xvfb-run -a -s "-screen 0 1600x1000x24" python docs/make_tissue_screenshots.py pens off
    xvfb-run -a -s "-screen 0 1600x1000x24" python docs/make_tissue_screenshots.py pens on
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from make_screenshots import IMAGES, dismiss_toasts, process, save, wait_until


def main() -> None:
    import napari

    from bigslide.explain.tissue_check import check_image
    from bigslide.synthetic.marks import synthesize_marked_slide
    from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
    from bigslide.tiling.grid import TileGrid
    from bigslide.tiling.pixel_classes import GREYSCALE_RULE
    from bigslide.wsi.slide import open_slide

    work = Path(tempfile.mkdtemp(prefix="bigslide-tissue-shots-"))
    marked = synthesize_marked_slide((1024, 1024), seed=5001, mpp=2.0, lab="B", inks=("blue", "red"))
    path = write_pyramid(work / "marked.tif", downsample_pyramid(marked.rgb, 4), mpp=2.0, flavour="tiff")

    with open_slide(path) as slide:
        for rule, name in ((GREYSCALE_RULE, "tissue_check_before.png"), (None, "tissue_check.png")):
            grid = TileGrid.from_slide(slide, 64, target_mpp=0.5, **({"tissue": rule} if rule else {}))
            save(check_image(slide, grid, max_size=768), name)

    viewer = napari.Viewer()
    viewer.window._qt_window.setGeometry(0, 0, 1600, 1000)
    [slide_layer] = viewer.open(path, plugin="bigslide")
    _, panel = viewer.window.add_plugin_dock_widget("bigslide", "Sampling regions")
    wait_until(lambda: panel.ready)  # built once PyTorch is loaded
    process(500)
    left_out = panel.new_regions_layer(role="exclusions")
    left_out.add_polygons([np.array([[560.0, 250.0], [560.0, 420.0], [700.0, 420.0], [700.0, 250.0]])])
    left_out.mode = "pan_zoom"
    panel.preview.setChecked(True)
    wait_until(lambda: any(layer.metadata.get("left_out") for layer in viewer.layers))
    process(1500)
    viewer.layers.selection.active = slide_layer
    viewer.reset_view()
    dismiss_toasts()
    process(500)
    save(viewer.screenshot(canvas_only=False), "tissue_preview.png")
    print(panel.status.text())
    viewer.close()


HELD_OUT_SHOT = 2959360
"""A slide of the tissue bench's held-out set with a light greyish-blue pen on the glass."""


def pens_preview(work: Path, ticked: bool) -> None:
    import napari
    from qtpy.QtCore import QPoint, Qt
    from qtpy.QtTest import QTest

    from bigslide.bench.tissue import marked_slide, scanned_levels
    from bigslide.synthetic.pyramid import write_pyramid

    marked, scan = marked_slide(HELD_OUT_SHOT, 1024, 2.0)
    levels = scanned_levels(marked.rgb, scan)
    path = write_pyramid(work / f"held-out-{HELD_OUT_SHOT}.tif", levels, mpp=2.0, flavour="tiff")
    viewer = napari.Viewer()
    viewer.window._qt_window.setGeometry(0, 0, 1600, 1000)
    [slide_layer] = viewer.open(path, plugin="bigslide")
    _, slides = viewer.window.add_plugin_dock_widget("bigslide", "Slides")
    _, panel = viewer.window.add_plugin_dock_widget("bigslide", "Sampling regions")
    wait_until(lambda: slides.ready and panel.ready)
    process(500)
    box = slides.pen_marks
    assert box.isChecked()  # on by default
    if not ticked:
        QTest.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(8, box.height() // 2))
        assert not box.isChecked()
    panel.preview.setChecked(True)
    wait_until(lambda: "will be sampled" in panel.status.text())
    process(1500)
    viewer.layers.selection.active = slide_layer
    viewer.reset_view()
    dismiss_toasts()
    process(500)
    name = "tissue_preview_pens.png" if ticked else "tissue_preview_pens_off.png"
    save(viewer.screenshot(canvas_only=False), name)
    print(name, panel.status.text())
    viewer.close()


if __name__ == "__main__":
    import sys

    IMAGES.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:2] == ["pens"]:  # a viewer of its own each: software OpenGL under Xvfb crashed on a second
        pens_preview(Path(tempfile.mkdtemp(prefix="bigslide-pen-shots-")), ticked=sys.argv[2:] == ["on"])
    else:
        main()
