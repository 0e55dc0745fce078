"""A slide shown a second time, to the right (or left) of every slide, with another map over it: before and
after maps side by side at the same physical scale. The copy and its layers have the role "comparison", so the
panels do not list it as a slide to train on and its map is not the one the Results panel redraws."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from bigslide.napari._layers import heatmap_display, heatmap_layer_kwargs
from bigslide.napari._placement import SLIDE_GAP, WORLD_UNITS
from bigslide.napari._roles import ROLE, layers_with_role, slide_layers

if TYPE_CHECKING:
    import napari

    from bigslide.explain.heatmap import Normalisation, ScoreGrid

COMPARISON = "comparison"
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
    left: bool = False,
) -> Iterator[None]:
    """The slide again, right of every slide (`left`: left of every slide), with `grid` over it and `title`
    above it (replacing an earlier comparison of that slide): one layer per step (`in_turns`), as making
    a napari layer costs a tenth of a second or more."""
    path = slide_layer.metadata.get("path")
    yield from removal_steps(viewer, COMPARISON, path)
    width = float(np.ptp(slide_layer.extent.world[:, -1]))
    sx = float(slide_layer.scale[-1])
    if left:  # its right edge a gap left of the leftmost slide's left edge
        start = min(float(s.extent.world[0][-1]) for s in slide_layers(viewer)) - (1 + SLIDE_GAP) * width
    else:
        start = max(float(s.extent.world[1][-1]) for s in slide_layers(viewer)) + SLIDE_GAP * width
    offset = (float(slide_layer.translate[-2]), start + sx / 2)
    copy = viewer.add_image(
        slide_layer.data,
        name=f"{slide_layer.name} — {title}",
        rgb=True,
        multiscale=slide_layer.multiscale,
        scale=slide_layer.scale,
        translate=offset,
        units=WORLD_UNITS,
        contrast_limits=(0, 255),
        metadata={ROLE: COMPARISON, "slide": path, "mpp": slide_layer.metadata.get("mpp")},
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
