"""Stain colour in torch: colour deconvolution into hematoxylin, eosin and DAB (HED) and the random
per-slide stain perturbation used for augmentation (Tellez et al. 2018, "HED jitter").

Pixels are floats in [0, 1]. Optical density (OD) is -ln(max(x, 1e-6)) per RGB channel, scikit-image's
clamp; `rgb_to_hed` / `hed_to_rgb` give exactly scikit-image's `rgb2hed` / `hed2rgb` (whose HED units
are OD / ln(1e6)), vectorised over any leading axes and on any device.

A stain perturbation is drawn on the host per slide (`draw_stain`, from a seeded generator), turned into
two 3 x 3 matrices and a shift (`stain_jitter`) and applied to tiles on the device
(`bigslide.data.colour`): in OD space each stain's amount is scaled and shifted, its vector's hue turned
about the grey axis and the vector tilted, and a cast added per RGB channel,
OD' = OD · Hfr · diag(α) · Rfh' + β · Rfh' + cast (Hfr = scikit-image's `hed_from_rgb`, Rfh' its
`rgb_from_hed` with turned and tilted rows), then hue is rotated about the grey axis and saturation
scaled, one 3 x 3 matrix on RGB. With α = 1 and no shift, turn, tilt, cast, hue or saturation change it
is the identity (no clamp of negative concentrations, unlike `rgb2hed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from skimage.color import hed_from_rgb, rgb_from_hed

from bigslide.hue import turned_stain

OD_EPS = 1e-6  # scikit-image's clamp before the logarithm
HED_SCALE = -math.log(OD_EPS)  # scikit-image's HED unit: OD / ln(1e6)
RGB_FROM_HED = np.asarray(rgb_from_hed, np.float64)  # rows: the H, E, DAB OD vectors
HED_FROM_RGB = np.asarray(hed_from_rgb, np.float64)

# Ranges at strength 1; `data.stain_augment_strength` defaults to 0.67 of them, chosen on the stain
# benchmark's tuning labs (`bigslide.synthetic.labs.draw_lab`: dye amounts 0.5-1.6x a reference lab's,
# stain hues turned by up to 30°, casts up to 0.1 OD, JPEG; docs/benchmarks.md) among 1/3, 2/3, 1 and 4/3
# of these. At strength 1 a slide's dye
# amounts vary by a factor of up to exp(±1.05) (0.35-2.86) and shift by up to ±0.06 OD, each stain
# vector's hue turns about the grey axis by up to ±45° and tilts by ~6° (normal 0.075 per component),
# each RGB channel gets a cast of up to ±0.15 OD, the hue of the whole turns by up to ±0.045 of a turn
# (16°) and its saturation scales by up to exp(±0.225).
AMOUNT_LOG_RANGE = 1.05
SHIFT_RANGE = 0.06
STAIN_TURN_DEGREES = 45.0
TILT_SD = 0.075
CAST_RANGE = 0.15
HUE_RANGE = 0.045
SATURATION_LOG_RANGE = 0.225


def _channels_last(x: torch.Tensor, channel_axis: int) -> torch.Tensor:
    return x.movedim(channel_axis, -1)


def rgb_to_hed(rgb: torch.Tensor, channel_axis: int = -1) -> torch.Tensor:
    """scikit-image's `rgb2hed` in torch: float RGB in [0, 1] -> HED concentrations (clamped at 0)."""
    x = _channels_last(rgb.float(), channel_axis)
    od = torch.log(x.clamp(min=OD_EPS)) / math.log(OD_EPS)
    matrix = torch.as_tensor(HED_FROM_RGB, dtype=od.dtype, device=od.device)
    return (od @ matrix).clamp_(min=0).movedim(-1, channel_axis)


def hed_to_rgb(hed: torch.Tensor, channel_axis: int = -1) -> torch.Tensor:
    """scikit-image's `hed2rgb` in torch: HED concentrations -> float RGB in [0, 1]."""
    s = _channels_last(hed.float(), channel_axis)
    matrix = torch.as_tensor(RGB_FROM_HED, dtype=s.dtype, device=s.device)
    return torch.exp(-(s * HED_SCALE) @ matrix).clamp_(0, 1).movedim(-1, channel_axis)


@dataclass(frozen=True)
class StainDraw:
    """One slide's random stain change, as drawn: `amounts` (3,) scale the H, E and DAB concentrations,
    `shifts` (3,) are added to them (OD), `turns` (3,) turn each stain vector's hue about the grey axis
    (degrees), `tilts` (3, 3) are added to the stain vectors (times their lengths), `cast` (3,) is OD
    added per RGB channel, then the hue of the whole turns by `hue` radians and its saturation scales by
    `saturation`."""

    amounts: np.ndarray
    shifts: np.ndarray
    turns: np.ndarray
    tilts: np.ndarray
    cast: np.ndarray
    hue: float
    saturation: float


@dataclass(frozen=True)
class StainJitter:
    """One slide's perturbation, applied as `ln x' = ln x · log_matrix + log_shift` per pixel (row
    vectors; the same as OD' = OD · log_matrix - log_shift), then `x'' = x' · rgb_matrix`."""

    log_matrix: np.ndarray  # (3, 3)
    log_shift: np.ndarray  # (3,)
    rgb_matrix: np.ndarray  # (3, 3)


NO_JITTER = StainJitter(np.eye(3), np.zeros(3), np.eye(3))


def draw_stain(rng: np.random.Generator, strength: float = 1.0) -> StainDraw:
    """A random stain change; `strength` scales every range (0 = no change)."""
    return StainDraw(
        amounts=np.exp(rng.uniform(-AMOUNT_LOG_RANGE, AMOUNT_LOG_RANGE, 3) * strength),
        shifts=rng.uniform(-SHIFT_RANGE, SHIFT_RANGE, 3) * strength,
        turns=rng.uniform(-STAIN_TURN_DEGREES, STAIN_TURN_DEGREES, 3) * strength,
        tilts=rng.normal(0, TILT_SD, (3, 3)) * strength,
        cast=rng.uniform(-CAST_RANGE, CAST_RANGE, 3) * strength,
        hue=float(rng.uniform(-HUE_RANGE, HUE_RANGE) * strength * 2 * math.pi),
        saturation=math.exp(rng.uniform(-SATURATION_LOG_RANGE, SATURATION_LOG_RANGE) * strength),
    )


def stain_jitter(draw: StainDraw) -> StainJitter:
    """The colour maps that make `draw`'s change: OD' = OD · Hfr · diag(amounts) · V + shifts · V + cast,
    V the stain vectors turned and tilted."""
    lengths = np.linalg.norm(RGB_FROM_HED, axis=1, keepdims=True)
    turned = np.stack([turned_stain(v, t) for v, t in zip(RGB_FROM_HED, draw.turns)]) * lengths
    tilted = turned + draw.tilts * lengths
    tilted = np.abs(tilted) / np.linalg.norm(tilted, axis=1, keepdims=True) * lengths
    od_matrix = HED_FROM_RGB @ np.diag(draw.amounts) @ tilted
    log_shift = -(draw.shifts @ tilted) - draw.cast
    return StainJitter(od_matrix, log_shift, hue_saturation_matrix(draw.hue, draw.saturation))


def draw_stain_jitter(rng: np.random.Generator, strength: float = 1.0) -> StainJitter:
    """A random stain perturbation (`draw_stain`, as colour maps); `strength` scales every range."""
    return stain_jitter(draw_stain(rng, strength))


def hue_saturation_matrix(hue: float, saturation: float) -> np.ndarray:
    """(3, 3) acting on RGB row vectors: saturation scales the distance from the grey axis, hue turns
    about it by `hue` radians (Rodrigues' rotation about (1, 1, 1)/√3; grey stays grey)."""
    grey = np.full((3, 3), 1 / 3)
    saturate = saturation * np.eye(3) + (1 - saturation) * grey
    c, s = math.cos(hue), math.sin(hue)
    k = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]]) / math.sqrt(3)  # cross product with the axis
    rotate = c * np.eye(3) + s * k + (1 - c) * grey  # acts on column vectors
    return (rotate @ saturate).T
