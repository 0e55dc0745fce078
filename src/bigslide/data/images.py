"""Whole images for PatchGD / full-image methods: a slide (or its sampling regions) rendered as one tensor."""

from __future__ import annotations

import numpy as np
import torch
from shapely import union_all
from skimage.transform import resize
from torch.utils.data import Dataset

from bigslide.data.sample import Sample
from bigslide.data.slides import SlideCache
from bigslide.data.table import SlideTable
from bigslide.regions import load_regions
from bigslide.slide import Slide
from bigslide.tissue import tissue_mask


def square_box(
    slide: Slide, regions_bounds: tuple[float, float, float, float] | None
) -> tuple[int, int, int]:
    """A square level-0 box (x, y, side) around the regions, else around the tissue, within the slide."""
    w, h = slide.dimensions
    if regions_bounds is None:
        mask = tissue_mask(slide)
        ys, xs = np.nonzero(mask.mask)
        if len(xs):
            d = mask.downsample
            regions_bounds = (xs.min() * d, ys.min() * d, (xs.max() + 1) * d, (ys.max() + 1) * d)
        else:
            regions_bounds = (0, 0, w, h)
    x0, y0, x1, y1 = regions_bounds
    side = int(np.ceil(max(x1 - x0, y1 - y0)))
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    x = int(np.clip(round(cx - side / 2), 0, max(w - side, 0)))
    y = int(np.clip(round(cy - side / 2), 0, max(h - side, 0)))
    return x, y, side


def render_region(slide: Slide, box: tuple[int, int, int], size: int) -> np.ndarray:
    """Read the square level-0 box at the coarsest level still finer than `size` and resize to size²."""
    x, y, side = box
    level = slide.best_level_for_downsample(side / size)
    ds = slide.level_downsamples[level]
    n = max(1, round(side / ds))
    region = slide.read_region((x, y), level, (n, n))
    if n == size:
        return region
    out = resize(region, (size, size), order=1, anti_aliasing=n > size, preserve_range=True)
    return np.round(out).astype(np.uint8)


class SlideImageDataset(Dataset[Sample]):
    """Item i = slide i (restricted to its regions' bounding square, else its tissue) as a size² image."""

    def __init__(
        self,
        table: SlideTable,
        *,
        image_size: int,
        augment: bool = False,
        seed: int = 0,
        slides: SlideCache | None = None,
    ) -> None:
        self.table = table
        self.image_size = image_size
        self.augment = augment
        self.seed = seed
        self.epoch = 0
        self.slides = slides or SlideCache()
        self._cache: dict[int, tuple[torch.Tensor, tuple[int, int, int]]] = {}

    def __len__(self) -> int:
        return len(self.table)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _render(self, i: int) -> tuple[torch.Tensor, tuple[int, int, int]]:
        if i not in self._cache:
            entry = self.table.entries[i]
            slide = self.slides.open(entry.path)
            bounds = None
            if entry.regions:
                geometry = union_all([r.geometry for r in load_regions(entry.regions)])
                bounds = tuple(float(v) for v in geometry.bounds)
            box = square_box(slide, bounds)  # type: ignore[arg-type]
            image = render_region(slide, box, self.image_size)
            self._cache[i] = (torch.from_numpy(image).permute(2, 0, 1).contiguous(), box)
        return self._cache[i]

    def __getitem__(self, i: int) -> Sample:
        image, (x, y, side) = self._render(i)
        t = image.float().div(255.0)
        if self.augment:
            rng = np.random.default_rng([self.seed, self.epoch, i])
            t = torch.rot90(t, int(rng.integers(4)), dims=(-2, -1))
            if rng.random() < 0.5:
                t = torch.flip(t, dims=(-1,))
        entry = self.table.entries[i]
        return Sample(
            x=t,
            y=self.table.encode(entry.label),
            slide=str(entry.path),
            origin=(x, y),
            downsample=side / self.image_size,
        )
