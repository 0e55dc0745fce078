"""Where each layer over a slide goes: the slide layer's `Placement`, kept by every overlay when the
slide's µm/px changes (the user's fallback) or the slide moves; slides opened beside each other."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from bigslide.explain.placement import Placement
from bigslide.napari._roles import OVERLAY_ROLES, ROLE, slide_layers

if TYPE_CHECKING:
    import napari

_UNIT_NAMES = {"um": "micrometer", "pixel": "pixel"}
SLIDE_GAP = 0.05
"""Gap between slides opened side by side, a fraction of the wider one's width."""


def placement_of(slide_layer: napari.layers.Image) -> Placement:
    """Where the slide layer puts its level-0 pixels: its effective µm/px and its world offset."""
    mpp = slide_layer.metadata.get("mpp")
    offset = tuple(float(v) for v in slide_layer.translate[-2:])
    return Placement((float(mpp[0]), float(mpp[1])) if mpp else None, (offset[0], offset[1]))


def set_slide_mpp(viewer: napari.Viewer, slide_layer: napari.layers.Image, fallback: float | None) -> bool:
    """Give a slide whose file states no µm/px the user's fallback (None: back to level-0 pixels).

    Its overlays follow. Returns whether anything changed; slides that state their µm/px keep it."""
    meta = slide_layer.metadata
    if meta.get("stated_mpp"):
        return False
    mpp = (float(fallback), float(fallback)) if fallback else None
    old = meta.get("mpp")
    if (tuple(old) if old else None) == mpp:
        return False
    meta["mpp"] = mpp
    placement = placement_of(slide_layer)
    slide_layer.units = placement.units
    slide_layer.scale = placement.raster()[0]
    place_overlays(viewer, slide_layer)
    return True


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
    if [str(u) for u in layer.units[-2:]] != [_UNIT_NAMES[placement.units]] * 2:
        layer.units = placement.units
    if not np.allclose(layer.scale[-2:], scale):
        layer.scale = scale
    if not np.allclose(layer.translate[-2:], translate):
        layer.translate = translate


def place_overlays(viewer: napari.Viewer, slide_layer: napari.layers.Image) -> None:
    path = slide_layer.metadata.get("path")
    for layer in viewer.layers:
        if layer.metadata.get(ROLE) in OVERLAY_ROLES and layer.metadata.get("slide") == path:
            place_layer(layer, slide_layer)


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


_FOLLOWED: weakref.WeakSet[Any] = weakref.WeakSet()


def keep_in_place(viewer: napari.Viewer) -> None:
    """From now on: a slide opened beside others is put to their right, an overlay added for a slide is
    placed on it, and moving a slide moves its overlays."""
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
            if not any(float(v) for v in layer.translate[-2:]):
                offset = beside_slides(view, layer)
                if offset is not None:
                    layer.translate = offset
            layer.events.translate.connect(lambda _e, s=layer: _follow(ref, s))
        elif role in OVERLAY_ROLES:
            slide = slide_of(view, layer)
            if slide is not None:
                place_layer(layer, slide)

    viewer.layers.events.inserted.connect(on_inserted)
    for layer in list(viewer.layers):
        if layer.metadata.get(ROLE) == "slide":
            layer.events.translate.connect(lambda _e, s=layer: _follow(ref, s))


def _follow(ref: weakref.ref[Any], slide_layer: Any) -> None:
    view = ref()
    if view is not None and slide_layer in view.layers:
        place_overlays(view, slide_layer)
