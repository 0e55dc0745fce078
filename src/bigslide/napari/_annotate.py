"""Teach by annotation, the drawing half: polygons classed as one of the task's classes or "Not lesion",
drawn over a slide beside its heatmap, saved per slide as QuPath GeoJSON next to the slide table (and read
back from QuPath). The Results panel embeds it; `_retrain.RetrainBox` trains on what is saved here.

The annotations of a slide live in a Shapes layer (role "annotations") placed on the slide like its
regions: vertices are level-0 (row, col). Each shape's class is its `class` feature; new shapes take the
class chosen in the drop-down, and are drawn in its colour with its name.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import shapely
from napari.qt.threading import create_worker
from qtpy.QtWidgets import QComboBox, QFileDialog, QGroupBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

from bigslide.errors import BigslideError
from bigslide.napari._formats import OUTLINE_FILES
from bigslide.napari._layers import polygons_to_shapes, regions_layer_kwargs, shapes_to_polygons
from bigslide.napari._qt import connect_while_alive, paint_now
from bigslide.napari._roles import layers_with_role, left_by_closed_slides
from bigslide.napari._toasts import show_error, show_info, show_warning
from bigslide.tiling.annotations import (
    LESION,
    NOT_LESION,
    Annotation,
    annotations_path,
    class_colour,
    read_annotations,
    write_annotations,
)
from bigslide.words import counted

if TYPE_CHECKING:
    import napari

    from bigslide.data.slides import SlideCache
    from bigslide.napari._session import Session
    from bigslide.tiling.pixel_classes import TissueSettings

ROLE = "annotations"
CLASS = "class"  # the Shapes layer's feature holding each shape's class


def task_classes(session: Session) -> list[str]:
    """The classes an annotation may have: "Not lesion" first, then the training set's classes (its
    labels; "Lesion" for survival and regression)."""
    if session.task != "classification":
        return [NOT_LESION, LESION]
    from bigslide.data.labels import class_order

    labels = sorted({r.label.strip() for r in session.rows if r.label.strip()}, key=class_order)
    return [NOT_LESION, *labels]


def hex_colour(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def annotation_layer(viewer: napari.Viewer, slide_path: str) -> Any:
    """The slide's annotations layer, or None."""
    return next(iter(layers_with_role(viewer, ROLE, str(slide_path))), None)


def add_annotation_layer(
    viewer: napari.Viewer, slide_layer: Any, annotations: list[Annotation], classes: list[str]
) -> Any:
    """A Shapes layer of `annotations` over the slide, each in its class's colour and labelled with it."""
    shapes, names = [], []
    for annotation in annotations:
        parts = polygons_to_shapes([annotation.geometry])
        shapes += parts
        names += [annotation.name] * len(parts)
    kwargs = regions_layer_kwargs(slide_layer, f"{slide_layer.name} annotations", role=ROLE)
    colours = [hex_colour(class_colour(name, classes)) for name in names]
    layer = viewer.add_shapes(
        shapes or None,
        shape_type="polygon",
        features={CLASS: np.array(names, dtype=object)},
        text={"string": "{" + CLASS + "}", "color": "white", "size": 10, "anchor": "upper_left"},
        **{**kwargs, "edge_color": colours or "white"},
    )
    layer.feature_defaults = {CLASS: classes[0]}
    return layer


def layer_annotations(layer: Any) -> tuple[list[Annotation], int]:
    """The classed polygons of an annotations layer (level-0 pixels), and how many of its shapes enclose no
    area (a line, two corners, a double-click on the second corner) and were left out."""
    names = list(layer.features[CLASS]) if CLASS in layer.features else [NOT_LESION] * len(layer.data)
    out, flat = [], 0
    for index, name in enumerate(names):
        single = _OneShape(layer.data[index], layer.shape_type[index])
        polygons = shapes_to_polygons(single)  # type: ignore[arg-type]
        out += [Annotation(polygon, str(name)) for polygon in polygons]
        flat += not polygons
    return out, flat


class _OneShape:
    """One shape of a layer, as `shapes_to_polygons` reads a layer."""

    def __init__(self, vertices: np.ndarray, kind: str) -> None:
        self.data, self.shape_type = [vertices], [kind]


class AnnotateBox(QGroupBox):
    """Draw, save and load a slide's teaching annotations; `slide_layer()` says which slide."""

    def __init__(self, viewer: napari.Viewer, session: Session, slide_layer: Any) -> None:
        super().__init__("Teach by annotation")
        self.viewer, self.session, self.slide_layer = viewer, session, slide_layer
        self.count_worker: Any = None
        self.class_box = QComboBox()
        self.class_box.setToolTip(
            "The class of the polygons drawn next: one of the task's classes (tissue that shows it: where "
            "the model should look) or 'Not lesion' (necrosis, folds, normal glands: where it should not)"
        )
        self.draw_button = QPushButton("Draw")
        self.draw_button.setToolTip(
            "Adds the slide's annotations layer (if needed) and starts drawing polygons"
        )
        self.save_button = QPushButton("Save")
        self.save_button.setToolTip("Saves the slide's annotations as QuPath GeoJSON next to the slide table")
        self.load_button = QPushButton("Load QuPath…")
        self.load_button.setToolTip("Reads annotations exported from QuPath (GeoJSON) onto the slide")
        self.status = QLabel("Choose a class, press Draw and outline tissue on the slide.")
        self.status.setWordWrap(True)
        self.draw_button.clicked.connect(lambda: self.draw())
        self.save_button.clicked.connect(lambda: self.save())
        self.load_button.clicked.connect(lambda: self.load())
        self.class_box.currentTextChanged.connect(self._on_class)
        # chosen again as it stands (an outline picked to take the class shown): no change signal
        self.class_box.activated.connect(lambda _index: self._on_class(self.class_box.currentText()))
        buttons = QHBoxLayout()
        for button in (self.draw_button, self.save_button, self.load_button):
            buttons.addWidget(button)
        self.rows = QVBoxLayout(self)
        self.rows.addWidget(self.class_box)
        self.rows.addLayout(buttons)
        self.rows.addWidget(self.status)
        connect_while_alive(session.changed, self, self.refresh_classes)
        self.refresh_classes()

    def refresh_classes(self) -> None:
        current = self.class_box.currentText()
        self.class_box.blockSignals(True)
        self.class_box.clear()
        for name in task_classes(self.session):
            self.class_box.addItem(name)
        self.class_box.setCurrentText(current)
        self.class_box.blockSignals(False)

    def chosen_class(self) -> str:
        return self.class_box.currentText() or NOT_LESION

    def _on_class(self, name: str) -> None:
        slide = self.slide_layer()
        layer = annotation_layer(self.viewer, slide.metadata["path"]) if slide is not None else None
        if layer is None or not name:
            return
        colour = hex_colour(class_colour(name, self._classes()))
        picked = sorted(layer.selected_data) if layer.mode in ("select", "direct") else []
        if picked:
            # outlines picked with the select tool: choosing a class relabels them, as a person means it
            # (left alone, they would be saved and taught with the class they were drawn with)
            features = layer.features.copy()
            features.iloc[picked, features.columns.get_loc(CLASS)] = name
            layer.features = features
            layer.current_edge_color = colour  # napari colours the selected shapes
            layer.feature_defaults = {CLASS: name}
            self.status.setText(f"{counted(len(picked), 'outline')} now '{name}'; press Save to keep it.")
            return
        # napari gives the selected shapes the current colour: the outline just drawn (still selected)
        # keeps its own class's colour when the class of the next one is chosen
        layer.selected_data = set()
        layer.feature_defaults = {CLASS: name}
        layer.current_edge_color = colour

    def _classes(self) -> list[str]:
        return [self.class_box.itemText(i) for i in range(self.class_box.count())]

    # -- drawing ---------------------------------------------------------------------------------------
    def layer(self, create: bool = False) -> Any:
        """The chosen slide's annotations layer; `create`: made (from its saved file, if any) when missing."""
        slide = self.slide_layer()
        if slide is None:
            return None
        layer = annotation_layer(self.viewer, slide.metadata["path"])
        if layer is None and create:
            row = self.session.row(slide.metadata["path"])
            saved = read_annotations(row.annotations) if row is not None and row.annotations else []
            layer = add_annotation_layer(self.viewer, slide, saved, self._classes())
        return layer

    def draw(self) -> Any:
        """The chosen slide's annotations layer, selected, in polygon mode, drawing the chosen class."""
        if self.slide_layer() is None:
            self._fail("Open a slide first, then choose it above.")
            return None
        self.status.setText(
            f"Drawing '{self.chosen_class()}' on {self.slide_layer().name}: click the outline's corners, "
            "double-click to close it. Press Save when done."
        )
        if self.layer() is None:
            paint_now()  # the line is on screen before napari makes the slide's first outline layer
        try:
            layer = self.layer(create=True)
        except BigslideError as err:
            self._fail(str(err))
            return None
        self._on_class(self.chosen_class())
        self.viewer.layers.selection.active = layer
        layer.mode = "add_polygon"
        return layer

    # -- files -----------------------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write the chosen slide's annotations next to the slide table (or, without one, next to the
        slide) and point its row at them; the annotated tiles are counted in the background."""
        slide = self.slide_layer()
        layer = self.layer()
        if slide is None or layer is None or not len(layer.data):
            self._fail(
                left_by_closed_slides(self.viewer, (ROLE,), "outlines")
                or "Nothing to save: draw annotations on the slide first (Draw)."
            )
            return None
        path = Path(slide.metadata["path"])
        table = self.session.table_path or path
        target = annotations_path(table, path)
        annotations, flat = layer_annotations(layer)
        unsaved = (
            f"{flat} outline{'s have' if flat != 1 else ' has'} no area and "
            f"{'were' if flat != 1 else 'was'} not saved"
        )
        if not annotations:
            self._fail(f"Nothing saved: {unsaved} (an outline needs three corners around an area).")
            return None
        try:
            saved = write_annotations(annotations, target, self._classes()[1:])
        except OSError as err:
            self._fail(f"Could not write {target}: {err.strerror or err}")
            return None
        row = self.session.row(path) or self.session.add(path, from_layer=True)
        self.session.update(row.path, annotations=saved, annotated=None)
        written = f"Saved {counted(len(annotations), 'annotation')} to {saved}"
        self.status.setText(f"{written}{f'; {unsaved}' if flat else ''}; counting annotated tiles…")
        if flat:
            show_warning(f"{slide.name}: {unsaved} (an outline needs three corners around an area).")
        self.count(row.path)
        return saved

    def load(self, path: str | Path | None = None) -> Any:
        """Read a QuPath GeoJSON export onto the chosen slide, beside the outlines its layer holds."""
        slide = self.slide_layer()
        if slide is None:
            self._fail("Open a slide first, then choose it above.")
            return None
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "QuPath or ASAP annotations", "", OUTLINE_FILES)
            if not path:
                return None
        try:
            annotations = read_annotations(path)
        except BigslideError as err:
            self._fail(str(err))
            return None
        width, height = slide.metadata["level_dimensions"][0]
        frame = shapely.box(0, 0, width, height)
        on_slide = [a for a in annotations if a.geometry.intersects(frame)]
        if annotations and not on_slide:
            x0, y0, x1, y1 = shapely.union_all([a.geometry for a in annotations]).bounds
            self._fail(
                f"{Path(path).name}: none of its {counted(len(annotations), 'outline')} lies on {slide.name} "
                f"({width} x {height} px; they span x {x0:.0f}..{x1:.0f}, y {y0:.0f}..{y1:.0f}): an export "
                "of another slide? Nothing was read."
            )
            return None
        old = annotation_layer(self.viewer, slide.metadata["path"])
        kept: list[Annotation] = []
        if old is not None:  # what is drawn already stays (it may not be saved): the file's are added
            kept, _flat = layer_annotations(old)
            self.viewer.layers.remove(old)
        layer = add_annotation_layer(self.viewer, slide, kept + on_slide, self._classes())
        names = sorted({a.name for a in on_slide})
        off = len(annotations) - len(on_slide)
        self.status.setText(
            f"Read {counted(len(on_slide), 'annotation')} ({', '.join(names) or 'none'}) from "
            f"{Path(path).name}"
            + (f"; {counted(off, 'outline')} outside {slide.name} left out" if off else "")
            + (f", beside the {counted(len(kept), 'outline')} already there" if kept else "")
            + "; press Save to keep them with the slide table."
        )
        return layer

    def count(self, path: Path) -> Any:
        """Count the slide's annotated tiles at the Slides panel's tiling, in a worker thread."""
        worker = count_worker(self.viewer, self.session, path)
        if worker is None:
            return None
        worker.returned.connect(lambda n: self._counted(path, n))
        worker.errored.connect(lambda err: self._fail(f"Counting annotated tiles failed: {err}"))
        self.count_worker = worker
        worker.start()
        return worker

    def _counted(self, path: Path, count: int) -> None:
        self.session.update(path, annotated=count)
        self.status.setText(f"{path.name}: {count} tiles lie in its annotations (Slides panel: Annotated).")
        show_info(f"{path.name}: {count} annotated tiles")

    def _fail(self, text: str) -> None:
        self.status.setText(text)
        show_error(text)


def count_worker(viewer: Any, session: Session, path: Path) -> Any:
    """A worker (not started) counting the tiles of slide `path` that lie in its saved annotations, at the
    Slides panel's tiling; None when its row has no annotations file."""
    from bigslide.napari._regions import slide_regions

    row = session.row(path)
    if row is None or row.annotations is None:
        return None
    return create_worker(
        _count_annotated,
        session.slides(),
        path,
        row.annotations,
        slide_regions(viewer, session, path),
        session.tile_size,
        session.target_mpp,
        session.min_tissue,
        session.tissue,
        _start_thread=False,
        _ignore_errors=True,
    )


def _count_annotated(
    slides: SlideCache,
    path: Path,
    annotations: Path,
    regions: Any,
    tile_size: int,
    target_mpp: float,
    min_tissue: float,
    tissue: TissueSettings,
) -> int:
    from bigslide.data.slides import tile_slide
    from bigslide.tiling.annotations import annotated_count

    what = f"{path}: a worker died tiling it"
    grid = slides.run(tile_slide, path, tile_size, target_mpp, min_tissue, regions, tissue, what=what)
    return annotated_count(read_annotations(annotations), grid.coords, grid.tile_size_level0)
