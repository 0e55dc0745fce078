"""The viewer's longest freezes while a pathologist works, and how a followed run's maps keep up on a large
slide: one napari session at 1600 x 1000 that opens the panels, opens a large synthetic slide and a second
one, trains ABMIL-ACC on the demo slides while the Results panel follows the large slide, and lets the run
end. Each action's longest event-loop gap comes from a 10 ms timer on the GUI thread. Beside it, when the
first feedback was painted (napari's activity spinner, words on napari's status bar or a panel's status
line or progress bar that changed, a new notification): where napari's own work must hold the GUI thread
(making a layer, its first draw in OpenGL), a person is told within 100 ms that the viewer is at work.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python docs/measure_gaps.py [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import napari
import numpy as np
from qtpy.QtCore import QEvent, QObject, QTimer
from qtpy.QtWidgets import QApplication, QLabel, QProgressBar

LARGE = (16384, 12288)  # level-0 px at 0.5 µm/px: 8 x 6 mm of tissue and glass
J2K = (8192, 6144)
GAP_TARGET_MS = 250
FEEDBACK_MS = 100
EPOCHS = 4


class Gaps:
    """Longest gaps between a 10 ms timer's ticks, by the action under way when each gap ended; and, for
    each time an action begins, when feedback was first painted."""

    def __init__(self, feedback: Feedback | None = None) -> None:
        self.ticks: list[tuple[float, str]] = []
        self.begun: list[tuple[float, str]] = []  # (time, action) each time an action begins
        self.feedback = feedback
        self._action = "idle"
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(lambda: self.ticks.append((time.perf_counter(), self._action)))
        self.ticks.append(
            (time.perf_counter(), self._action)
        )  # a freeze before the timer's first tick counts
        self.timer.start()

    @property
    def action(self) -> str:
        return self._action

    @action.setter
    def action(self, name: str) -> None:
        if name != self._action and name != "idle":
            self.begun.append((time.perf_counter(), name))
            if self.feedback is not None:
                self.feedback.snapshot()
        self._action = name

    def longest(self) -> dict[str, tuple[float, float]]:
        """action -> (longest gap in ms, when that gap ended)."""
        out: dict[str, tuple[float, float]] = {}
        for (a, _), (b, action) in itertools.pairwise(self.ticks):
            if (b - a) * 1000 > out.get(action, (0.0, 0.0))[0]:
                out[action] = ((b - a) * 1000, b)
        return out

    def worst(self) -> dict[str, float]:
        return {action: ms for action, (ms, _) in self.longest().items()}

    def first_feedback(self, action: str) -> tuple[float, str] | None:
        """(ms from the action's beginning, what) of the first feedback painted in the turn of the action
        that froze longest, up to the freeze's end (a paint inside a click's handler counts: it is on
        screen while the rest of the handler runs), or None."""
        if self.feedback is None or action not in self.longest():
            return None
        _, gap_ended = self.longest()[action]
        began = max((t for t, name in self.begun if name == action and t <= gap_ended), default=None)
        if began is None:
            return None
        return next(
            ((1000 * (t - began), what) for t, what in self.feedback.painted if began <= t <= gap_ended),
            None,
        )


class Feedback(QObject):
    """Paints that tell a person the viewer is at work: napari's activity spinner shown, napari's status bar
    or a panel's status line or progress bar whose text or value changed, a new notification. A widget
    painted unchanged (every label repaints with its window) is not feedback."""

    def __init__(self, viewer: Any) -> None:
        super().__init__()
        self.viewer = viewer
        self.panels: Any = None
        self.before: dict[int, Any] = {}
        self.notes: set[int] = set()  # notifications painted so far
        self.notes_before: set[int] = set()
        self.painted: list[tuple[float, str]] = []
        QApplication.instance().installEventFilter(self)

    def _spinner(self) -> Any:
        return self.viewer.window._qt_window._activity_dialog._toggleButton._inProgressIndicator

    def _parts(self) -> list[Any]:
        """Where changed words are feedback: the panels, napari's status bar."""
        return [w for w in (self.panels, self.viewer.window._qt_window.statusBar()) if w is not None]

    def _shown(self, widget: Any) -> Any:
        if widget is self._spinner():
            return widget.isVisible()
        if isinstance(widget, QProgressBar):
            return widget.isVisible(), widget.value(), widget.format()
        return widget.isVisible(), widget.text()

    def snapshot(self) -> None:
        """What every tracked widget shows as an action begins."""
        labels = [w for part in self._parts() for w in part.findChildren((QLabel, QProgressBar))]
        self.before = {id(w): self._shown(w) for w in (self._spinner(), *labels)}
        self.notes_before = set(self.notes)

    def eventFilter(self, obj: Any, event: Any) -> bool:  # noqa: N802 (Qt's name)
        if event.type() != QEvent.Type.Paint:
            return False
        name = type(obj).__name__
        if name == "NapariQtNotification":
            if id(obj) not in self.notes_before:  # a new one, not an earlier one repainted as it fades
                self.painted.append((time.perf_counter(), "a notification"))
            self.notes.add(id(obj))
        elif obj is self._spinner() or (
            isinstance(obj, QLabel | QProgressBar) and any(part.isAncestorOf(obj) for part in self._parts())
        ):
            shown = self._shown(obj)
            if self.before.get(id(obj)) != shown:
                what = "napari's activity spinner" if obj is self._spinner() else f"{name} {shown[-1]!s:.40}"
                self.painted.append((time.perf_counter(), what))
        return False


def process(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        QApplication.processEvents()
        time.sleep(0.002)


def until(condition: Any, timeout: float = 600.0) -> None:
    end = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > end:
            raise TimeoutError("the viewer did not get there in time")
        process(0.02)


def _zoom(viewer: Any, layer: Any) -> None:
    """Centre the view on the middle of `layer` at one screen pixel per level-0 pixel: level 0 is read."""
    h, w = layer.level_shapes[0][:2]
    scale = layer.scale[-1]
    camera = viewer.scene.camera
    camera.center = (h * scale / 2, w * scale / 2)
    camera.zoom = 1.0 / scale


def retrain(viewer: Any, panels: Any, gaps: Gaps, checkpoint: Any) -> float:
    """Outline a lesion and a normal area on a training slide, save them, retrain the run's checkpoint
    with them for one epoch and let both maps be drawn; retrain again (the comparison is replaced) and
    close the comparison; returns the first retrain's seconds."""
    from bigslide.tiling.annotations import NOT_LESION

    r = panels.results
    row = next(x for x in panels.slides.session.rows if x.split == "train" and x.label == "tumor")
    [taught] = act_on(gaps, "open a slide (to teach)", lambda: viewer.open(row.path, plugin="bigslide"))
    r.slide_box.setCurrentText(taught.name)
    h, w = taught.level_shapes[0][:2]
    box = r.annotate

    side = min(h, w) / 8
    # step by step, the viewer painting between steps, as a person's clicks come
    for n, (name, (y, x)) in enumerate((("tumor", (h / 2, w / 2)), (NOT_LESION, (h / 8, w / 8)))):
        act_on(gaps, "choose an outline's class", lambda name=name: box.class_box.setCurrentText(name))
        act_on(gaps, "press Draw (first: a new layer)" if n == 0 else "press Draw", box.draw_button.click)
        outline = np.array([[y, x], [y, x + side], [y + side, x + side], [y + side, x]])
        act_on(gaps, "an outline drawn", lambda outline=outline: box.layer().add_polygons([outline]))
    act_on(gaps, "save the outlines", box.save)
    until(lambda: panels.slides.session.row(row.path).annotated is not None)
    r.checkpoint.setText(str(checkpoint))
    r.retrain.epochs.setValue(1)
    seconds = []
    for action in ("retrain (start, fine-tune, both maps)", "retrain again (replacing the comparison)"):
        gaps.action = action
        start = time.perf_counter()
        r.retrain.start()
        until(lambda: r.retrain.worker is None)
        seconds.append(time.perf_counter() - start)
        until(lambda: r.worker is None and not r.pending_grids)
        process(2.0)
    act_on(gaps, "close the comparison", r.retrain.close_comparison.click, 2.0)
    return seconds[0]


def napari_alone() -> dict[str, float]:
    """napari's own floor, in a process of its own without bigslide: the longest gaps for its first image
    layer (an RGB pyramid in memory, the second slide's size), for File > Open of a plain RGB TIFF of the
    same size through napari's own reader (the first, then a second), and for its first Shapes layer, with
    one labelled polygon, as the annotation layer is made."""
    import tifffile

    viewer = napari.Viewer()
    viewer.window._qt_window.setGeometry(0, 0, 1600, 1000)
    process(1.0)
    gaps = Gaps()
    rng = np.random.default_rng(0)
    pyramid = [rng.integers(0, 255, (3072 >> k, 4096 >> k, 3), dtype=np.uint8) for k in range(0, 6, 2)]
    act_on(gaps, "first image layer", lambda: viewer.add_image(pyramid, rgb=True, multiscale=True), 2.0)
    plain = Path(tempfile.mkdtemp()) / "plain.tif"
    tifffile.imwrite(plain, pyramid[0], photometric="rgb")
    for n in ("first", "second"):
        act_on(gaps, f"File > Open of a plain TIFF ({n})", lambda: viewer.open(plain, plugin="napari"), 2.0)
    square = np.array([[100, 100], [100, 900], [900, 900], [900, 100]])
    act_on(
        gaps,
        "first Shapes layer, a labelled polygon",
        lambda: viewer.add_shapes([square], features={"class": ["tumor"]}, text={"string": "{class}"}),
        2.0,
    )
    gaps.timer.stop()
    viewer.close()
    return {a: w for a, w in gaps.worst().items() if a != "idle"}


def napari_alone_in_a_process() -> dict[str, float]:
    """`napari_alone` in a fresh interpreter, as a person's first napari of the day."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, __file__, "--napari-alone"], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def act_on(gaps: Gaps, name: str, fn: Any, settle: float = 1.0) -> Any:
    gaps.action = name
    out = fn()
    process(settle)
    gaps.action = "idle"
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument(
        "--shots", type=Path, default=None, help="save the window with a preview map and the full map here"
    )
    parser.add_argument("--napari-alone", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.napari_alone:
        import json

        print(json.dumps(napari_alone()), flush=True)
        return
    import compileall

    import bigslide
    from bigslide.data.sources import demo_dir
    from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
    from bigslide.synthetic.slide_set import make_slide_set
    from bigslide.synthetic.slides import make_synthetic_slide, synthesize_slide

    work = Path(tempfile.mkdtemp())
    large = work / "large.svs"
    make_synthetic_slide(large, size=LARGE, lesions=3, seed=21)
    second = work / "second.svs"
    make_synthetic_slide(second, size=(4096, 3072), lesions=1, seed=22)
    jpeg2000 = work / "jpeg2000.svs"  # Aperio's JPEG 2000, many times slower to decode than JPEG
    write_pyramid(
        jpeg2000,
        downsample_pyramid(synthesize_slide(J2K, lesions=2, seed=23).rgb, 3, 4),
        compression="jpeg2000",
    )
    csv = make_slide_set(demo_dir())
    # measured as an installed package runs, its modules compiled once (pip compiles them as it installs):
    # where bytecode is not written (PYTHONDONTWRITEBYTECODE), each first import compiled its module on the
    # GUI thread, up to 0.7 s in one first action
    compileall.compile_dir(Path(bigslide.__file__).parent, quiet=1)

    viewer = napari.Viewer()
    viewer.window._qt_window.setGeometry(0, 0, 1600, 1000)
    process(1.0)
    feedback = Feedback(viewer)
    gaps = Gaps(feedback)

    def act(name: str, fn: Any, settle: float) -> Any:
        return act_on(gaps, name, fn, settle)

    panels = act(
        "open the panels (All panels)",
        lambda: viewer.window.add_plugin_dock_widget("bigslide", "All panels (tabbed)")[1],
        0.5,
    )
    feedback.panels = panels
    gaps.action = "open the panels (All panels)"
    until(lambda: panels.ready)
    gaps.action = "idle"
    [slide] = act("open a slide (first, 16k x 12k)", lambda: viewer.open(large, plugin="bigslide"), 2.0)
    act("open a slide (second)", lambda: viewer.open(second, plugin="bigslide"), 2.0)
    [j2k] = act(
        "open a JPEG 2000 slide (third, 8k x 6k)", lambda: viewer.open(jpeg2000, plugin="bigslide"), 2.0
    )
    act("zoom into the JPEG 2000 slide", lambda: _zoom(viewer, j2k), 2.0)

    p = panels
    viewer.layers.selection.active = slide
    panels.tabs.setCurrentWidget(p.regions)
    gaps.action = "tile preview (Regions panel, 16k x 12k)"
    p.regions.preview.click()
    until(lambda: "will be sampled" in p.regions.status.text() or "failed" in p.regions.status.text())
    process(1.0)
    p.regions.preview.click()
    process(0.5)
    gaps.action = "idle"
    p.slides.load_csv(csv)
    p.slides.target_mpp.setValue(1.0)
    p.slides.tile_size.setValue(32)
    for path, label in ((slide.metadata["path"], "tumor"), (second, "tumor"), (jpeg2000, "tumor")):
        p.slides.session.update(path, split="test", label=label)  # held out: shown, not trained on
    t = p.train
    t.set_method("abmil_acc")
    t.backbone.setCurrentText("test_resnet")
    t.epochs.setValue(EPOCHS)
    t.lr.setValue(0.002)
    t.data_form.set_values({"bag_size": 24})
    t.device.setCurrentText("cpu")
    t.out_dir.setText(str(work / "runs"))
    r = p.results
    r.slide_box.setCurrentText(slide.name)
    r.device.setCurrentText("cpu")
    viewer.layers.selection.active = slide
    panels.tabs.setCurrentWidget(r)

    # what following costs the run: the same run without it, twice (the first run makes the tile grids and
    # starts the decode workers' server; the second is the one to compare with)
    unfollowed = []
    for action in ("train, first run (not followed)", "train, not followed"):
        gaps.action = action
        start = time.perf_counter()
        t.start()
        until(lambda: t.worker is None)
        unfollowed.append(time.perf_counter() - start)
        gaps.action = "idle"
        process(1.0)
    r.follow.setChecked(True)

    saved: list[tuple[float, int]] = []  # (time, epoch) of each epoch's checkpoint
    drawn: list[tuple[float, int, int]] = []  # (time, epochs trained, tiles read 1 in s x s) of each map
    draw = r.show_prediction

    def on_drawn(prediction: Any, layer: Any) -> None:
        # a map's drawing begins when its prediction reaches the panel: its words, then its layer
        gaps.action = "draw a heatmap (first: a new layer)" if not added else "draw a heatmap (in place)"
        draw(prediction, layer)
        drawn.append((time.perf_counter(), prediction.epochs, prediction.thinned))
        if args.shots is not None and prediction.thinned > 1 and prediction.epochs == 2:
            QTimer.singleShot(500, lambda: shot("follow_large_preview.png"))

    def shot(name: str) -> None:
        args.shots.mkdir(parents=True, exist_ok=True)
        viewer.screenshot(str(args.shots / name), canvas_only=False, flash=False)

    r.show_prediction = on_drawn
    add_grid = r.add_grid
    added: list[float] = []

    def timed_add_grid(*args: Any) -> Any:
        # the layer is made now and painted on the next turns: both count as drawing the heatmap
        before = "after the run: the full map" if t.worker is None else "train (Start, steps, validation)"
        gaps.action = "draw a heatmap (first: a new layer)" if not added else "draw a heatmap (in place)"
        added.append(time.perf_counter())
        layer = add_grid(*args)
        QTimer.singleShot(300, lambda: setattr(gaps, "action", before))
        return layer

    r.add_grid = timed_add_grid
    r.session.checkpoint_saved.connect(lambda _c: saved.append((time.perf_counter(), len(saved) + 1)))
    gaps.action = "train (Start, steps, validation)"
    start = time.perf_counter()
    t.start()
    until(lambda: t.worker is None)
    trained = time.perf_counter() - start
    gaps.action = "after the run: the full map"
    until(lambda: r.worker is None and not r.pending_grids and r.run_button.isEnabled())
    process(1.0)
    r.add_grid, r.show_prediction = add_grid, draw  # the run's maps are all drawn: stop timing them
    run_saved = list(saved)  # the run's checkpoints, not the retrain's
    retrained = retrain(viewer, p, gaps, t.last_checkpoint)
    gaps.timer.stop()
    if args.shots is not None:
        shot("follow_large_full.png")

    lines = [
        "$ xvfb-run -a -s '-screen 0 1600x1000x24' .venv/bin/python docs/measure_gaps.py",
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"machine: {os.cpu_count()} CPU cores ({platform.machine()}), no GPU, Qt on "
        f"{QApplication.platformName()} (Xvfb, software OpenGL), load average {os.getloadavg()[0]:.1f} "
        "at the end",
        "",
        "| action | longest event-loop gap | first feedback painted |",
        "| --- | --- | --- |",
    ]
    for action, worst in gaps.worst().items():
        if action != "idle":
            shown = gaps.first_feedback(action)
            told = f"{shown[0]:.0f} ms: {shown[1]}" if shown else "none"
            lines.append(f"| {action} | {worst:.0f} ms | {told} |")
    lines += [
        "",
        f"Followed run: ABMIL-ACC, {EPOCHS} epochs on the demo slides, the Results panel following a "
        f"{LARGE[0]} x {LARGE[1]} px slide: {trained:.1f} s; the same run not followed: "
        f"{unfollowed[1]:.1f} s (the first such run, which made the tile grids: {unfollowed[0]:.1f} s).",
        "",
        "| epoch | map drawn after its checkpoint | next epoch's checkpoint after it | tiles read |",
        "| --- | --- | --- | --- |",
    ]
    for (when, epoch), nxt in itertools.zip_longest(run_saved, run_saved[1:]):
        shown = next(((at, s) for at, e, s in drawn if e == epoch), None)
        after = f"{shown[0] - when:.1f} s" if shown else "skipped for a newer one"
        following = f"{nxt[0] - when:.1f} s" if nxt else "(run ended)"
        tiles = f"1 in {shown[1]} x {shown[1]}" if shown and shown[1] > 1 else "every tile" if shown else ""
        lines.append(f"| {epoch} | {after} | {following} | {tiles} |")
    lines.append(f"\nRetrain with annotations (1 epoch, from the run's last checkpoint): {retrained:.1f} s.")
    final = [d for d in drawn if d[2] == 1]
    if final:
        after_run = final[-1][0] - start - trained
        lines.append(f"\nThe full map (every tile) was drawn {after_run:.1f} s after the run.")
    over = {a: w for a, w in gaps.worst().items() if a != "idle" and w > GAP_TARGET_MS}
    untold = {a: w for a, w in over.items() if (gaps.first_feedback(a) or (1e9,))[0] > FEEDBACK_MS}
    viewer.close()
    lines += [
        "",
        "napari alone, the same Qt and OpenGL (a process of its own, no bigslide):",
        "",
        "| action | longest event-loop gap |",
        "| --- | --- |",
    ]
    lines += [f"| {action} | {worst:.0f} ms |" for action, worst in napari_alone_in_a_process().items()]
    lines += [
        f"\nfreezes over {GAP_TARGET_MS} ms: "
        + (", ".join(f"{a}: {w:.0f} ms" for a, w in over.items()) if over else "none")
    ]
    verdict = (
        "met" if not untold else "MISSED (" + ", ".join(f"{a}: {w:.0f}" for a, w in untold.items()) + ")"
    )
    lines += [
        f"target every action's longest gap <= {GAP_TARGET_MS} ms, or, where napari's own work holds the GUI "
        f"thread, feedback painted within {FEEDBACK_MS} ms: {verdict}",
        "exit status: 0",
    ]
    report = "\n".join(lines)
    print(report, flush=True)
    if args.out is not None:
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
