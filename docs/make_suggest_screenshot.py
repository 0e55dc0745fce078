"""A screenshot of the "Where to look next" queue (run under `xvfb-run -a -s "-screen 0 1600x1000x24"`):

- `suggest_queue.png`: the napari window, 1600 x 1000, zoomed onto the first place the `bigslide demo`
  model (ABMIL-ACC, the demo's settings and slides) asks about, outlined on its slide, with the place's
  number, slide and reason and the answer buttons in the Results panel. A model that has learnt where to
  look: one trained a few steps attends nearly evenly, and its places are near random.

    xvfb-run -a -s "-screen 0 1600x1000x24" python docs/make_suggest_screenshot.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from make_screenshots import IMAGES, dismiss_toasts, process, wait_until
from PIL import Image

from bigslide.cli.demo import demo_config
from bigslide.data.sources import demo_dir
from bigslide.engine import run_to_end, train
from bigslide.synthetic.slide_set import make_slide_set

MAX_BYTES = 900_000


def save(picture: Image.Image, name: str) -> Path:
    """At the window's full size, its small panel text legible; 256 colours when full colour weighs too
    much."""
    path = IMAGES / name
    picture.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        picture.quantize(256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"{path} {picture.width}x{picture.height} {path.stat().st_size // 1000} kB")
    return path


def checkpoint(out: Path) -> Path:
    """`bigslide demo`'s model: ABMIL-ACC trained on the demo slides with the demo's settings."""
    result = run_to_end(train(demo_config(out, "abmil_acc", epochs=4)))
    assert result.checkpoint is not None
    return result.checkpoint


def main() -> None:
    import napari
    from qtpy.QtWidgets import QScrollArea

    work = Path(tempfile.mkdtemp(prefix="bigslide-suggest-shot-"))
    table = make_slide_set(demo_dir())
    trained = checkpoint(work / "run")
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1600, 1000)
    _dock, panels = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
    wait_until(lambda: panels.ready)  # built once the warm-up has loaded PyTorch
    panels.slides.load_csv(table)
    results = panels.results
    panels.tabs.setCurrentWidget(results)
    results.checkpoint.setText(str(trained))
    results.device.setCurrentText("cpu")
    box = results.suggest
    box.count.setValue(12)
    box.suggest_button.click()
    wait_until(lambda: box.worker is None)
    assert box.current() is not None, box.status.text()
    process(1500)  # the slide's tiles at this zoom are read and drawn
    area = results.findChild(QScrollArea)
    if area is not None:
        area.ensureWidgetVisible(box)
    dismiss_toasts()
    process(500)
    save(Image.fromarray(viewer.screenshot(canvas_only=False, flash=False)[..., :3]), "suggest_queue.png")
    print(box.status.text(), "|", box.place.text(), "|", box.reason.text())
    viewer.close()


if __name__ == "__main__":
    main()
