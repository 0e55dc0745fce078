"""Telling our layers apart: each carries its role (and the slide it belongs to) in its metadata."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import napari

ROLE = "bigslide_role"
"""Metadata key telling our layers apart: "slide", "regions", "exclusions" (areas to leave out),
"lesions", "tiles", "heatmap", "annotations" (teaching annotations), "suggestion" (the place the queue
asks about) or "comparison" (a slide and map shown beside it, for comparing)."""
OVERLAY_ROLES = ("regions", "exclusions", "lesions", "tiles", "heatmap", "annotations", "suggestion")


def slide_layers(viewer: napari.Viewer) -> list[napari.layers.Image]:
    return [layer for layer in viewer.layers if layer.metadata.get(ROLE) == "slide"]


def layers_with_role(viewer: napari.Viewer, role: str, slide: str | None = None) -> list[Any]:
    return [
        layer
        for layer in viewer.layers
        if layer.metadata.get(ROLE) == role and (slide is None or layer.metadata.get("slide") == slide)
    ]


def remove_layers(viewer: napari.Viewer, *, role: str, slide: str | None = None) -> None:
    for layer in layers_with_role(viewer, role, slide):
        viewer.layers.remove(layer)


def find_layer(viewer: napari.Viewer, name: str) -> Any:
    return next((layer for layer in viewer.layers if layer.name == name), None)


def left_by_closed_slides(viewer: napari.Viewer, roles: tuple[str, ...], what: str) -> str | None:
    """Why Save found nothing to save when outlines of `roles` (`what` they are) wait over a slide that was
    closed: where they are and what to do; None when none do."""
    open_paths = {layer.metadata.get("path") for layer in slide_layers(viewer)}
    left = [
        layer
        for role in roles
        for layer in layers_with_role(viewer, role)
        if len(layer.data) and layer.metadata.get("slide") not in open_paths
    ]
    if not left:
        return None
    layers = ", ".join(repr(layer.name) for layer in left)
    slides = ", ".join(sorted({Path(str(layer.metadata.get("slide"))).name for layer in left}))
    return (
        f"Nothing saved: the {what} in {layers} belong to {slides}, which is closed. Open it again and "
        "choose it above, then press Save."
    )
