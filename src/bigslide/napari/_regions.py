"""Sampling regions of a slide, wherever they live: a regions Shapes layer or a GeoJSON file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bigslide.napari._layers import shapes_to_polygons
from bigslide.napari._roles import layers_with_role

if TYPE_CHECKING:
    import napari

    from bigslide.napari._session import Session
    from bigslide.tiling.regions import Region


def layer_regions(viewer: napari.Viewer, slide_path: str | Path) -> list[Region] | None:
    """Polygons drawn in the slide's regions layer(s) (areas to sample from) and exclusions layer(s)
    (areas to leave out, classified as QuPath's "Ignore*"), or None when none is drawn."""
    from bigslide.tiling.regions import EXCLUDE_CLASS, Region

    found = []
    for role, name in (("regions", "sampling region"), ("exclusions", EXCLUDE_CLASS)):
        layers = layers_with_role(viewer, role, str(Path(slide_path)))
        found += [Region(p, name) for layer in layers for p in shapes_to_polygons(layer)]
    return found or None


def slide_regions(viewer: napari.Viewer, session: Session, slide_path: str | Path) -> list[Region] | None:
    """What restricts sampling for a slide: drawn regions first, else the table's regions file, else None."""
    from bigslide.tiling.regions import load_regions

    drawn = layer_regions(viewer, slide_path)
    if drawn is not None:
        return drawn
    row = session.row(slide_path)
    if row is not None and row.regions is not None:
        return load_regions(row.regions)
    return None


def write_run_regions(viewer: napari.Viewer, session: Session, folder: Path) -> None:
    """Save drawn regions as GeoJSON in `folder` and point the table rows at them (the run's record)."""
    from bigslide.tiling.regions import save_regions

    for row in session.rows:
        drawn = layer_regions(viewer, row.path)
        if drawn is None:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        path = save_regions(drawn, folder / f"{row.path.name}.regions.geojson")
        row.regions = path
    session.changed.emit()
