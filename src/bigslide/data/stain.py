"""Stain colour in torch: colour deconvolution into hematoxylin, eosin and DAB (HED) and the random
per-slide stain perturbation used for augmentation (Tellez et al. 2018, "HED jitter").

Pixels are floats in [0, 1]. Optical density (OD) is -ln(max(x, 1e-6)) per RGB channel, scikit-image's
clamp; `rgb_to_hed` / `hed_to_rgb` give exactly scikit-image's `rgb2hed` / `hed2rgb` (whose HED units
are OD / ln(1e6)), vectorised over any leading axes and on any device.

A stain perturbation is drawn on the host per slide (`draw_stain_jitter`, from a seeded generator) as
two 3 x 3 matrices and a shift, and applied to tiles on the device (`bigslide.data.colour`): in OD space
each stain's amount is scaled and shifted and its vector tilted, OD' = OD · Hfr · diag(α) · Rfh' + β · Rfh'
(Hfr = scikit-image's `hed_from_rgb`, Rfh' its `rgb_from_hed` with tilted rows), then hue is rotated
about the grey axis and saturation scaled, one 3 x 3 matrix on RGB. With α = 1, β = 0 and no tilt,
hue or saturation change it is the identity (no clamp of negative concentrations, unlike `rgb2hed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from skimage.color import hed_from_rgb, rgb_from_hed

OD_EPS = 1e-6  # scikit-image's clamp before the logarithm
HED_SCALE = -math.log(OD_EPS)  # scikit-image's HED unit: OD / ln(1e6)
RGB_FROM_HED = np.asarray(rgb_from_hed, np.float64)  # rows: the H, E, DAB OD vectors
HED_FROM_RGB = np.asarray(hed_from_rgb, np.float64)

# Ranges at strength 1: a slide's dye amounts vary by a factor of up to exp(±0.35) (0.70-1.42) and shift
# by up to ±0.04 OD, its stain vectors tilt by ~4° (normal 0.05 per component), its hue turns by up to
# ±0.03 of a turn (11°) and its saturation scales by up to exp(±0.15).
AMOUNT_LOG_RANGE = 0.35
SHIFT_RANGE = 0.04
TILT_SD = 0.05
HUE_RANGE = 0.03
SATURATION_LOG_RANGE = 0.15


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
class StainJitter:
    """One slide's stain perturbation, applied as `ln x' = ln x · log_matrix + log_shift` per pixel
    (row vectors; the same as OD' = OD · log_matrix - log_shift), then `x'' = x' · rgb_matrix`."""

    log_matrix: np.ndarray  # (3, 3)
    log_shift: np.ndarray  # (3,)
    rgb_matrix: np.ndarray  # (3, 3)


NO_JITTER = StainJitter(np.eye(3), np.zeros(3), np.eye(3))


def draw_stain_jitter(rng: np.random.Generator, strength: float = 1.0) -> StainJitter:
    """A random stain perturbation; `strength` scales every range (0 = the identity)."""
    alpha = np.exp(rng.uniform(-AMOUNT_LOG_RANGE, AMOUNT_LOG_RANGE, 3) * strength)
    beta = rng.uniform(-SHIFT_RANGE, SHIFT_RANGE, 3) * strength
    lengths = np.linalg.norm(RGB_FROM_HED, axis=1, keepdims=True)
    tilted = RGB_FROM_HED + rng.normal(0, TILT_SD, (3, 3)) * lengths * strength
    tilted = np.abs(tilted) / np.linalg.norm(tilted, axis=1, keepdims=True) * lengths
    od_matrix = HED_FROM_RGB @ np.diag(alpha) @ tilted
    hue = rng.uniform(-HUE_RANGE, HUE_RANGE) * strength * 2 * math.pi
    saturation = math.exp(rng.uniform(-SATURATION_LOG_RANGE, SATURATION_LOG_RANGE) * strength)
    return StainJitter(od_matrix, -(beta @ tilted), hue_saturation_matrix(hue, saturation))


def hue_saturation_matrix(hue: float, saturation: float) -> np.ndarray:
    """(3, 3) acting on RGB row vectors: saturation scales the distance from the grey axis, hue turns
    about it by `hue` radians (Rodrigues' rotation about (1, 1, 1)/√3; grey stays grey)."""
    grey = np.full((3, 3), 1 / 3)
    saturate = saturation * np.eye(3) + (1 - saturation) * grey
    c, s = math.cos(hue), math.sin(hue)
    k = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]]) / math.sqrt(3)  # cross product with the axis
    rotate = c * np.eye(3) + s * k + (1 - c) * grey  # acts on column vectors
    return (rotate @ saturate).T
