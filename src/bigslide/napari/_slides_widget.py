"""Slides panel: the training set as a table (`SlidesTable`, `_slides_table.py`), the buttons that load,
save and trim it, the tiling settings (tile size, resolution, min tissue, pen marks) and the tile count
they give, and the table saved as a CSV."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari.qt.threading import thread_worker
from qtpy.QtWidgets import QCheckBox, QFileDialog, QFormLayout, QHBoxLayout, QLabel, QPushButton, QWidget

from bigslide.napari._formats import SUFFIXES
from bigslide.napari._number import NumberField
from bigslide.napari._qt import connect_while_alive, scrolled
from bigslide.napari._slides_table import SlidesTable
from bigslide.napari._toasts import show_error, show_info, withdraw
from bigslide.tiling.pixel_classes import PEN_FLATNESS
from bigslide.words import counted

if TYPE_CHECKING:
    from bigslide.data.slides import SlideCache
    from bigslide.napari._session import Session
    from bigslide.tiling.pixel_classes import TissueSettings


COUNT_FAILURES = ("Counting tiles failed", "Not counted")
"""How the status line and toast of a count that left slides uncounted begin."""


class SlidesWidget(SlidesTable):
    """Lists open slides and slides from a table; what a task learns from is typed in place."""

    def build(self, body: QWidget) -> None:
        from bigslide.napari._session import session_for

        self.session: Session = session_for(self.viewer)
        self.count_worker: Any = None
        self.count_error: str | None = None
        self.build_table()

        s = self.session
        self.tile_size = NumberField(
            int, s.tile_size, name="tile size", minimum=16, maximum=4096, step=16, tip="Side of a tile (px)"
        )
        self.target_mpp = NumberField(
            float,
            s.target_mpp,
            name="resolution",
            above=0,
            maximum=64,
            step=0.25,
            tip="µm per pixel the model sees tiles at, whatever the scanner (20x = 0.5, 40x = 0.25)",
        )
        self.slide_mpp = NumberField(
            float,
            s.slide_mpp,
            name="slide µm/px if unstated",
            above=0,
            maximum=64,
            step=0.25,
            blank="from file",
            tip="Level-0 µm per pixel of slides whose files state none (their scanner's); "
            "leave empty to read it from each file",
        )
        self.min_tissue = NumberField(
            float,
            s.min_tissue,
            name="min tissue",
            minimum=0,
            maximum=1,
            step=0.05,
            tip="Tiles with less tissue than this fraction (0-1) are skipped",
        )
        self.pen_marks = QCheckBox()
        self.pen_marks.setToolTip(
            "Take flat films of any colour lying on the glass for ink on H&E slides (data.ink_flatness "
            f"{PEN_FLATNESS:g}, on by default): violet, pink or light blue pens that colour alone keeps "
            "as tissue. IHC slides (no eosin) are left as colour alone judges them"
        )
        self.pen_marks.setChecked(s.tissue.ink_flatness > 0)
        self.pen_marks.toggled.connect(self._on_tiling_changed)
        for field in (self.tile_size, self.target_mpp, self.slide_mpp, self.min_tissue):
            field.valueChanged.connect(self._on_tiling_changed)
            field.problemChanged.connect(lambda _p, f=field: s.set_problem(f.name, f.refusal()))

        self.add_button = QPushButton("Add slides…")
        self.add_button.setToolTip(
            "Add slide files to the table without opening them (several at once); then give each its label"
        )
        self.add_button.clicked.connect(lambda: self.add_slides())
        self.load_button = QPushButton("Load table…")
        self.save_button = QPushButton("Save table…")
        self.remove_button = QPushButton("Remove")
        self.case_button = QPushButton("One case")
        self.case_button.setToolTip(
            "Make the selected slides one case (one patient): trained and predicted as one bag of all their "
            "tiles, with one label; rename it in the Case column"
        )
        self.case_button.clicked.connect(lambda: self.one_case())
        self.count_button = QPushButton("Count tiles")
        self.load_button.setToolTip(
            "Add slides from a CSV: slide,label (or time,event / target)[,split][,regions][,case][,mpp]"
        )
        self.count_button.setToolTip("Tiles kept after tissue and region filtering, per slide")
        self.load_button.clicked.connect(lambda: self.load_csv())
        self.save_button.clicked.connect(lambda: self.save_csv())
        self.remove_button.clicked.connect(self.remove_selected)
        self.count_button.clicked.connect(self.count_tiles)
        self.status = QLabel()
        self.status.setWordWrap(True)

        settings = QFormLayout()
        settings.addRow("tile size (px)", self.tile_size)
        settings.addRow("resolution (µm/px)", self.target_mpp)
        settings.addRow("slide µm/px if unstated", self.slide_mpp)
        settings.addRow("min tissue (0-1)", self.min_tissue)
        settings.addRow("pen marks on the glass", self.pen_marks)
        layout = scrolled(body)
        layout.addWidget(self.table)
        # the table's buttons, then the rows': six in one row are wider than the dock
        for row in (
            (self.add_button, self.load_button, self.save_button),
            (self.remove_button, self.case_button, self.count_button),
        ):
            buttons = QHBoxLayout()
            for button in row:
                buttons.addWidget(button)
            layout.addLayout(buttons)
        layout.addLayout(settings)
        layout.addWidget(self.status)
        layout.addStretch()

        connect_while_alive(self.session.changed, self, self.refresh)
        self.viewer.layers.events.inserted.connect(self._on_layer_inserted)
        self.viewer.layers.events.removed.connect(self._on_layer_removed)
        for layer in self.viewer.layers:
            self._add_layer(layer)
        self.refresh()

    # -- layers --------------------------------------------------------------------------------------
    def _on_layer_inserted(self, event: Any) -> None:
        self._add_layer(event.value)

    def _add_layer(self, layer: Any) -> None:
        from bigslide.napari._roles import ROLE

        meta = layer.metadata
        if meta.get(ROLE) == "slide" and meta.get("path"):
            self.session.add(
                meta["path"],
                label=str(meta.get("label", "")),
                split=str(meta.get("split", "")),
                from_layer=True,
            )

    def _on_layer_removed(self, event: Any) -> None:
        from bigslide.napari._roles import ROLE

        meta = event.value.metadata
        row = self.session.row(meta["path"]) if meta.get(ROLE) == "slide" and meta.get("path") else None
        if row is not None and row.from_layer:
            self.session.remove(row.path)

    # -- files ---------------------------------------------------------------------------------------
    def add_slides(self, paths: list[str] | None = None) -> None:
        """Add slide files (chosen in a dialog when `paths` is None) as unlabelled rows."""
        if paths is None:
            patterns = " ".join(f"*{suffix}" for suffix in (*SUFFIXES, ".png", ".jpg", ".jpeg"))
            paths, _ = QFileDialog.getOpenFileNames(
                self, "Add slides", "", f"Slides ({patterns});;All files (*)"
            )
            if not paths:
                return
        new = [path for path in paths if self.session.row(path) is None]
        for path in paths:
            self.session.add(path, emit=False)
        self.session.changed.emit()
        self.status.setText(f"Added {counted(len(new), 'slide')}. {self.describe()}")

    def load_csv(self, path: str | Path | None = None) -> None:
        from bigslide.errors import BigslideError

        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Load slide table", "", "Slide table (*.csv)")
            if not path:
                return
        try:
            count = self.session.load_csv(path)
        except BigslideError as err:
            self.status.setText(f"Not loaded: {err}")
            show_error(str(err))
            return
        self.status.setText(f"Loaded {counted(count, 'slide')}. {self.describe()}")

    def save_csv(self, path: str | Path | None = None) -> Path | None:
        from bigslide.errors import BigslideError

        if path is None:
            path, _ = QFileDialog.getSaveFileName(
                self, "Save slide table", "slides.csv", "Slide table (*.csv)"
            )
            if not path:
                return None
        try:
            saved = self.session.save_csv(path)
        except BigslideError as err:
            self.status.setText(f"Not saved: {err}")
            show_error(str(err))
            return None
        self.status.setText(f"Saved {counted(len(self.session.rows), 'slide')} to {saved}.")
        return saved

    # -- tiles ---------------------------------------------------------------------------------------
    def _on_tiling_changed(self) -> None:
        s = self.session
        s.tile_size = int(self.tile_size.value() or s.tile_size)
        s.target_mpp = float(self.target_mpp.value() or s.target_mpp)
        s.slide_mpp = self.slide_mpp.value()
        s.min_tissue = float(self.min_tissue.value() or 0.0)
        s.tissue = dataclasses.replace(
            s.tissue, ink_flatness=PEN_FLATNESS if self.pen_marks.isChecked() else 0.0
        )
        for row in s.rows:
            row.tiles = None
            row.untiled = None  # why it could not be tiled: seen again, if still so, by the next count
        # what a failed count asked for may be what was just typed: its words no longer stand (the status
        # line describes the table again)
        for failure in COUNT_FAILURES:
            withdraw(failure)
        self.refresh()
        s.tiling_changed.emit()  # the tile preview follows

    def count_tiles(self) -> Any:
        """Count tiles per slide in a worker thread; returns the worker (already started)."""
        from bigslide.errors import BigslideError
        from bigslide.napari._regions import slide_regions

        refused = self.session.problems()
        if refused:
            self.status.setText("Not counted: " + "; ".join(refused) + ".")
            show_error(self.status.text())
            return None
        try:
            jobs = [
                (row.path, slide_regions(self.viewer, self.session, row.path), row.annotations)
                for row in self.session.rows
            ]
        except BigslideError as err:
            show_error(str(err))
            return None
        self.count_button.setEnabled(False)
        self.status.setText("Counting tiles…")
        s = self.session
        worker = _count_tiles(s.slides(), jobs, s.tile_size, s.target_mpp, s.min_tissue, s.tissue)
        self.count_error = None
        worker.yielded.connect(
            lambda result: self.session.update(
                result[0], tiles=result[1], annotated=result[2], untiled=result[3]
            )
        )
        worker.errored.connect(self._count_failed)
        worker.finished.connect(self._count_finished)
        self.count_worker = worker
        worker.start()
        return worker

    def _count_failed(self, err: Exception) -> None:
        from bigslide.napari._run import in_panel_words

        self.count_error = in_panel_words(f"Counting tiles failed: {err}")
        show_error(self.count_error)

    def _count_finished(self) -> None:
        self.count_button.setEnabled(True)
        if self.count_error is not None:
            self.status.setText(self.count_error)
            return
        rows = self.session.rows
        untiled = [r for r in rows if r.untiled]
        tiled = len(rows) - len(untiled)
        tiles = f"{counted(sum(r.tiles or 0 for r in rows), 'tile')} in {counted(tiled, 'slide')}"
        if untiled:  # marked in the table; the others are counted
            from bigslide.napari._run import in_panel_words

            why = "; ".join(f"{r.path.name}: {in_panel_words(r.untiled or '')}" for r in untiled)
            text = f"Counting tiles failed on {counted(len(untiled), 'slide')}: {why}"
            text += f". {tiles[0].upper()}{tiles[1:]} (the others)." if tiled else ""
            self.status.setText(text)
            show_error(text)
            return
        self.status.setText(f"{tiles}.")
        show_info(tiles)


@thread_worker(ignore_errors=True)
def _count_tiles(
    slides: SlideCache,
    jobs: list[tuple[Path, Any, Path | None]],
    tile_size: int,
    target_mpp: float,
    min_tissue: float,
    tissue: TissueSettings,
) -> Generator[tuple[Path, int | None, int | None, str | None], None, None]:
    from bigslide.data.slides import tile_slide
    from bigslide.errors import DataError, SlideError
    from bigslide.tiling.annotations import annotated_count, read_annotations

    for path, regions, taught_by in jobs:
        what = f"{path}: a worker died tiling it"
        try:  # a slide that cannot be tiled is marked; the others are counted
            grid = slides.run(tile_slide, path, tile_size, target_mpp, min_tissue, regions, tissue, what=what)
        except (SlideError, DataError) as err:
            yield path, None, None, str(err).removeprefix(f"{path}: ")
            continue
        taught = None
        if taught_by is not None:
            taught = annotated_count(read_annotations(taught_by), grid.coords, grid.tile_size_level0)
        yield path, len(grid), taught, None
