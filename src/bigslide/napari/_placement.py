"""Where each layer over a slide goes: the slide layer's `Placement`, kept by every overlay when the
slide's µm/px changes (the user's fallback, or its slide table row's) or the slide moves; slides side by
side at their physical size.

Every layer is in µm, so napari never mixes units (it then stops using them for every layer). A slide
whose file states no µm/px and that has no fallback yet is drawn at `PROVISIONAL_MPP` and marked as
waiting for one (a notification, and its row in the Slides panel); once one is given it takes its
physical size and the slides to its right move to keep their gap.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bigslide.explain.placement import Placement
from bigslide.napari._roles import OVERLAY_ROLES, ROLE, slide_layers

if TYPE_CHECKING:
    import napari

WORLD_UNITS = "um"
PROVISIONAL_MPP = 1.0
"""µm per level-0 pixel a slide without one is drawn at until it is given one (a round, visibly
provisional size: scanners give 0.1-1 µm/px)."""
SLIDE_GAP = 0.05
"""Gap between slides opened side by side, a fraction of the wider one's width."""
SHOWN_FILL = 0.95
"""Share of the canvas an area shown (`show_area`) fills along its tighter side."""
Span = tuple[float, float, float, float]  # (top, bottom, left, right) in the world


def placement_of(slide_layer: napari.layers.Image) -> Placement:
    """Where the slide layer puts its level-0 pixels: its effective µm/px (provisional when it has none)
    and its world offset."""
    mpp = slide_layer.metadata.get("mpp") or (PROVISIONAL_MPP, PROVISIONAL_MPP)
    offset = tuple(float(v) for v in slide_layer.translate[-2:])
    return Placement((float(mpp[0]), float(mpp[1])), (offset[0], offset[1]))


def waits_for_mpp(slide_layer: Any) -> bool:
    """The slide's file states no µm/px and none was given: it is drawn at `PROVISIONAL_MPP`."""
    return not slide_layer.metadata.get("mpp")


def set_slide_mpp(viewer: napari.Viewer, slide_layer: napari.layers.Image, fallback: float | None) -> bool:
    """Give a slide whose file states no µm/px the user's fallback (None: back to provisional).

    Its overlays follow, and the slides to its right move by its change of width. Returns whether anything
    changed; slides that state their µm/px keep it."""
    meta = slide_layer.metadata
    if meta.get("stated_mpp"):
        return False
    mpp = (float(fallback), float(fallback)) if fallback else None
    old = meta.get("mpp")
    if (tuple(old) if old else None) == mpp:
        return False
    before = span(slide_layer)
    _apply_mpp(viewer, slide_layer, mpp)
    _shift_right_of(viewer, slide_layer, before)
    if mpp is not None:
        from bigslide.napari._toasts import withdraw

        withdraw(_mpp_missing_start(slide_layer))  # its warning asked for this
    return True


def _apply_mpp(viewer: napari.Viewer, slide_layer: Any, mpp: tuple[float, float] | None) -> None:
    slide_layer.metadata["mpp"] = mpp
    slide_layer.scale = placement_of(slide_layer).raster()[0]
    place_overlays(viewer, slide_layer)


def place_layer(layer: Any, slide_layer: napari.layers.Image) -> None:
    """Put one overlay where its slide says: rasters cell by cell, shapes vertex by vertex."""
    placement = placement_of(slide_layer)
    if layer.metadata.get("shapes", False):
        scale, translate = placement.vertices()
    else:
        cell = float(layer.metadata.get("cell_size_level0", 1.0))
        origin = tuple(layer.metadata.get("origin", (0.0, 0.0)))
        scale, translate = placement.raster(cell, (float(origin[0]), float(origin[1])))
    # each setter refreshes the layer: set only what changed (a followed run redraws every epoch)
    if [str(u) for u in layer.units[-2:]] != ["micrometer"] * 2:
        layer.units = WORLD_UNITS
    if not np.allclose(layer.scale[-2:], scale):
        layer.scale = scale
    if not np.allclose(layer.translate[-2:], translate):
        layer.translate = translate


def place_overlays(viewer: napari.Viewer, slide_layer: napari.layers.Image) -> None:
    path = slide_layer.metadata.get("path")
    for layer in viewer.layers:
        if layer.metadata.get(ROLE) in OVERLAY_ROLES and layer.metadata.get("slide") == path:
            place_layer(layer, slide_layer)


def under_its_overlays(viewer: napari.Viewer, slide_layer: napari.layers.Image) -> None:
    """A slide opened again while overlays of its file stayed (its maps, outlines, the tile preview, left
    when it was closed): they are placed on it where it now lies, and it goes under the lowest of them,
    which it would otherwise cover (a map drawn into such a layer, following a run, was hidden)."""
    path = slide_layer.metadata.get("path")
    below = [
        i
        for i, layer in enumerate(viewer.layers)
        if layer.metadata.get(ROLE) in OVERLAY_ROLES and layer.metadata.get("slide") == path
    ]
    if not below:
        return
    place_overlays(viewer, slide_layer)
    at = viewer.layers.index(slide_layer)
    if min(below) < at:
        viewer.layers.move(at, min(below))


def slide_of(viewer: napari.Viewer, layer: Any) -> Any:
    """The slide layer an overlay belongs to, or None."""
    path = layer.metadata.get("slide")
    return next((s for s in slide_layers(viewer) if s.metadata.get("path") == path), None)


def beside_slides(viewer: napari.Viewer, slide_layer: napari.layers.Image) -> tuple[float, float] | None:
    """World offset to the right of the other slides (none there: None), so slides never hide each other."""
    others = [
        s for s in slide_layers(viewer) if s.name != slide_layer.name
    ]  # names: plugins see proxies, not layers
    if not others:
        return None
    right = max(float(s.extent.world[1][-1]) for s in others)
    top = min(float(s.extent.world[0][-2]) for s in others)
    width = max(float(np.ptp(s.extent.world[:, -1])) for s in [*others, slide_layer])
    sy, sx = placement_of(slide_layer).pixel_scale
    return (top + sy / 2, right + SLIDE_GAP * width + sx / 2)


def show_area(viewer: napari.Viewer, low: Any, high: Any, fill: float = SHOWN_FILL) -> None:
    """Centre the canvas on the world rectangle from `low` to `high` ((y, x) corners) and zoom until it
    fills `fill` of the canvas along its tighter side."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    height, width = viewer.canvas.size
    camera = viewer.scene.camera
    camera.center = tuple((low + high) / 2)
    camera.zoom = fill * min(height / max(high[0] - low[0], 1e-9), width / max(high[1] - low[1], 1e-9))


def span(layer: Any) -> Span:
    """(top, bottom, left, right) of a layer in the world."""
    extent = layer.extent.world
    return float(extent[0][-2]), float(extent[1][-2]), float(extent[0][-1]), float(extent[1][-1])


def slides_in_rows(viewer: napari.Viewer, rows: Span, but: Any) -> list[Any]:
    """The slides other than `but` that share rows with the world span `rows`."""
    top, bottom = rows[0], rows[1]
    return [s for s in slide_layers(viewer) if s is not but and span(s)[0] < bottom and span(s)[1] > top]


def move_x(layers: list[Any], dx: float) -> None:
    """Move `layers` by `dx` world units along x."""
    for layer in layers:
        layer.translate = (*layer.translate[:-1], float(layer.translate[-1]) + dx)


def _shift_right_of(viewer: napari.Viewer, slide_layer: Any, before: Span) -> None:
    """After a slide's size changed, move the slides that stood to its right (beside it) by the change of
    its right edge, so they keep their gap: neither overlapping it nor left far away."""
    right = before[3]
    delta = span(slide_layer)[3] - right
    if abs(delta) < 1e-9:
        return
    move_x([s for s in slides_in_rows(viewer, before, slide_layer) if span(s)[2] >= right - 1e-6], delta)


_FOLLOWED: weakref.WeakSet[Any] = weakref.WeakSet()
_FALLBACKS: weakref.WeakKeyDictionary[Any, float | None] = weakref.WeakKeyDictionary()
_ROW_MPPS: weakref.WeakKeyDictionary[Any, dict[Path, float]] = weakref.WeakKeyDictionary()


def set_fallback_mpp(viewer: napari.Viewer, fallback: float | None) -> None:
    """The µm/px given for slides whose files state none: applied to the open ones and to those opened
    from now on (a slide whose table row gives its own keeps that)."""
    keep_in_place(viewer)
    _FALLBACKS[viewer] = fallback
    for layer in slide_layers(viewer):
        set_slide_mpp(viewer, layer, _given_mpp(viewer, layer))


def set_row_mpps(viewer: napari.Viewer, given: dict[Path, float]) -> None:
    """The Slides table rows' own µm/px (a table's `mpp`, or typed in the row) for slides whose files state
    none, by resolved path: applied as `set_fallback_mpp`, before the fallback."""
    keep_in_place(viewer)
    if _ROW_MPPS.get(viewer) == given:
        return
    _ROW_MPPS[viewer] = dict(given)
    for layer in slide_layers(viewer):
        set_slide_mpp(viewer, layer, _given_mpp(viewer, layer))


def _given_mpp(viewer: Any, slide_layer: Any) -> float | None:
    """The µm/px given for a slide whose file states none: its table row's, else the fallback."""
    path = slide_layer.metadata.get("path")
    row = _ROW_MPPS.get(viewer, {}).get(Path(path).resolve()) if path else None
    return row if row is not None else _FALLBACKS.get(viewer)


def keep_current_viewer_in_place() -> None:
    """`keep_in_place` for the viewer a reader or sample is opened into (slides go beside the others, in
    µm, even before any panel is open)."""
    from napari import current_viewer

    viewer = current_viewer()
    if viewer is not None:
        keep_in_place(viewer)


def keep_in_place(viewer: napari.Viewer) -> None:
    """From now on: a slide opened beside others is put to their right (a slide that states no µm/px gets
    the fallback given, else waits at the provisional size), an overlay added for a slide is placed on
    it, and moving a slide moves its overlays."""
    if viewer in _FOLLOWED:
        return
    _FOLLOWED.add(viewer)
    ref = weakref.ref(viewer)

    def on_inserted(event: Any) -> None:
        view = ref()
        layer = event.value
        if view is None:
            return
        role = layer.metadata.get(ROLE)
        if role == "slide":
            fallback = _given_mpp(view, layer)
            if fallback and not layer.metadata.get("stated_mpp"):
                _apply_mpp(view, layer, (float(fallback), float(fallback)))  # placed below, beside the others
            if waits_for_mpp(layer):
                _tell_mpp_missing(layer)
            if not any(float(v) for v in layer.translate[-2:]):
                offset = beside_slides(view, layer)
                if offset is not None:
                    layer.translate = offset
            layer.events.translate.connect(lambda _e, s=layer: _follow(ref, s))
            under_its_overlays(view, layer)
        elif role in OVERLAY_ROLES:
            slide = slide_of(view, layer)
            if slide is not None:
                place_layer(layer, slide)

    viewer.layers.events.inserted.connect(on_inserted)
    from bigslide.napari._foreign_slides import watch

    watch(viewer)
    for layer in list(viewer.layers):
        if layer.metadata.get(ROLE) == "slide":
            layer.events.translate.connect(lambda _e, s=layer: _follow(ref, s))


def _tell_mpp_missing(slide_layer: Any) -> None:
    from bigslide.napari._toasts import show_warning

    show_warning(
        f"{_mpp_missing_start(slide_layer)}, so it is drawn at {PROVISIONAL_MPP:g} µm/px "
        "for now; enter its scanner's µm/px in the Slides panel ('slide µm/px if unstated') to see it "
        "at its physical size beside the other slides."
    )


def _mpp_missing_start(slide_layer: Any) -> str:
    return f"{slide_layer.name}: the file states no pixel size"


def _follow(ref: weakref.ref[Any], slide_layer: Any) -> None:
    view = ref()
    if view is not None and slide_layer in view.layers:
        place_overlays(view, slide_layer)
