"""Reading at a physical resolution (µm per pixel) instead of a pyramid level.

Scanners differ (0.25 vs 0.5 µm/px), so a model sees tissue at a fixed µm/px: a tile of `size` pixels at
`target_mpp` covers `size · target_mpp / slide_mpp` level-0 pixels. It is read from the coarsest level
that is at least as fine as the target and resized with antialiasing; a level within `TOLERANCE` of the
target is read as is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from bigslide.errors import ConfigError, SlideError

if TYPE_CHECKING:
    from bigslide.wsi.slide import Slide

TOLERANCE = 0.1
"""A level whose mpp is within 10 % of the target is used without resampling."""
DEFAULT_MPP = 0.5
"""20x: the resolution most pathology models are trained at."""
SQUARE_TOLERANCE = 0.01
"""Pixel sides stated within this share of each other are read as square (scanners round their
calibration)."""
TABLE_AGREEMENT = 0.05
"""A slide table's µm/px for a file that states its own must be within this share of the file's."""


def mpp_at_odds(stated: float, table: float) -> bool:
    """Whether a slide table's µm/px disagrees with the one its file states (beyond TABLE_AGREEMENT)."""
    return abs(stated / table - 1) > TABLE_AGREEMENT


def magnification_to_mpp(magnification: float) -> float:
    """Objective magnification to µm/px by the usual convention (20x = 0.5, 40x = 0.25)."""
    if not (math.isfinite(magnification) and magnification > 0):
        raise ConfigError(f"data.magnification must be a positive number, got {magnification}")
    return 10.0 / magnification


@dataclass(frozen=True)
class ReadPlan:
    """How a square of `size` px at the target resolution is read from one slide.

    `size_level0` is its side in level-0 pixels (the grid's `tile_size_level0`); `read_size` the side
    read at `level`, resized to `size` when the two differ.
    """

    size: int
    level: int
    downsample: float
    size_level0: int
    read_size: int
    target_mpp: float | None

    @property
    def resamples(self) -> bool:
        return self.read_size != self.size


def slide_mpp(slide: Slide) -> float:
    """The slide's level-0 µm/px; a slide whose file states none is an error naming it."""
    if slide.mpp is None:
        raise SlideError(
            f"{slide.path}: the file states no pixel size (mpp), so it cannot be read at a physical "
            "resolution; give its level-0 µm per pixel with data.slide_mpp (--slide-mpp)"
        )
    x, y = (float(v) for v in slide.mpp)
    if abs(x / y - 1) > SQUARE_TOLERANCE:  # tiles of x's size would cover another height than width
        raise SlideError(
            f"{slide.path}: the file states pixels of {x:g} x {y:g} µm, not square; tiles are read in "
            "square pixels: resample the slide to square pixels first"
        )
    return x


def coarser_scan(scanned: float | None, read: float | None) -> str | None:
    """Words for a slide scanned coarser than the model reads it (a 10x scan for a 20x model: its tiles are
    enlarged and hold less detail than those the model learnt from), else None."""
    if scanned is None or read is None or scanned <= read * (1 + TOLERANCE):
        return None
    return (
        f"scanned at {scanned:.3g} µm/px, coarser than the {read:.3g} µm/px the model reads: its tiles are "
        f"enlarged {scanned / read:.1f} times and show less detail than the model learnt from (a "
        "lower-magnification scan; predictions on it are less reliable)"
    )


def check_mpp(value: float | None, name: str) -> None:
    """A pixel size is a positive, finite number of µm (None: not given); else a `ConfigError` naming it."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a positive number of µm per pixel, got {value}")


def plan_read(slide: Slide, size: int, target_mpp: float) -> ReadPlan:
    """Where and how to read `size` px at `target_mpp` µm/px from `slide`."""
    check_mpp(target_mpp, "data.target_mpp")
    base = slide_mpp(slide)
    level_mpps = [base * ds for ds in slide.level_downsamples]
    close = [lv for lv, m in enumerate(level_mpps) if abs(m / target_mpp - 1) <= TOLERANCE]
    if close:  # read as stored: the pyramid already has this resolution
        level = min(close, key=lambda lv: abs(level_mpps[lv] / target_mpp - 1))
        ds = slide.level_downsamples[level]
        return ReadPlan(size, level, ds, max(1, round(size * ds)), size, target_mpp)
    finer = [lv for lv, m in enumerate(level_mpps) if m <= target_mpp]
    level = max(finer) if finer else 0  # no level fine enough: upsample level 0
    ds = slide.level_downsamples[level]
    size0 = max(1, round(size * target_mpp / base))
    return ReadPlan(size, level, ds, size0, max(1, round(size0 / ds)), target_mpp)


def plan_level(slide: Slide, size: int, level: int) -> ReadPlan:
    """`size` px read at pyramid `level` as stored (for slides read without a physical resolution)."""
    if not 0 <= level < slide.level_count:
        raise SlideError(f"{slide.path}: level {level} does not exist (slide has {slide.level_count})")
    ds = slide.level_downsamples[level]
    return ReadPlan(size, level, ds, max(1, round(size * ds)), size, None)


def resize_square(image: np.ndarray, size: int) -> np.ndarray:
    """Resize (h, w, 3) uint8 to size x size with an antialiasing Lanczos filter (PIL releases the GIL)."""
    if image.shape[0] == size and image.shape[1] == size:
        return image
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.LANCZOS))
