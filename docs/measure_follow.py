"""What Follow training costs a run: the demo ABMIL-ACC run (8 epochs) from the Train panel, alternately
without and with the Results panel following a held-out slide.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python docs/measure_follow.py
"""

import tempfile
import time

import napari
from qtpy.QtWidgets import QApplication

from bigslide.data.sources import demo_dir
from bigslide.data.table import SlideTable
from bigslide.synthetic.slide_set import make_slide_set


def process(ms: int) -> None:
    app = QApplication.instance()
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        app.processEvents()
        time.sleep(0.005)


def main() -> None:
    csv = make_slide_set(demo_dir())
    table = SlideTable.from_csv(csv)
    held = next(e for e in table.entries if e.split == "test" and e.label == "tumor")
    viewer = napari.Viewer()
    _, p = viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")
    p.slides.load_csv(csv)
    p.slides.target_mpp.setValue(1.0)
    p.slides.tile_size.setValue(32)
    [slide] = viewer.open(held.path, plugin="bigslide")
    p.slides.session.update(slide.metadata["path"], split="test")
    t = p.train
    t.set_method("abmil_acc")
    t.backbone.setCurrentText("test_resnet")
    t.epochs.setValue(8)
    t.lr.setValue(0.002)
    t.data_form.set_values({"bag_size": 24})
    t.device.setCurrentText("cpu")
    t.out_dir.setText(tempfile.mkdtemp())
    r = p.results
    r.slide_box.setCurrentText(slide.name)
    r.device.setCurrentText("cpu")
    infer = []
    orig = r.run

    def timed_run(checkpoint=None):
        w = orig(checkpoint)
        start = time.perf_counter()
        if w is not None:
            w.finished.connect(lambda: infer.append(time.perf_counter() - start))
        return w

    r.run = timed_run
    rows = []
    for follow in (False, True, False, True):
        r.follow.setChecked(follow)
        infer.clear()
        start = time.perf_counter()
        t.start()
        while t.worker is not None:
            process(20)
        train_s = time.perf_counter() - start
        while r.worker is not None or r.pending_grids:
            process(20)
        rows.append((follow, train_s, len(infer), sum(infer)))
        print(
            f"follow={follow}: training {train_s:.1f} s; predictions {len(infer)}, {sum(infer):.1f} s in all",
            flush=True,
        )
    viewer.close()


if __name__ == "__main__":
    main()
