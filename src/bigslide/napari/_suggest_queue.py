"""Where to look next: the places on the training slides where an answer would teach the Results panel's
checkpoint most (`bigslide.engine.suggest`), shown one at a time on their slide and answered with one key
or click. An answer is saved at once as a teaching annotation of the slide (`save_answer`), so "Retrain
with annotations" learns from it; Skip moves on without saving.

Keys: L (the task's lesion class; with several lesion classes, a free letter of each name), N (Not
lesion), S (Skip); on the canvas while the queue is shown, and anywhere in the Results panel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from napari.qt.threading import create_worker
from qtpy.QtCore import QEvent, QObject, Qt
from qtpy.QtGui import QKeyEvent
from qtpy.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from bigslide.explain.suggest import (
    HIGH,
    REVIEW_COLOUR,
    Suggestion,
    flat_attention,
    normal_class,
    save_answer,
)
from bigslide.napari._annotate import CLASS, annotation_layer, count_worker, hex_colour, task_classes
from bigslide.napari._layers import polygons_to_shapes, regions_layer_kwargs
from bigslide.napari._number import NumberField
from bigslide.napari._placement import placement_of, show_area
from bigslide.napari._roles import remove_layers, slide_layers
from bigslide.napari._run import in_panel_words
from bigslide.napari._toasts import show_error, show_warning
from bigslide.tiling.annotations import NOT_LESION, annotations_path, class_colour
from bigslide.words import counted

if TYPE_CHECKING:
    import napari
    from qtpy.QtWidgets import QComboBox

    from bigslide.napari._annotate import AnnotateBox
    from bigslide.napari._session import Session

ROLE = "suggestion"  # the outline of the place shown (placed on its slide like the other overlays)
SKIP = "Skip"
KINDS = {
    "false_alarm": "a likely false alarm",
    "uncertain": "the model is unsure",
    "looked_at": "the model looks",
}
EVEN_ATTENTION = "where the model looks on a normal slide"
"""A normal slide's place attended less than `HIGH` times its mean: asked about, not called a false alarm
(a weak or early model attends nearly evenly)."""
CONTEXT = 3.0
"""The view spans this many times the place: its surroundings show, and it still fills a third of it."""
FINISH = "press Retrain with annotations to teach the model"


def place_title(s: Suggestion) -> str:
    """What a place is, in a few words."""
    if s.kind == "false_alarm" and s.score < HIGH:
        return EVEN_ATTENTION
    return KINDS.get(s.kind, s.kind)


class ResultsPanel(Protocol):
    """What the queue uses of the Results panel: its checkpoint, device, chosen slide and annotations."""

    viewer: napari.Viewer
    session: Session
    device: QComboBox
    slide_box: QComboBox
    annotate: AnnotateBox

    def chosen_checkpoint(self) -> Path: ...

    def checkpoint_problem(self) -> str | None: ...


def answer_keys(lesions: Sequence[str]) -> dict[str, str]:
    """The key of each lesion class: L for a task's one lesion class; with several, the first letter of
    each name that no other answer takes (N and S are Not lesion and Skip); none free: a button only."""
    if len(lesions) == 1:
        return {lesions[0]: "L"}
    taken, keys = {"N", "S"}, {}
    for name in lesions:
        key = next((c for c in name.upper() if "A" <= c <= "Z" and c not in taken), None)
        if key is not None:
            taken.add(key)
            keys[name] = key
    return keys


class SuggestBox(QGroupBox):
    """*Suggest places* runs the checkpoint over the training slides off the GUI thread; the queue then
    shows each place and takes its answer."""

    def __init__(self, panel: ResultsPanel) -> None:
        super().__init__("Where to look next")
        self.panel, self.viewer, self.session = panel, panel.viewer, panel.session
        self.worker: Any = None
        self.queue: list[Suggestion] = []
        self.index = 0
        self.tally: Counter[str] = Counter()
        self.keys: dict[str, str] = {}  # answer -> key, while the queue is shown
        self.unbound: dict[str, Any] = {}  # the viewer's own bindings of those keys, given back at the end
        self.counts: dict[Path, int] = {}  # the newest count asked per slide: an older one is stale
        self.count = NumberField(
            int, 20, name="places to suggest", minimum=1, maximum=1000, tip="How many places to queue"
        )
        self.suggest_button = QPushButton("Suggest places")
        self.suggest_button.setToolTip(
            "Runs the chosen checkpoint on the training slides and queues the places where your answer "
            "would teach it most: its likely false alarms, where it is unsure, where it looks"
        )
        self.suggest_button.clicked.connect(lambda: self.start())
        self.status = QLabel("Choose a checkpoint above, then press Suggest places.")
        self.place, self.where, self.reason = QLabel(), QLabel(), QLabel()
        for label in (self.status, self.where, self.reason):
            label.setWordWrap(True)
        self.place.setStyleSheet("font-weight: bold;")
        self.buttons: dict[str, QPushButton] = {}
        self.answer_row = QHBoxLayout()
        self.stop_button = QPushButton("Stop")  # the answers given are saved already
        self.stop_button.clicked.connect(lambda: self.end())
        form = QFormLayout()
        form.addRow("places", self.count)
        rows = QVBoxLayout(self)
        rows.addLayout(form)
        for widget in (self.suggest_button, self.status, self.place, self.where, self.reason):
            rows.addWidget(widget)
        rows.addLayout(self.answer_row)
        rows.addWidget(self.stop_button)
        self._show_queue(False)
        if isinstance(panel, QWidget):
            panel.installEventFilter(self)  # keys pressed anywhere in the panel answer too

    # -- suggesting ------------------------------------------------------------------------------------
    def start(self) -> Any:
        """Suggest places in a worker thread; returns the worker (or None, the reason in the status)."""
        from bigslide.errors import BigslideError

        checkpoint = self.panel.chosen_checkpoint()
        try:
            if self.count.refusal():
                raise BigslideError(self.count.refusal() or "")
            problem = self.panel.checkpoint_problem()
            if problem is not None:
                raise BigslideError(problem)
            table = self.session.table()
            table = table.like([e for e in table.entries if e.split in (None, "train")])
            if not table.entries:
                raise BigslideError(
                    "no slide of the training split (split train or empty) in the Slides panel"
                )
        except BigslideError as err:
            return self._fail(f"No place to suggest: {err}.")
        self.end(quiet=True)
        worker = create_worker(
            _suggest,
            checkpoint,
            table,
            self.count.value(),
            session=self.session,
            table_csv=self.session.table_path,
            device=self.panel.device.currentText(),
            slide_mpp=self.session.slide_mpp,
            _start_thread=False,
            _ignore_errors=True,
        )
        worker.returned.connect(self.show_queue)
        worker.errored.connect(lambda err: self._fail(in_panel_words(f"No place to suggest: {err}")))
        worker.finished.connect(self._on_finished)
        self.worker = worker
        self.suggest_button.setEnabled(False)
        self.status.setText(
            f"Running {checkpoint.name} on {counted(len(table.entries), 'training slide')} to find places…"
        )
        worker.start()
        return worker

    def _on_finished(self) -> None:
        self.worker = None
        self.suggest_button.setEnabled(True)

    def _fail(self, text: str) -> None:
        self.status.setText(text)
        show_error(text)

    def show_queue(self, suggestions: list[Suggestion]) -> None:
        if not suggestions:
            self.status.setText(
                "No place to suggest: the model attends to no tile above its slide's mean outside the "
                "annotated areas."
            )
            return
        self.queue, self.index, self.tally = list(suggestions), 0, Counter()
        classes = task_classes(self.session)[1:]
        lesions = [c for c in classes if c != normal_class(classes)] or classes
        self.keys = {**answer_keys(lesions), NOT_LESION: "N", SKIP: "S"}
        self._make_buttons([*lesions, NOT_LESION, SKIP])
        for answer, key in self.keys.items():
            on_key = lambda _viewer, a=answer: self._on_canvas_key(a)  # noqa: E731 - napari binds the viewer
            self.unbound[key] = self.viewer.bind_key(key, on_key, overwrite=True)
        slides = len({s.slide for s in suggestions})
        note = flat_attention(suggestions)
        self.status.setText(
            f"{counted(len(suggestions), 'place')} suggested on {counted(slides, 'slide')}."
            + (f" Note: {note[0].upper()}{note[1:]}." if note else "")
        )
        self._show_queue(True)
        self.show_place()

    def _make_buttons(self, answers: list[str]) -> None:
        for button in self.buttons.values():
            self.answer_row.removeWidget(button)
            button.deleteLater()
        self.buttons = {}
        for answer in answers:
            key = self.keys.get(answer)
            button = QPushButton(f"{answer} ({key})" if key else answer)
            button.setToolTip(
                "Moves on without saving" if answer == SKIP else f"Saves the place as '{answer}'"
            )
            button.clicked.connect(lambda _c=False, a=answer: self.answer(a))
            self.answer_row.addWidget(button)
            self.buttons[answer] = button

    def _show_queue(self, shown: bool) -> None:
        for widget in (self.place, self.where, self.reason, self.stop_button, *self.buttons.values()):
            widget.setVisible(shown)

    # -- the place shown ---------------------------------------------------------------------------------
    def current(self) -> Suggestion | None:
        return self.queue[self.index] if self.queue and self.index < len(self.queue) else None

    def show_place(self) -> None:
        """Open the current place's slide if needed, outline the place on it and zoom onto it."""
        s = self.current()
        if s is None:
            return
        left = len(self.queue) - self.index
        self.place.setText(f"Place {self.index + 1} of {len(self.queue)} — {left} left")
        self.where.setText(f"{s.slide.name}: {place_title(s)}")
        self.reason.setText(f"Why: {s.reason}")
        slide = self._slide_layer(s.slide)
        if slide is None:
            try:
                self.viewer.open(str(s.slide), plugin="bigslide")
            except Exception as err:  # napari wraps a reader's failure in errors of its own
                self._fail(f"Could not open {s.slide.name}: {err}; press Skip (S) to go on.")
            slide = self._slide_layer(s.slide)
            if slide is None:
                return
        remove_layers(self.viewer, role=ROLE)
        kwargs = regions_layer_kwargs(slide, f"Place {self.index + 1}: {s.slide.name}", role=ROLE)
        x0, y0, x1, y1 = s.box
        kwargs.update(edge_color=hex_colour(REVIEW_COLOUR), edge_width=max(x1 - x0, y1 - y0) / 50)
        self.viewer.add_shapes(polygons_to_shapes([s.polygon]), shape_type="polygon", **kwargs)
        self.panel.slide_box.setCurrentText(slide.name)  # Run on slide and Draw follow the place shown
        # the slide, not a Shapes layer, is active: Shapes layers take L and S for their own tools
        self.viewer.layers.selection.active = slide
        self._zoom_onto(slide, s)

    def _zoom_onto(self, slide: Any, s: Suggestion) -> None:
        placement = placement_of(slide)
        sy, sx = placement.pixel_scale
        x, y = s.centre
        x0, y0, x1, y1 = s.box
        # level-0 position (x, y) is world offset + (position - 1/2) * µm/px (pixel k spans [k, k + 1))
        cy, cx = placement.offset[0] + (y - 0.5) * sy, placement.offset[1] + (x - 0.5) * sx
        hy, hx = CONTEXT * (y1 - y0) * sy / 2, CONTEXT * (x1 - x0) * sx / 2
        show_area(self.viewer, (cy - hy, cx - hx), (cy + hy, cx + hx))

    def _slide_layer(self, path: Path) -> Any:
        key = Path(path).resolve()
        return next((s for s in slide_layers(self.viewer) if Path(s.metadata["path"]).resolve() == key), None)

    # -- answers -----------------------------------------------------------------------------------------
    def answer(self, answer: str) -> Path | None:
        """Save the current place as `answer` (Skip: nothing saved) and show the next; returns the
        annotations file written, or None."""
        s = self.current()
        if s is None:
            return None
        saved = None
        if answer != SKIP:
            saved = self._save(s, answer)
            if saved is None:
                return None  # not written: the place stays, the reason in the status line
        self.tally[answer] += 1
        self.index += 1
        done = f"Place {self.index} {f'saved as {answer}' if saved else 'skipped'}"
        self.status.setText(f"{done} ({s.slide.name}).")
        if self.current() is None:
            self.end()
        else:
            self.show_place()
        return saved

    def _on_canvas_key(self, answer: str) -> None:
        """A key on the canvas answers only while the queue is on screen, never unseen (a closed panel)."""
        top = self.window() or self  # a closed panel is its own window; a floating dock's parent is napari's
        if (top.parentWidget() is not None or isinstance(top, QMainWindow)) and self.isVisibleTo(top):
            self.answer(answer)
            return
        self.end()
        show_warning(
            "Where to look next is not on screen (its panel was closed or hidden): that key saved "
            "nothing and the queue was stopped; press Suggest places again to go on."
        )

    def _save(self, s: Suggestion, answer: str) -> Path | None:
        from bigslide.errors import BigslideError

        row = self.session.row(s.slide) or self.session.add(s.slide)
        target = row.annotations or annotations_path(self.session.table_path or row.path, row.path)
        try:
            saved = save_answer(s, answer, target, task_classes(self.session)[1:])
        except (BigslideError, OSError) as err:
            self._fail(f"Not saved: {err}")
            return None
        slide = self._slide_layer(s.slide)
        layer = annotation_layer(self.viewer, slide.metadata["path"]) if slide is not None else None
        if layer is not None:  # an open annotations layer is what its Save writes: it gets the answer too
            drawing = layer.feature_defaults  # the class the annotation box draws next stays
            layer.feature_defaults = {CLASS: answer}
            colour = hex_colour(class_colour(answer, task_classes(self.session)))
            layer.add_polygons(polygons_to_shapes([s.polygon]), edge_color=colour)
            layer.feature_defaults = drawing
        self.session.update(row.path, annotations=saved, annotated=None)
        self._count(row.path)
        return saved

    def _count(self, path: Path) -> None:
        """Count the slide's annotated tiles as the annotation box does; only the newest count lands."""
        worker = count_worker(self.viewer, self.session, path)
        if worker is None:
            return
        ticket = self.counts[path] = self.counts.get(path, 0) + 1
        worker.returned.connect(lambda n: self._counted(path, ticket, n))
        worker.errored.connect(lambda err: self.status.setText(f"Counting annotated tiles failed: {err}"))
        worker.start()

    def _counted(self, path: Path, ticket: int, n: int) -> None:
        if self.counts.get(path) == ticket:  # answers come faster than counts: an older one is stale
            self.session.update(path, annotated=n)

    def end(self, *, quiet: bool = False) -> None:
        """Close the queue: its keys given back, its outline removed, what was answered in the status."""
        for key in self.keys.values():
            self.viewer.bind_key(key, self.unbound.pop(key, None), overwrite=True)
        self.keys = {}
        remove_layers(self.viewer, role=ROLE)
        self._show_queue(False)
        if self.queue and not quiet:
            done = self.index == len(self.queue)
            parts = [
                f"{self.tally[a]} {a}" if a != SKIP else f"{self.tally[a]} skipped" for a in self.buttons
            ]
            head = (
                f"All {counted(len(self.queue), 'place')} answered"
                if done
                else f"Stopped after {self.index} of {counted(len(self.queue), 'place')}"
            )
            self.status.setText(f"{head}: {', '.join(parts)}; {FINISH}.")
        self.queue, self.index = [], 0

    def eventFilter(self, watched: QObject | None, event: QEvent | None) -> bool:  # noqa: N802 - Qt override
        keys = getattr(self, "keys", None)  # a closed panel's filter may see keys while it is torn down
        if keys and isinstance(event, QKeyEvent) and event.type() == QEvent.Type.KeyPress:
            plain = not event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
            answer = next((a for a, k in keys.items() if k == event.text().upper()), None)
            if plain and answer is not None:
                self.answer(answer)
                return True
        return super().eventFilter(watched, event)


def _suggest(
    checkpoint: Path, table: Any, count: int, *, session: Session, **kwargs: Any
) -> list[Suggestion]:
    # in the worker thread: the decode workers start here, never on the viewer's thread
    from bigslide.engine.suggest import suggest_from_checkpoint
    from bigslide.napari._gc import settle_imports

    settle_imports()
    return suggest_from_checkpoint(checkpoint, table, count, processes=session.decode_processes(), **kwargs)
