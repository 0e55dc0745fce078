"""Stain normalisation: fit a slide's stain (Macenko or Reinhard) and map it onto a reference's.

Both maps are affine in a logarithmic colour space, so the device applies either as one 3 x 3 matrix and
a shift per slide (`bigslide.data.colour`):
- Macenko et al. 2009: the slide's two stain OD vectors from the plane of its tissue pixels' OD (1st and
  99th percentile angles) and its 99th-percentile stain amounts; a pixel's amounts are read with the
  slide's vectors, rescaled to the reference's 99th percentiles and rendered with the reference's vectors
  (OD' = OD · pinv(V_s)ᵀ · diag(c_r / c_s) · V_rᵀ). Light the stain plane does not explain is dropped.
- Reinhard et al. 2001: the mean and standard deviation of each lαβ channel (a rotation of ln LMS) of
  the tissue pixels matched to the reference's.
A slide's source fit comes from tissue tiles spread over the whole slide (`fit_slide_stain`), once per
slide, so every tile and bag of a slide is mapped the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bigslide.errors import ConfigError, DataError
from bigslide.tiling.pixel_classes import TissueSettings

NormaliseMethod = Literal["macenko", "reinhard"]
NORMALISE_METHODS: tuple[str, ...] = ("macenko", "reinhard")
LOG_EPS = 1e-6
TISSUE_OD = 0.15  # Macenko's β: pixels with less OD in any channel are glass, not stain
ANGLE_PERCENTILE = 1.0  # Macenko's α
AMOUNT_PERCENTILE = 99.0
MIN_TISSUE_PIXELS = 100
MAX_FIT_PIXELS = 200_000
FIT_TILES = 32  # tiles a slide's stain is fitted on, spread over its tissue

# Reinhard's RGB -> LMS and ln LMS -> lαβ (rows act on column vectors).
RGB_TO_LMS = np.array([[0.3811, 0.5783, 0.0402], [0.1967, 0.7244, 0.0782], [0.0241, 0.1288, 0.8444]])
LMS_TO_LAB = np.diag([1 / np.sqrt(3), 1 / np.sqrt(6), 1 / np.sqrt(2)]) @ np.array(
    [[1, 1, 1], [1, 1, -2], [1, -1, 0]], dtype=np.float64
)


@dataclass(frozen=True)
class StainFit:
    """A slide's stain. macenko: `vectors` (3, 2) unit OD columns (hematoxylin, eosin), `amounts` (2,)
    their 99th percentiles; reinhard: `mean`, `sd` (3,) of lαβ."""

    method: NormaliseMethod
    values: dict[str, np.ndarray]

    def state(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {
            "method": self.method,
            **{k: np.asarray(v, np.float64).tolist() for k, v in self.values.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> StainFit:
        method = state.get("method")
        keys = ("vectors", "amounts") if method == "macenko" else ("mean", "sd")
        if method not in NORMALISE_METHODS or any(k not in state for k in keys):
            raise DataError(f"stain reference: not a stain fit: {sorted(state)}")
        return cls(method, {k: np.asarray(state[k], np.float64) for k in keys})


@dataclass(frozen=True)
class LogAffine:
    """A colour map `y = mix⁻¹ · exp(ln(mix · x) · matrix + shift)` on RGB row vectors (mix None: the
    identity, so ln x = -OD)."""

    matrix: np.ndarray  # (3, 3)
    shift: np.ndarray  # (3,)
    mix: np.ndarray | None = None  # (3, 3) acting on column vectors


def tissue_pixels(pixels: np.ndarray) -> np.ndarray:
    """(M, 3) uint8 or [0, 1] float RGB -> the stained ones as float in [0, 1] (no channel is glass)."""
    x = np.asarray(pixels).reshape(-1, 3)
    x = x.astype(np.float64) / 255 if x.dtype == np.uint8 else x.astype(np.float64)
    od = -np.log(np.maximum(x, LOG_EPS))
    return x[(od > TISSUE_OD).any(axis=1)]


def fit_stain(method: str, pixels: np.ndarray, where: str = "pixels") -> StainFit:
    """The stain of RGB `pixels` ((..., 3), uint8 or float in [0, 1]), glass left out."""
    x = tissue_pixels(pixels)
    if len(x) > MAX_FIT_PIXELS:  # an even spread of them: the fit's statistics need no more
        x = x[:: -(-len(x) // MAX_FIT_PIXELS)]
    if len(x) < MIN_TISSUE_PIXELS:
        raise DataError(f"{where}: too little stained tissue to fit its stain ({len(x)} pixels)")
    if method == "macenko":
        return _fit_macenko(x)
    if method == "reinhard":
        lab = np.log(np.maximum(x @ RGB_TO_LMS.T, LOG_EPS)) @ LMS_TO_LAB.T
        return StainFit("reinhard", {"mean": lab.mean(axis=0), "sd": lab.std(axis=0) + 1e-6})
    raise ConfigError(f"data.stain_normalise: {method!r} is not one of {list(NORMALISE_METHODS)}")


def _fit_macenko(x: np.ndarray) -> StainFit:
    od = -np.log(np.maximum(x, LOG_EPS))  # `x` holds tissue pixels only (`tissue_pixels`)
    _, vectors = np.linalg.eigh(np.cov(od.T))
    plane = vectors[:, 1:3]  # the two largest eigenvalues
    plane = plane * np.sign(plane.sum(axis=0, keepdims=True) + 1e-12)  # point into positive OD
    projected = od @ plane
    phi = np.arctan2(projected[:, 1], projected[:, 0])
    lo, hi = np.percentile(phi, [ANGLE_PERCENTILE, 100 - ANGLE_PERCENTILE])
    v1 = plane @ np.array([np.cos(lo), np.sin(lo)])
    v2 = plane @ np.array([np.cos(hi), np.sin(hi)])
    # hematoxylin absorbs more red than eosin
    stains = np.stack([v1, v2] if v1[0] > v2[0] else [v2, v1], axis=1)
    stains = np.abs(stains) / np.linalg.norm(stains, axis=0, keepdims=True)
    amounts = np.linalg.lstsq(stains, od.T, rcond=None)[0]
    return StainFit(
        "macenko", {"vectors": stains, "amounts": np.percentile(amounts, AMOUNT_PERCENTILE, axis=1)}
    )


def normalising_map(source: StainFit, reference: StainFit) -> LogAffine:
    """The colour map taking a slide of stain `source` to the `reference`'s stain."""
    if source.method != reference.method:
        raise DataError(f"stain fits of different methods: {source.method} and {reference.method}")
    if reference.method == "macenko":
        vs, vr = source.values["vectors"], reference.values["vectors"]
        scale = reference.values["amounts"] / np.maximum(source.values["amounts"], 1e-6)
        return LogAffine(np.linalg.pinv(vs).T @ np.diag(scale) @ vr.T, np.zeros(3))
    k = reference.values["sd"] / source.values["sd"]
    to_lab, from_lab = LMS_TO_LAB.T, np.linalg.inv(LMS_TO_LAB).T
    shift = (reference.values["mean"] - source.values["mean"] * k) @ from_lab
    return LogAffine(to_lab @ np.diag(k) @ from_lab, shift, RGB_TO_LMS)


def fit_slide_stain(
    method: str,
    path: str | Path,
    *,
    tile_size: int,
    target_mpp: float,
    min_tissue: float = 0.6,
    tissue: TissueSettings | None = None,
    slides: Any = None,
) -> StainFit:
    """The stain of the slide at `path`, from up to `FIT_TILES` tissue tiles spread over it, read at
    the run's resolution (what the model sees); `tissue`: the run's `TissueSettings` (None: the defaults)."""
    from bigslide.data.processes import read_slide_squares
    from bigslide.data.slides import SlideCache
    from bigslide.data.table import SlideEntry

    path = Path(path)
    cache = slides if slides is not None else SlideCache()
    try:
        grid = cache.grid(SlideEntry(path, ""), tile_size, target_mpp, min_tissue, tissue or TissueSettings())
        if len(grid) == 0:
            raise DataError(f"{path}: no tissue tile to fit the stain on")
        pick = np.unique(np.linspace(0, len(grid) - 1, min(FIT_TILES, len(grid))).round().astype(int))
        squares = read_slide_squares(cache, path, grid.plan, grid.coords[pick])
    finally:
        if slides is None:
            cache.close()
    return fit_stain(method, np.moveaxis(squares, 1, -1), where=str(path))


# The bundled reference: the stain of the demo's synthetic lab-A H&E (skimage's HED vectors), fitted on
# 32 tissue tiles (64 px at 0.5 µm/px) of each of its first 8 slides, pooled.
BUNDLED_REFERENCES: dict[str, StainFit] = {
    "macenko": StainFit(
        "macenko",
        {
            "vectors": np.array([[0.6333, 0.115], [0.732, 0.9861], [0.251, 0.1199]]),
            "amounts": np.array([2.1447, 0.4594]),
        },
    ),
    "reinhard": StainFit(
        "reinhard",
        {"mean": np.array([-0.4108, -0.1284, 0.0207]), "sd": np.array([0.3756, 0.1183, 0.0099])},
    ),
}


def stain_reference(
    method: str,
    reference: str | None,
    *,
    tile_size: int,
    target_mpp: float,
    min_tissue: float = 0.6,
    tissue: TissueSettings | None = None,
) -> StainFit | None:
    """The stain a run normalises to: None for method "none", the bundled reference without a
    `reference` slide, else that slide's fit (`data.stain_reference`)."""
    if method == "none":
        return None
    if method not in NORMALISE_METHODS:
        raise ConfigError(f"data.stain_normalise: {method!r} is not one of {['none', *NORMALISE_METHODS]}")
    if not reference:
        return BUNDLED_REFERENCES[method]
    path = Path(reference).expanduser()
    if not path.is_file():
        raise ConfigError(f"data.stain_reference: {reference}: no such slide file")
    try:
        return fit_slide_stain(
            method, path, tile_size=tile_size, target_mpp=target_mpp, min_tissue=min_tissue, tissue=tissue
        )
    except DataError as err:
        raise ConfigError(f"data.stain_reference: {err}") from None
