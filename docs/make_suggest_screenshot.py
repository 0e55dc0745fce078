"""A screenshot of the "Where to look next" queue (run under `xvfb-run -a -s "-screen 0 1600x1000x24"`):

- `suggest_queue.png`: the napari window, 1600 x 1000, zoomed onto the first place a briefly trained
  ABMIL-ACC checkpoint asks about, outlined on its slide, with the place's number, slide and reason and
  the answer buttons in the Results panel.

    xvfb-run -a -s "-screen 0 1600x1000x24" python docs/make_suggest_screenshot.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from make_screenshots import IMAGES, dismiss_toasts, process, wait_until
from PIL import Image

from bigslide.engine import run_to_end, train
from bigslide.engine.config import DataConfig, MethodConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig
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


def checkpoint(table: Path, out: Path) -> Path:
    """A few steps of ABMIL-ACC on the set: enough for an attention map to ask about."""
    config = TrainConfig(
        data=DataConfig(csv=str(table), tile_size=64, bag_size=32, image_size=64, augment=False),
        model=ModelConfig(backbone="resnet18"),
        method=MethodConfig("abmil_acc", {"hidden": 32, "attention_dim": 16}),
        optim=OptimConfig(epochs=1, max_steps=4),
        run=RunConfig(out_dir=str(out), device="cpu"),
    )
    result = run_to_end(train(config))
    assert result.checkpoint is not None
    return result.checkpoint


def main() -> None:
    import napari
    from qtpy.QtWidgets import QScrollArea

    work = Path(tempfile.mkdtemp(prefix="bigslide-suggest-shot-"))
    table = make_slide_set(work / "set", n_slides=4, size=(1536, 1536), seed=2)
    trained = checkpoint(table, work / "run")
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
