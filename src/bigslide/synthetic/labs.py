"""How a lab stains and scans the synthetic H&E slides: the bundled labs A, B and C, and labs drawn at
random from a seed, to test stain robustness on shifts nobody tuned for.

A lab is its mean stain vectors (OD per RGB channel of a unit of hematoxylin and of eosin), its dye
strengths, a colour cast (OD added to every pixel per RGB channel: mounting medium, lamp, scanner) and
the JPEG quality its scanner writes tiles with (None: lossless). Slides of one lab vary around it
(`bigslide.synthetic.he.slide_stain`).

A drawn lab (`draw_lab`, named "drawn-<seed>"): hematoxylin and eosin amounts each scaled by a factor
log-uniform in `DRAWN_AMOUNT` (0.5-1.6x), each stain vector's hue turned about the grey axis by up to
`DRAWN_TURN_DEGREES` (`bigslide.hue.turned_stain`; lab C's hematoxylin is lab A's turned by -28°), a
cast of up to `DRAWN_CAST_OD` per RGB channel (lab C's: 0, 0.035, 0.09) and a JPEG quality in
`DRAWN_JPEG_QUALITY`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from skimage import color

from bigslide.errors import DataError
from bigslide.hue import hue_angle, turned_stain

DRAWN_PREFIX = "drawn-"
DRAWN_AMOUNT = (0.5, 1.6)
DRAWN_TURN_DEGREES = 30.0
DRAWN_CAST_OD = 0.1
DRAWN_JPEG_QUALITY = (60, 95)


@dataclass(frozen=True)
class Lab:
    """How a lab stains: its mean stain vectors (rows H, E, residual), dye strengths, colour cast and
    JPEG quality (None: tiles written losslessly)."""

    vectors: np.ndarray  # (3, 3)
    h_strength: float = 1.0
    e_strength: float = 1.0
    cast: tuple[float, float, float] = (0.0, 0.0, 0.0)
    jpeg_quality: int | None = None

    def describe(self) -> dict[str, object]:
        """Plain data: how this lab differs from lab A (amounts, hue turns in degrees, cast, JPEG)."""
        base = np.asarray(color.rgb_from_hed, np.float64)
        return {
            "h_amount": round(self.h_strength, 3),
            "e_amount": round(self.e_strength, 3),
            "h_turn": round(_turn(self.vectors[0], base[0]), 1),
            "e_turn": round(_turn(self.vectors[1], base[1]), 1),
            "cast": [round(float(c), 3) for c in self.cast],
            "jpeg_quality": self.jpeg_quality,
        }


LABS: dict[str, Lab] = {
    # skimage's HED vectors (Ruifrok and Johnston)
    "A": Lab(np.array(color.rgb_from_hed)),
    # Stronger, bluer hematoxylin (absorbs more red, less blue), paler eosin, a slight yellow cast.
    "B": Lab(
        np.array([[0.76, 0.62, 0.19], [0.10, 0.98, 0.16], color.rgb_from_hed[2]]),
        h_strength=1.4,
        e_strength=0.65,
        cast=(0.0, 0.015, 0.06),
    ),
    # A stronger shift, as between hospitals: hematoxylin x1.45 and bluer still, eosin x0.6 and a warm
    # (yellow-orange) cast from the mounting medium and lamp.
    "C": Lab(
        np.array([[0.80, 0.57, 0.18], [0.12, 0.97, 0.20], color.rgb_from_hed[2]]),
        h_strength=1.45,
        e_strength=0.6,
        cast=(0.0, 0.035, 0.09),
    ),
}


def _turn(of: np.ndarray, base: np.ndarray) -> float:
    """Degrees the hue of `of` is turned from `base`'s, in (-180, 180]."""
    return -((hue_angle(base) - hue_angle(of) + 180) % 360 - 180)


def draw_lab(seed: int) -> Lab:
    """A lab drawn from `seed` (the same seed, the same lab): amounts, hue turns, cast and JPEG quality
    from the ranges above, independently."""
    rng = np.random.default_rng([seed, 20_261_126])
    low, high = (math.log(v) for v in DRAWN_AMOUNT)
    h_amount, e_amount = np.exp(rng.uniform(low, high, 2))
    turns = rng.uniform(-DRAWN_TURN_DEGREES, DRAWN_TURN_DEGREES, 2)
    base = np.asarray(color.rgb_from_hed, np.float64)
    vectors = base.copy()
    for i in range(2):
        vectors[i] = turned_stain(base[i], turns[i])
    cast = rng.uniform(0, DRAWN_CAST_OD, 3)
    quality = int(rng.integers(DRAWN_JPEG_QUALITY[0], DRAWN_JPEG_QUALITY[1] + 1))
    return Lab(
        vectors,
        h_strength=float(h_amount),
        e_strength=float(e_amount),
        cast=(float(cast[0]), float(cast[1]), float(cast[2])),
        jpeg_quality=quality,
    )


def drawn_lab_name(seed: int) -> str:
    return f"{DRAWN_PREFIX}{seed}"


def lab_named(name: str) -> Lab:
    """A bundled lab ("A", "B", "C") or a drawn one ("drawn-<seed>")."""
    if name in LABS:
        return LABS[name]
    seed = name.removeprefix(DRAWN_PREFIX)
    if name.startswith(DRAWN_PREFIX) and seed.isdigit():
        return draw_lab(int(seed))
    raise DataError(f"lab={name!r}: must be one of {', '.join(LABS)} or {DRAWN_PREFIX}<seed>")
