"""Whole images for PatchGD / full-image methods: a slide (or its sampling regions) rendered as one tensor."""

from __future__ import annotations

import numpy as np
import torch
from shapely import union_all
from torch.utils.data import Dataset

from bigslide.data.colour import SampleStain, SampleView
from bigslide.data.endpoint import Endpoint
from bigslide.data.processes import Pool, read_slide_squares
from bigslide.data.sample import Sample
from bigslide.data.slides import SlideCache
from bigslide.data.stain import draw_stain_jitter
from bigslide.data.stain_norm import StainFit, fit_stain
from bigslide.data.table import SlideTable
from bigslide.errors import DataError
from bigslide.tiling.pixel_classes import TissueSettings
from bigslide.tiling.regions import Region, load_regions, split_regions
from bigslide.tiling.tissue import TissueMask
from bigslide.wsi.resolution import DEFAULT_MPP, plan_read
from bigslide.wsi.slide import Slide

IMAGE_CACHE_BYTES = 1 << 30
"""Decoded images a dataset keeps for later epochs; beyond, an image is read again each epoch (a cohort of
thousands of large images would not fit in memory)."""


def mask_bounds(slide: Slide, mask: TissueMask) -> tuple[float, float, float, float]:
    """The level-0 (x0, y0, x1, y1) of the tissue in `mask` (pen ink, marker and dust are not tissue),
    else the whole slide."""
    ys, xs = np.nonzero(mask.mask)
    if len(xs):
        d = mask.downsample
        return (xs.min() * d, ys.min() * d, (xs.max() + 1) * d, (ys.max() + 1) * d)
    w, h = slide.dimensions
    return (0.0, 0.0, float(w), float(h))


def square_box(slide: Slide, bounds: tuple[float, float, float, float], side: int) -> tuple[int, int, int]:
    """A level-0 square (x, y, side) centred on `bounds`, moved inside the slide when it fits there.

    The side is set by the resolution, not by the bounds: content larger than the square is cropped
    around its centre, smaller content gets a margin (white beyond the slide's edge).
    """
    w, h = slide.dimensions
    x0, y0, x1, y1 = bounds
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    x, y = round(cx - side / 2), round(cy - side / 2)
    x = int(np.clip(x, 0, w - side)) if side <= w else x
    y = int(np.clip(y, 0, h - side)) if side <= h else y
    return x, y, side


class SlideImageDataset(Dataset[Sample]):
    """Item i = slide i (restricted to its regions' bounding square, else its tissue) as a size² image."""

    def __init__(
        self,
        table: SlideTable,
        *,
        image_size: int,
        target_mpp: float = DEFAULT_MPP,
        augment: bool = False,
        seed: int = 0,
        slides: SlideCache | None = None,
        endpoint: Endpoint | None = None,
        stain_augment: float = 0.0,
        stain_normalise: str = "none",
        tissue: TissueSettings = TissueSettings(),
    ) -> None:
        several = table.case_of_several()
        if several is not None:
            raise DataError(
                f"case {several[0]!r} has {several[1]} slides, and whole-image methods "
                "read one image per slide: train a MIL method (abmil_acc, full_bag, frozen_abmil, "
                "biglayer_mil) on cases of several slides, or drop the table's case column"
            )
        self.table = table
        self.endpoint = endpoint or Endpoint(classes=list(table.classes))
        self.image_size = image_size
        self.tissue = tissue
        self.target_mpp = target_mpp
        self.augment = augment
        self.seed = seed
        self.epoch = 0
        self.slides = slides or SlideCache()
        self.slides.state(table.entries)
        self._boxes: dict[int, tuple[int, int, int]] = {}  # level-0 (x, y, side) each image is read from
        self._images: dict[int, torch.Tensor] = {}  # up to IMAGE_CACHE_BYTES of them, kept for later epochs
        self._image_bytes = 0
        # stain_augment > 0: a stain perturbation of that strength per slide and epoch; stain_normalise:
        # each sample carries the stain fitted on its whole image (`bigslide.data.colour`)
        self.stain_augment = stain_augment
        self.stain_normalise = stain_normalise
        self._stain_fits: dict[int, StainFit] = {}

    def __len__(self) -> int:
        return len(self.table)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _render(self, i: int, pool: Pool = None) -> tuple[torch.Tensor, tuple[int, int, int]]:
        if i in self._images:
            return self._images[i], self._boxes[i]
        entry = self.table.entries[i]
        with self.slides.opened(entry.path) as slide:
            plan = plan_read(slide, self.image_size, self.target_mpp)
            if i not in self._boxes:
                include: list[Region] = []
                if entry.regions:
                    include, _ = split_regions(load_regions(entry.regions), self.tissue.exclude_classes)
                if include:  # areas to leave out only: the image is the tissue's
                    bounds = tuple(float(v) for v in union_all([r.geometry for r in include]).bounds)
                else:
                    bounds = mask_bounds(slide, self.slides.tissue_mask(entry.path, self.tissue))
                self._boxes[i] = square_box(slide, bounds, plan.size_level0)  # type: ignore[arg-type]
        box = self._boxes[i]
        image = torch.from_numpy(
            read_slide_squares(self.slides, entry.path, plan, np.array([box[:2]]), pool)[0]
        )
        if self._image_bytes + image.numel() <= IMAGE_CACHE_BYTES:
            # a copy: the cache keeps it for the run, and a worker's buffer is reused once let go
            self._images[i] = image = image.clone()
            self._image_bytes += image.numel()
        return image, box

    def __getitem__(self, i: int) -> Sample:
        return self.load(i, None)

    def load(self, i: int, pool: Pool) -> Sample:
        """Item i, decoding on `pool` (the loader's processes)."""
        t, (x, y, side) = self._render(i, pool)  # uint8: methods scale it on their device
        view = None
        if self.augment:  # turned and mirrored where the method makes it floats (`bigslide.data.colour`)
            rng = np.random.default_rng([self.seed, self.epoch, i])
            view = SampleView(int(rng.integers(4)), bool(rng.random() < 0.5))
        entry = self.table.entries[i]
        return Sample(
            x=t,
            y=self.endpoint.target(entry),
            slide=str(entry.path),
            origin=(x, y),
            downsample=side / self.image_size,
            stain=self.sample_stain(i, pool),
            view=view,
        )

    def sample_stain(self, i: int, pool: Pool = None) -> SampleStain | None:
        """Slide i's stain fit (normalisation) and this epoch's perturbation (augmentation), if asked for."""
        if self.stain_normalise == "none" and self.stain_augment <= 0:
            return None
        source = None
        if self.stain_normalise != "none":
            if i not in self._stain_fits:
                image = self._render(i, pool)[0]
                where = str(self.table.entries[i].path)
                self._stain_fits[i] = fit_stain(self.stain_normalise, image.movedim(0, -1).numpy(), where)
            source = self._stain_fits[i]
        jitter = None
        if self.stain_augment > 0:
            jitter = draw_stain_jitter(
                np.random.default_rng([self.seed, self.epoch, i, 4177]), self.stain_augment
            )
        return SampleStain(source, jitter)
