"""What a pixel of a slide may be (`GLASS`, `TISSUE`, `INK`), the settings that decide it (`TissueSettings`,
the `data.*` settings of the same names), and the measures the tissue and ink rules share: greyscale,
optical density above the glass, how much light varies across a nucleus-wide window, enclosed holes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from bigslide.wsi.tiff_tiles import LUMA

RULE_LOW = 3


RULE_HIGH = 230
"""Big-Layers rule: a pixel is tissue when its greyscale is in [RULE_LOW, RULE_HIGH] (not glass/black)."""


GLASS_OD = 0.08
"""Summed OD above the glass's below which a pixel is glass (about greyscale 238 on glass of 245)."""


GLASS_WINDOW_UM = 4.0
"""A faint pixel (absorbing at least half GLASS_OD) is glass only when its neighbourhood (a Gaussian of
this sigma, at least half a pixel) absorbs less than GLASS_OD too: in pale tissue, and along fat's thin
walls, many pixels between the stained ones absorb a little less than GLASS_OD. Bare glass (below half)
stays glass, so a tissue's edge does not spread onto it. Chosen on the tissue bench's tuning seeds and a
development set (1673010-1673039): pale tiles kept 94 -> 96-97 % and fat 74-77 -> 82-85 % on the tuning
seeds, pale 88 -> 90 % and fat 66-68 -> 74-76 % on the development set; an 8 µm window (without the
faint floor) kept 19 % of red ink on glass."""


INK_MIN_OD = 0.3
"""Summed OD from which a pixel's colour is judged (fainter ones are pale tissue or glass)."""


PEN_FLATNESS = 0.15
"""`ink_flatness`'s default: flat films on the glass are pens (chosen on the tissue bench's tuning seeds)."""


FLAT_MIN_PX = 0.7
"""The flatness window (Gaussian sigma) is at least this many pixels: on coarse levels a stroke spans few."""


UNKNOWN_PIXEL_UM = 8.0
"""µm per pixel the glass films' sizes assume on an image of unknown scale."""


TEXTURE_UM = 6.0
"""Window (Gaussian sigma, µm) colour texture is measured over: about a nucleus."""


GLASS, TISSUE, INK = 0, 1, 2
"""Pixel classes of `classify_pixels`: glass, stained tissue, and anything else on the glass (pen ink,
marker, dust, bubble rims, black)."""
FILM = 3
"""Ink that only the film rule found (`classify_pixels(..., mark_films=True)`; INK otherwise)."""


@dataclass(frozen=True)
class TissueSettings:
    """How tissue is told from glass and from what lies on the glass (`data.*` settings of the same names).

    `reject_ink` False is the Big-Layers greyscale rule alone (the ink and hole fields are then
    unused). `exclude_blurred`: tiles less sharp than `min_sharpness` are left out (`bigslide.tiling.blur`);
    they are measured either way. `exclude_classes`: regions of these classes (besides QuPath's ignored
    classes, whose names end in "*") are areas to leave out (`bigslide.tiling.regions.centres_sampled`).
    """

    reject_ink: bool = True
    ink_blue_green: float = 0.6
    ink_texture: float = 0.01
    ink_flatness: float = PEN_FLATNESS
    fill_holes_um: float = 100.0
    min_sharpness: float = 0.1
    exclude_blurred: bool = False
    exclude_classes: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TissueSettings:
        """The settings `dataclasses.asdict` wrote (lists back to tuples)."""
        known = {f.name for f in dataclasses.fields(cls)}
        kept: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in known
        }
        return cls(**kept)

    def describe(self) -> str:
        if not self.reject_ink:
            return "greyscale rule [3, 230]"
        return (
            f"stain rule (ink: blue/green OD >= {self.ink_blue_green:g} or blue-violet, with colour texture "
            f"< {self.ink_texture:g}"
            + (
                f", and flat films on the glass (light texture < {self.ink_flatness:g})"
                if self.ink_flatness
                else ""
            )
            + f"; holes < {self.fill_holes_um:g} µm filled)"
        )


GREYSCALE_RULE = TissueSettings(reject_ink=False, fill_holes_um=0.0)
"""The Big-Layers rule alone: greyscale in [3, 230] (no ink rejection, no filling)."""


def greyscale(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma (`LUMA`) as float in [0, 255], channel by channel (the weights PIL's "L" mode uses)."""
    rgb = np.asarray(rgb, dtype=np.float32)
    return rgb[..., 0] * LUMA[0] + rgb[..., 1] * LUMA[1] + rgb[..., 2] * LUMA[2]


def optical_density(rgb: np.ndarray, glass: np.ndarray | None = None) -> np.ndarray:
    """(..., 3) float32 OD of uint8 RGB, finite at 0 (intensities offset by half a level); with `glass`
    (the glass's (3,) OD), the OD above it, never below 0."""
    od = -np.log((np.asarray(rgb[..., :3], np.float32) + 0.5) / 255.5)
    if glass is not None:
        od -= np.asarray(glass, np.float32)
        np.maximum(od, 0, out=od)
    return od


def summed(od: np.ndarray) -> np.ndarray:
    """The three channels of an (..., 3) array added (a sum over the last axis is ten times slower)."""
    return od[..., 0] + od[..., 1] + od[..., 2]


def flatness_window(pixel_um: float) -> float:
    """Gaussian sigma, in pixels of `pixel_um`, that flatness and cell texture are measured over."""
    return max(FLAT_MIN_PX, TEXTURE_UM / pixel_um)


def light_texture(total: np.ndarray, sigma: float) -> np.ndarray:
    """How much the light absorbed (summed OD) varies across a Gaussian window of `sigma` pixels, as a share
    of its mean: a film of one dye (a pen stroke) varies little; tissue, nuclei beside stroma, much."""
    mean, square = gaussian_planes(np.stack([total, total * total]), sigma)
    return np.sqrt(np.maximum(square - mean * mean, 0)) / np.maximum(mean, 1e-3)


def gaussian_planes(planes: np.ndarray, sigma: float, mode: str = "nearest") -> np.ndarray:
    """Each (H, W) plane of a (K, H, W) stack smoothed by a Gaussian of `sigma` pixels truncated at 4 sigma,
    as `ndimage.gaussian_filter` smooths one plane (same weights and passes; `mode` "nearest" or
    "reflect"), to float32 rounding. Down the columns, planes of DOWN_ROWS_FROM pixels or more are filtered
    as whole shifted rows (`_down_columns`); along the rows, one `ndimage.correlate1d` call for the stack."""
    from scipy import ndimage  # here: the settings above are read by napari's panels, on its GUI thread

    radius = int(4.0 * sigma + 0.5)
    x = np.arange(-radius, radius + 1)
    weights = np.exp(-0.5 / (sigma * sigma) * x**2)
    weights = weights / weights.sum()
    planes = np.asarray(planes, np.float32)
    if planes.shape[1] * planes.shape[2] >= DOWN_ROWS_FROM:
        down = _down_columns(planes, weights, mode)
    else:  # a small area: two filter calls cost less than a wrapper's many
        down = ndimage.correlate1d(planes, weights, axis=1, mode=mode)
    return ndimage.correlate1d(down, weights, axis=2, output=down, mode=mode)


DOWN_ROWS_FROM = 128 * 128
BAND_BYTES = 1 << 17
"""`_down_columns` works in bands of rows of about this many bytes, which stay in the processor's cache
while every shifted row is added: 2-4 times faster than `ndimage.correlate1d` down the columns, which
copies each column out and back, on planes from about 128 x 128 pixels."""


def _down_columns(planes: np.ndarray, weights: np.ndarray, mode: str) -> np.ndarray:
    """A symmetric filter of odd length down each column of a (K, H, W) float32 stack, added as shifted
    rows, band by band."""
    radius, (count, height, width) = len(weights) // 2, planes.shape
    if mode not in ("nearest", "reflect"):
        raise ValueError(f"mode must be 'nearest' or 'reflect', got {mode!r}")
    pad: Literal["edge", "symmetric"] = "edge" if mode == "nearest" else "symmetric"
    taps = [np.float32(w) for w in weights]
    out = np.empty_like(planes)
    band = max(1, BAND_BYTES // (4 * width))
    for k in range(count):
        padded = np.pad(planes[k], ((radius, radius), (0, 0)), mode=pad)
        for r0 in range(0, height, band):
            n = min(band, height - r0)
            window = padded[r0 : r0 + n + 2 * radius]  # the band's rows and `radius` more either side
            rows, pair = out[k, r0 : r0 + n], np.empty((n, width), np.float32)
            np.multiply(window[radius : radius + n], taps[radius], out=rows)
            for i in range(1, radius + 1):
                np.add(window[radius + i : radius + i + n], window[radius - i : radius - i + n], out=pair)
                pair *= taps[radius + i]
                rows += pair
    return out


def enclosed(background: np.ndarray, max_area: float) -> np.ndarray:
    """Pixels of `background` components of at most `max_area` pixels that do not touch the image's
    edge (what lies beyond it is unknown): the holes of the foreground."""
    from scipy import ndimage

    labels, count = ndimage.label(background)
    if count == 0:
        return np.zeros(background.shape, bool)
    sizes = np.bincount(labels.ravel(), minlength=count + 1)
    small = sizes <= max_area
    edge = np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
    small[edge] = False
    small[0] = False
    return small[labels]
