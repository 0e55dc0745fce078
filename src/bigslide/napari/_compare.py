"""A slide shown a second time, just left of itself, with another map over it: before and after maps side
by side at the same physical scale. The copy and its layers have the role "comparison", so the panels do
not list it as a slide to train on and its map is not the one the Results panel redraws."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bigslide.napari._layers import heatmap_display, heatmap_layer_kwargs
from bigslide.napari._placement import (
    SLIDE_GAP,
    WORLD_UNITS,
    move_x,
    show_area,
    slide_of,
    slides_in_rows,
    span,
)
from bigslide.napari._roles import ROLE, layers_with_role

if TYPE_CHECKING:
    import napari

    from bigslide.explain.heatmap import Normalisation, ScoreGrid

COMPARISON = "comparison"
ROOM = "room"
"""A comparison copy's metadata: how far the slides on its left were moved to make room for it."""
STEP_PAUSE_MS = 30
CAPTION_PX = 40
"""Height of a caption's letters as drawn into its picture."""
CAPTION_EDGE = 2
CAPTION_HEIGHT = 0.06
"""A caption's height as a share of the width of the layer it captions."""
CAPTION_GAP = 0.25
"""Space between a caption and the layer below it, as a share of the caption's height."""


def beside_steps(
    viewer: napari.Viewer,
    slide_layer: Any,
    grid: ScoreGrid,
    title: str,
    *,
    normalisation: Normalisation = "rank",
    colormap: str = "inferno",
) -> Iterator[None]:
    """The slide again, just left of it (`make_room_left_of` moves the slides on its left), with `grid`
    over it and `title` above it (replacing an earlier comparison of that slide): one layer per step
    (`in_turns`), as making a napari layer costs a tenth of a second or more."""
    path = slide_layer.metadata.get("path")
    room = sum(float(layer.metadata.get(ROOM, 0.0)) for layer in layers_with_role(viewer, COMPARISON, path))
    yield from removal_steps(viewer, COMPARISON, path)
    width = float(np.ptp(slide_layer.extent.world[:, -1]))
    gap = SLIDE_GAP * width
    made = make_room_left_of(viewer, slide_layer, width + gap, gap)
    if made:
        yield  # the slides moved (and their overlays with them): a step of its own
    if slide_layer not in viewer.layers:
        return  # the slide was closed meanwhile
    offset = (float(slide_layer.translate[-2]), float(slide_layer.translate[-1]) - width - gap)
    copy = viewer.add_image(
        slide_layer.data,
        name=f"{slide_layer.name} — {title}",
        rgb=True,
        multiscale=slide_layer.multiscale,
        scale=slide_layer.scale,
        translate=offset,
        units=WORLD_UNITS,
        contrast_limits=(0, 255),
        metadata={ROLE: COMPARISON, "slide": path, "mpp": slide_layer.metadata.get("mpp"), ROOM: room + made},
    )
    yield
    if copy not in viewer.layers:
        return  # the comparison was closed meanwhile
    kwargs = heatmap_layer_kwargs(
        grid, copy, name=f"{slide_layer.name} attention — {title}", normalisation=normalisation
    )
    kwargs["metadata"][ROLE] = COMPARISON
    kwargs["metadata"]["slide"] = path
    heat = viewer.add_image(heatmap_display(grid, normalisation), **kwargs)
    if not grid.is_rgb:
        heat.colormap = colormap
    yield
    if copy in viewer.layers:
        caption(viewer, copy, title, path)


def make_room_left_of(viewer: napari.Viewer, slide_layer: Any, room: float, gap: float) -> float:
    """Clear `room` (world units) just left of `slide_layer`: the slides left of it in its rows are moved
    left by as much as they reach into it, keeping `gap` (their overlays follow them, and their comparison
    layers are moved with them), so a before/after pair stands side by side however many slides are open.
    How far they moved (0: nothing did)."""
    start = float(slide_layer.extent.world[0][-1]) - room
    moved = _left_of(viewer, slide_layer)
    reach = max((float(layer.extent.world[1][-1]) + gap - start for layer in moved), default=0.0)
    if reach <= 0:
        return 0.0
    move_x(moved, -reach)
    return reach


def give_back_room_steps(viewer: napari.Viewer) -> Iterator[None]:
    """The slides moved left to make room for comparisons moved back (`make_room_left_of`), one
    comparison per step, before the comparisons are removed."""
    for copy in [layer for layer in layers_with_role(viewer, COMPARISON) if layer.metadata.get(ROOM)]:
        slide = slide_of(viewer, copy)
        if slide is not None:
            move_x(_left_of(viewer, slide), float(copy.metadata[ROOM]))
            copy.metadata[ROOM] = 0.0
            yield


def _left_of(viewer: napari.Viewer, slide_layer: Any) -> list[Any]:
    """The slides left of `slide_layer` in its rows, and their comparison layers."""
    rows = span(slide_layer)
    slides = [s for s in slides_in_rows(viewer, rows, slide_layer) if span(s)[2] < rows[2]]
    paths = {s.metadata.get("path") for s in slides}
    return slides + [c for c in layers_with_role(viewer, COMPARISON) if c.metadata.get("slide") in paths]


def frame(viewer: napari.Viewer, layers: Sequence[Any]) -> None:
    """Centre the canvas on `layers` and zoom until together they fill it."""
    extents = np.array([layer.extent.world[:, -2:] for layer in layers], dtype=np.float64)
    show_area(viewer, extents[:, 0].min(axis=0), extents[:, 1].max(axis=0))


def removal_steps(viewer: napari.Viewer, role: str, slide: str | None = None) -> Iterator[None]:
    """The layers of `role` (of `slide`) removed one per step (`in_turns`): removing a napari layer costs
    40-60 ms on two cores, and a comparison's four at once froze the viewer 200 ms."""
    for layer in layers_with_role(viewer, role, slide):
        if layer in viewer.layers:  # a person may have deleted it meanwhile
            viewer.layers.remove(layer)
            yield


def in_turns(steps: Iterator[None], pause_ms: int = STEP_PAUSE_MS) -> None:
    """Run `steps` one per event-loop turn, `pause_ms` apart (the viewer draws between them): no freeze
    lasts longer than the longest step."""
    from qtpy.QtCore import QTimer

    def next_step() -> None:
        try:
            next(steps)
        except StopIteration:
            return
        QTimer.singleShot(pause_ms, next_step)

    QTimer.singleShot(0, next_step)


def caption(viewer: napari.Viewer, layer: Any, text: str, slide: str | None, name: str | None = None) -> Any:
    """A line of text just above the top left corner of `layer` (replacing the caption of that name), drawn
    into a small RGBA picture laid out in the layer's world units, so it scales with the slide beneath it.

    A picture layer is drawn by the shader the slides' layers already use; a napari text layer (a point
    with text) froze the viewer 170-430 ms as it was made (software OpenGL, two cores), the longest freeze
    of a retrain."""
    name = name or f"{layer.name} caption"
    old = next((c for c in viewer.layers if c.name == name), None)
    if old is not None:
        viewer.layers.remove(old)
    picture = text_picture(text)
    extent = layer.extent.world
    scale = CAPTION_HEIGHT * float(np.ptp(extent[:, -1])) / picture.shape[0]
    # above the layer, where the canvas is dark: white text over white glass would not read (it is edged
    # in black for a light canvas)
    top = float(extent[0][-2]) - (1 + CAPTION_GAP) * picture.shape[0] * scale
    return viewer.add_image(
        picture,
        name=name,
        rgb=True,
        scale=(scale, scale),
        translate=(top, float(extent[0][-1])),
        units=WORLD_UNITS,
        contrast_limits=(0, 255),
        interpolation2d="linear",  # letters shown smaller than drawn stay smooth
        metadata={ROLE: COMPARISON, "slide": slide},
    )


def text_picture(text: str) -> np.ndarray:
    """`text` in white letters edged in black on a transparent ground, CAPTION_PX high: (h, w, 4) uint8."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=CAPTION_PX)
    left, top, right, bottom = (int(v) for v in font.getbbox(text, stroke_width=CAPTION_EDGE))
    picture = Image.new("RGBA", (right - left, bottom - top), (0, 0, 0, 0))
    ImageDraw.Draw(picture).text(
        (-left, -top), text, font=font, fill="white", stroke_width=CAPTION_EDGE, stroke_fill="black"
    )
    return np.asarray(picture)
