"""Regions panel: draw the areas tiles (or the whole image) are sampled from and the areas to leave out
(QuPath's "Ignore*" class), save/load QuPath GeoJSON, and preview the tiles that training will use
beside those the tissue check leaves out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari.qt.threading import thread_worker
from qtpy.QtCore import QTimer
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QWidget,
)

from bigslide.errors import BigslideError
from bigslide.napari._formats import OUTLINE_FILES
from bigslide.napari._layers import add_tile_preview, polygons_to_shapes, regions_layer_kwargs
from bigslide.napari._panel import Panel
from bigslide.napari._qt import connect_while_alive, scrolled, set_items
from bigslide.napari._regions import layer_regions, slide_regions
from bigslide.napari._roles import layers_with_role, left_by_closed_slides, remove_layers, slide_layers
from bigslide.napari._run import in_panel_words
from bigslide.napari._tile_check import add_rejected_tiles
from bigslide.napari._toasts import show_error

if TYPE_CHECKING:
    from bigslide.data.slides import SlideCache
    from bigslide.napari._session import Session
    from bigslide.tiling.pixel_classes import TissueSettings


class RegionsWidget(Panel):
    """One click gives the selected slide a "sampling regions" layer to draw polygons in."""

    def build(self, body: QWidget) -> None:
        from bigslide.napari._session import session_for

        self.session: Session = session_for(self.viewer)
        self.preview_worker: Any = None

        self.slide_box = QComboBox()
        self.slide_box.setToolTip("The slide the regions belong to")
        self.new_button = QPushButton("New sampling regions")
        self.new_button.setToolTip("Adds a layer for this slide and starts polygon drawing")
        self.exclude_button = QPushButton("New areas to leave out")
        self.exclude_button.setToolTip(
            "Adds a layer for areas no tile is sampled from (saved as QuPath's 'Ignore*' class)"
        )
        self.load_button = QPushButton("Load GeoJSON…")
        self.save_button = QPushButton("Save GeoJSON…")
        self.preview = QCheckBox("Preview sampled tiles")
        self.preview.setToolTip(
            "Outlines every tile that passes the tissue and region filters (yellow); tiles left out for "
            "ink are magenta, out-of-focus ones orange"
        )
        self.status = QLabel("Select a slide, press 'New sampling regions' and draw polygons.")
        self.status.setWordWrap(True)

        self.new_button.clicked.connect(lambda: self.new_regions_layer())
        self.exclude_button.clicked.connect(lambda: self.new_regions_layer(role="exclusions"))
        self.load_button.clicked.connect(lambda: self.load_geojson())
        self.save_button.clicked.connect(lambda: self.save_geojson())
        self.preview.toggled.connect(self._on_preview_toggled)
        self._preview_timer = QTimer(self)
        self._preview_timer.setSingleShot(True)
        self._preview_timer.setInterval(600)
        self._preview_timer.timeout.connect(self.update_preview)

        form = QFormLayout()
        form.addRow("slide", self.slide_box)
        files = QHBoxLayout()
        files.addWidget(self.load_button)
        files.addWidget(self.save_button)
        layout = scrolled(body)
        layout.addLayout(form)
        layout.addWidget(self.new_button)
        layout.addWidget(self.exclude_button)
        layout.addLayout(files)
        layout.addWidget(self.preview)
        layout.addWidget(self.status)
        layout.addStretch()

        self.viewer.layers.events.inserted.connect(self._on_layers_changed)
        self.viewer.layers.events.removed.connect(self._on_layers_changed)
        self.viewer.layers.selection.events.active.connect(self._on_active_layer)
        connect_while_alive(self.session.tiling_changed, self, self._schedule_preview)
        self._on_layers_changed()

    # -- slide choice ------------------------------------------------------------------------------
    def _on_layers_changed(self, event: Any = None) -> None:
        set_items(self.slide_box, [layer.name for layer in slide_layers(self.viewer)])
        if event is not None and getattr(event, "type", "") == "inserted":
            layer = event.value
            if layer.metadata.get("bigslide_role") in ("regions", "exclusions"):
                layer.events.data.connect(lambda _e: self._schedule_preview())

    def _on_active_layer(self, event: Any) -> None:
        layer = event.value
        if layer is not None and layer in slide_layers(self.viewer):
            self.slide_box.setCurrentText(layer.name)

    def slide_layer(self) -> Any:
        name = self.slide_box.currentText()
        return next((layer for layer in slide_layers(self.viewer) if layer.name == name), None)

    def _require_slide(self) -> Any:
        layer = self.slide_layer()
        if layer is None:
            show_error("Open a slide first (File ▸ Open, or File ▸ Open Sample ▸ bigslide).")
        return layer

    # -- regions layers ----------------------------------------------------------------------------
    def regions_layer(self, create: bool = False, role: str = "regions") -> Any:
        """The slide's layer of areas to sample from (`role` "regions") or to leave out ("exclusions")."""
        slide = self.slide_layer()
        if slide is None:
            return None
        existing = layers_with_role(self.viewer, role, slide.metadata["path"])
        if existing or not create:
            return existing[0] if existing else None
        what = "sampling regions" if role == "regions" else "areas to leave out"
        return self.viewer.add_shapes(
            None, shape_type="polygon", **regions_layer_kwargs(slide, f"{slide.name} {what}", role=role)
        )

    def new_regions_layer(self, role: str = "regions") -> Any:
        """The selected slide's regions (or exclusions) layer, created when missing, selected and in
        polygon mode."""
        if self._require_slide() is None:
            return None
        layer = self.regions_layer(create=True, role=role)
        self.viewer.layers.selection.active = layer
        layer.mode = "add_polygon"
        self.status.setText("Click to add vertices; double-click closes a polygon. Press Escape to stop.")
        return layer

    def load_geojson(self, path: str | Path | None = None) -> Any:
        from bigslide.tiling.regions import check_inside, load_regions, split_regions

        slide = self._require_slide()
        if slide is None:
            return None
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Load regions", "", OUTLINE_FILES)
            if not path:
                return None
        try:
            regions = load_regions(path)
            # regions of another slide would be kept in the table and fail the run: refused here
            check_inside(regions, tuple(slide.metadata["level_dimensions"][0]), f"{path} on {slide.name}")
        except BigslideError as err:
            show_error(str(err))
            self.status.setText(str(err))
            return None
        include, exclude = split_regions(regions)
        layer = self.regions_layer(create=bool(include) or not exclude)
        if include:
            layer.add_polygons(polygons_to_shapes([r.geometry for r in include]))
        if exclude:
            left_out = self.regions_layer(create=True, role="exclusions")
            left_out.add_polygons(polygons_to_shapes([r.geometry for r in exclude]))
            layer = layer or left_out
        self.session.update(self.slide_layer().metadata["path"], regions=Path(path).resolve())
        text = f"Loaded {len(include)} regions" + (
            f" and {len(exclude)} areas to leave out" if exclude else ""
        )
        self.status.setText(f"{text} from {Path(path).name}.")
        return layer

    def _nothing_drawn(self, slide: Any) -> str:
        """What to do when a slide has no region to save: draw in the layer already made, or make one."""
        path = str(slide.metadata["path"])
        made = [
            layer.name
            for role in ("regions", "exclusions")
            for layer in layers_with_role(self.viewer, role, path)
        ]
        if made:
            return (
                f"Nothing drawn on {slide.name} yet: outline areas in '{made[-1]}' (its polygon tool), "
                "then Save."
            )
        return (
            f"No regions drawn on {slide.name}: press 'New sampling regions' or 'New areas to leave out' and "
            "draw polygons."
        )

    def save_geojson(self, path: str | Path | None = None) -> Path | None:
        """Write the drawn regions (level-0 px, QuPath convention) and use the file in the slide table."""
        from bigslide.tiling.regions import save_regions

        left = left_by_closed_slides(self.viewer, ("regions", "exclusions"), "areas")
        slide = self.slide_layer() if left else self._require_slide()
        if slide is None:
            if left:
                show_error(left)
                self.status.setText(left)
            return None
        regions = layer_regions(self.viewer, slide.metadata["path"])
        if regions is None:
            show_error(self._nothing_drawn(slide))
            return None
        if path is None:
            suggestion = str(Path(slide.metadata["path"]).with_suffix(".regions.geojson"))
            path, _ = QFileDialog.getSaveFileName(self, "Save regions", suggestion, "GeoJSON (*.geojson)")
            if not path:
                return None
        saved = save_regions(regions, path)
        self.session.add(slide.metadata["path"], regions=saved.resolve())
        self.status.setText(f"Saved {len(regions)} regions to {saved.name}.")
        return saved

    # -- tile preview ------------------------------------------------------------------------------
    def _on_preview_toggled(self, checked: bool) -> None:
        if checked:
            self.update_preview()
        else:
            remove_layers(self.viewer, role="tiles")

    def _schedule_preview(self) -> None:
        if self.preview.isChecked():
            self._preview_timer.start()

    def update_preview(self) -> Any:
        """Compute the tiles of the selected slide in a worker and draw them; returns the worker."""
        slide = self._require_slide()
        if slide is None:
            return None
        path = slide.metadata["path"]
        try:
            regions = slide_regions(self.viewer, self.session, path)
        except BigslideError as err:
            show_error(str(err))
            return None
        s = self.session
        worker = _tile_grid(s.slides(), path, s.tile_size, s.target_mpp, s.min_tissue, regions, s.tissue)
        worker.returned.connect(self._show_tiles(slide))
        worker.errored.connect(self._preview_failed)
        self.preview_worker = worker
        self.status.setText("Finding tiles…")
        worker.start()
        return worker

    def _preview_failed(self, err: Exception) -> None:
        text = in_panel_words(f"Tile preview failed: {err}")
        self.status.setText(text)
        show_error(text)

    def _show_tiles(self, slide: Any) -> Callable[[Any], None]:
        def show(grid: Any) -> None:
            if not self.preview.isChecked() or slide not in self.viewer.layers:
                return
            previous = self.viewer.layers.selection.active
            add_tile_preview(self.viewer, slide, grid.coords, grid.tile_size_level0)
            add_rejected_tiles(self.viewer, slide, grid)
            if previous in self.viewer.layers:  # keep drawing where the user was drawing
                self.viewer.layers.selection.active = previous
            c = grid.check
            self.status.setText(
                f"{len(grid)} tiles of {grid.tile_size_level0} level-0 px will be sampled from {slide.name}; "
                f"left out: {c.ink} for ink (magenta), {c.blurred} out of focus (orange"
                + (", left out)." if c.blur_excluded else ", still sampled).")
            )
            self.session.update(slide.metadata["path"], tiles=len(grid))

        return show


@thread_worker(ignore_errors=True)
def _tile_grid(
    slides: SlideCache,
    path: str,
    tile_size: int,
    target_mpp: float,
    min_tissue: float,
    regions: Any,
    tissue: TissueSettings,
) -> Any:
    from bigslide.data.slides import tile_slide

    return slides.run(
        tile_slide,
        path,
        tile_size,
        target_mpp,
        min_tissue,
        regions,
        tissue,
        what=f"{path}: a worker died tiling it",
    )
