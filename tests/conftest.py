"""Shared session fixtures: small pyramidal slides written once per test session."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tifffile

from bigslide.synthetic.pyramid import Flavour, downsample_pyramid, write_pyramid


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist every worker process shares the machine's cores with the others: torch's default
    of an intra-op thread per core in each makes their spinning threads take turns (tests/test_engine.py and
    tests/test_resume_modes.py on two workers and two cores: 212 s, against 93 s with a thread each)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


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


def textured_tissue(shape: tuple[int, int], seed: int = 1) -> np.ndarray:
    """uint8 RGB of pink tissue with purple nuclei 8 px across (light varies across a nucleus-wide
    window, as tissue's does: a flat pink would be a film a pen could leave, and a grey one dust)."""
    rng = np.random.default_rng(seed)
    h, w = shape
    nuclei = np.kron(rng.random((-(-h // 8), -(-w // 8))) < 0.2, np.ones((8, 8), bool))[:h, :w]
    image = np.where(nuclei[..., None], np.array([110, 60, 140]), np.array([200, 120, 180]))
    return np.clip(image + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def broken_tile_slide(path: Path) -> Path:
    """A JPEG SVS of tissue on glass whose level-0 file tile (row 1, col 1) holds bytes no decoder reads."""
    image = np.full((512, 768, 3), 240, np.uint8)
    image[32:480, 32:736] = textured_tissue((448, 704))
    write_pyramid(path, downsample_pyramid(image, 3), compression="jpeg")
    with tifffile.TiffFile(path) as tif:
        offset = tif.pages[0].dataoffsets[4]  # level 0, file tile row 1, col 1
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(bytes(64))
    return path
