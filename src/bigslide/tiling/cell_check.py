"""A second, finer look at tiles the film rule took for ink: cells there mean tissue.

Tissue is measured on pixels of about 8 µm (`tissue_measure`), where stroma with sparse nuclei is as flat
as a pen's film, and a flat area of it at the tissue's edge can be taken for one. On the level focus is
measured on (a tile spans about 32 pixels, `blur.sharpness_level`), cells show: nuclei beside cytoplasm
and stroma, each its own mix of the two dyes, vary in colour (`ink.colour_texture`); a film of ink varies
in amount only. A tile left out for ink the film rule found (`pixel_classes.FILM`) whose stained pixels
vary in colour as cells do is kept. Ink found by colour is not looked at again.

On the tissue bench's first 12 tuning slides (64 px tiles at 0.5 µm/px, 2 µm pixels): tiles whose
stained pixels are at least CELL_SHARE such: no ink-on-glass tile of 6,504, 43 % of 10,300 clean tissue
tiles (the rest are too pale or too smooth to tell, and stay as the coarse measure judged them). Judged
on 4 µm blocks instead, half as many of the tiles that the coarse measure wrongly took for ink were kept.
"""

from __future__ import annotations

import numpy as np

from bigslide.tiling.blur import sharpness_level
from bigslide.tiling.ink import colour_texture
from bigslide.tiling.pixel_classes import INK_MIN_OD, flatness_window, optical_density, summed
from bigslide.tiling.tissue_measure import apply_in_runs, box_means, footprints
from bigslide.wsi.slide import Slide

CELL_COLOUR_TEXTURE = 0.1
"""`colour_texture` from which a pixel varies in colour as cells do (a film of ink scores about 0)."""
CELL_SHARE = 0.8
"""Share of a tile's stained pixels (summed OD at least INK_MIN_OD) that must vary so for it to be tissue."""


def cell_shares(
    slide: Slide, coords: np.ndarray, size0: int, glass: np.ndarray, read_level: int = 0
) -> np.ndarray:
    """Per tile (`coords` level-0 top-left corners, side `size0`), the share of its stained pixels whose
    colour varies as cells make it, on `sharpness_level`; `glass`: the slide's glass OD. NaN where the
    pixels cannot be decoded."""
    if len(coords) == 0:
        return np.zeros(0, np.float64)
    level = sharpness_level(slide, size0, read_level)
    lw, lh = slide.level_dimensions[level]
    ds = slide.level_downsamples[level]
    sigma = flatness_window(slide.mpp[0] * ds) if slide.mpp is not None else flatness_window(1.0)
    boxes = footprints(coords, size0, ds, (lh, lw))

    def shares(image: np.ndarray, local: np.ndarray) -> np.ndarray:
        od = optical_density(image, glass)
        stained = summed(od) >= INK_MIN_OD
        cells = stained & (colour_texture(od, sigma) >= CELL_COLOUR_TEXTURE)
        return box_means(cells, local) / np.maximum(box_means(stained, local), 1e-9)

    return apply_in_runs(slide, level, boxes, shares)


def tiles_with_cells(
    slide: Slide, coords: np.ndarray, size0: int, glass: np.ndarray, read_level: int = 0
) -> np.ndarray:
    """Whether each tile shows cells on the finer look (`cell_shares` at least CELL_SHARE)."""
    return cell_shares(slide, coords, size0, glass, read_level) >= CELL_SHARE
