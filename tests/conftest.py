"""Shared session fixtures: small pyramidal slides written once per test session."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bigslide.synthetic.pyramid import Flavour, downsample_pyramid, write_pyramid

SUFFIX = {"svs": ".svs", "tiff": ".tif", "ome": ".ome.tif"}


@dataclass(frozen=True)
class WrittenSlide:
    """A slide written by a fixture together with the exact pixels of each level."""

    path: Path
    levels: list[np.ndarray]
    mpp: float | None


MakeSlide = Callable[..., WrittenSlide]


def textured_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Deterministic RGB noise: every pixel differs, so an off-by-one read cannot pass a test."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="session")
def make_slide(tmp_path_factory: pytest.TempPathFactory) -> MakeSlide:
    """Factory: write `image` as a pyramid of `n_levels` (factor 2) and return a WrittenSlide."""
    folder = tmp_path_factory.mktemp("slides")
    counter = iter(range(1_000_000))

    def make(
        image: np.ndarray,
        *,
        flavour: Flavour = "svs",
        n_levels: int = 3,
        mpp: float | None = 0.5,
        tile: int = 256,
        name: str | None = None,
    ) -> WrittenSlide:
        levels = downsample_pyramid(image, n_levels)
        path = folder / f"{name or f'slide{next(counter)}'}{SUFFIX[flavour]}"
        write_pyramid(path, levels, mpp=mpp, tile=tile, flavour=flavour)
        return WrittenSlide(path, levels, mpp)

    return make


@pytest.fixture(scope="session")
def slide_image() -> np.ndarray:
    """Level 0 of the shared test slides: 1000 x 1300 px, not a multiple of the tile size."""
    return textured_image(1000, 1300)


@pytest.fixture(scope="session")
def svs_slide(make_slide: MakeSlide, slide_image: np.ndarray) -> WrittenSlide:
    return make_slide(slide_image, flavour="svs", mpp=0.5, name="shared")


@pytest.fixture(scope="session")
def tiff_slide(make_slide: MakeSlide, slide_image: np.ndarray) -> WrittenSlide:
    return make_slide(slide_image, flavour="tiff", mpp=0.25, name="shared")


@pytest.fixture(scope="session")
def ome_slide(make_slide: MakeSlide, slide_image: np.ndarray) -> WrittenSlide:
    return make_slide(slide_image, flavour="ome", mpp=0.25, name="shared")
