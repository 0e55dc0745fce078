"""The Results panel's exports of its shown heatmap: an overlay PNG, the score grid, QuPath tiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from qtpy.QtWidgets import QFileDialog, QWidget

from bigslide.napari._toasts import show_error, show_info


class HeatmapExports:
    """Export methods of the Results panel (a QWidget; PyQt takes one Qt base per class, so this one is
    plain), which gives `heatmap_layer()`, `_normalisation()` and its `colormap` box: each asks for a file
    when given no path."""

    colormap: Any

    def heatmap_layer(self) -> Any: ...

    def _normalisation(self) -> Any: ...

    def _export_target(self, path: str | Path | None, suffix: str, title: str) -> tuple[Any, Path] | None:
        layer = self.heatmap_layer()
        if layer is None:
            show_error("No heatmap yet: run a checkpoint on a slide first.")
            return None
        if path is None:
            default = (
                Path(layer.metadata.get("slide") or "heatmap").with_suffix("").name + f"_{layer.name}{suffix}"
            )
            path, _ = QFileDialog.getSaveFileName(
                cast(QWidget, self), title, default.replace(" ", "_"), f"*{suffix}"
            )
            if not path:
                return None
        return layer, Path(path)

    def export_png(self, path: str | Path | None = None) -> Path | None:
        from bigslide.errors import BigslideError
        from bigslide.explain.export import overlay_png
        from bigslide.wsi.slide import open_slide

        target = self._export_target(path, ".png", "Save overlay")
        if target is None:
            return None
        layer, out = target
        try:
            with open_slide(layer.metadata["slide"]) as slide:
                saved = overlay_png(
                    layer.metadata["grid"],
                    slide,
                    out,
                    normalisation=self._normalisation(),
                    cmap=self.colormap.currentText(),
                    alpha=max(layer.opacity, 0.05),
                )
        except BigslideError as err:
            show_error(str(err))
            return None
        show_info(f"Saved {saved}")
        return saved

    def export_npz(self, path: str | Path | None = None) -> Path | None:
        target = self._export_target(path, ".npz", "Save score grid")
        if target is None:
            return None
        saved: Path = target[0].metadata["grid"].save_npz(target[1])
        show_info(f"Saved {saved}")
        return saved

    def export_geojson(self, path: str | Path | None = None) -> Path | None:
        from bigslide.explain.export import grid_geojson

        target = self._export_target(path, ".geojson", "Save QuPath tiles")
        if target is None:
            return None
        saved = grid_geojson(target[0].metadata["grid"], target[1])
        show_info(f"Saved {saved}")
        return saved
