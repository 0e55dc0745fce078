"""UltraMNIST-like canvases (PatchGD paper, appendix A.2): the label is the sum of 3-5 digits.

Digits come from scikit-learn's bundled 8x8 digits, upsampled smoothly to sizes from 1/16 to 1/2 of
the canvas side (`scale`), so small digits need full resolution and large ones need a global view. The
target sum is drawn first (uniform over 0..9) and the digits are a uniform composition of it, so classes
are balanced. Task "digit" (not in the paper; learnable from a few hundred canvases on a CPU) draws 3-5
glyphs of one digit, the label, so reading any one small digit suffices. Every canvas is made from
(seed, split, index) alone, so large sets cost no memory. Train and val draw digit images from disjoint
halves of the digit pool. The dataset over them is `bigslide.data.ultramnist.UltraMNIST`; with
`canvas=c` it draws at side c and shrinks to `size`, as the paper shrinks its canvases for low-resolution
GD.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
from skimage import transform

from bigslide.errors import DataError

Split = Literal["train", "val"]
Task = Literal["sum", "digit"]
PAPER_SCALE = (1 / 16, 1 / 2)  # digit side as a fraction of the canvas side (smallest, largest)
NUM_CLASSES = 10
_SPLIT_CODE = {"train": 0, "val": 1}
_MAX_OVERLAP = 0.1  # at most this fraction of the smaller digit's box may be covered by another


@dataclass(frozen=True)
class UltraMNISTCanvas:
    """One canvas with its ground truth: digits and their boxes (x0, y0, side) in canvas pixels."""

    image: np.ndarray  # (size, size) float32 in [0, 1]
    label: int
    digits: tuple[int, ...]
    boxes: tuple[tuple[int, int, int], ...]


@lru_cache(maxsize=1)
def _digit_pool() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # here: sklearn takes a second to import

    bunch = load_digits()
    return (bunch.images / 16.0).astype(np.float32), bunch.target.astype(np.int64)


def _pool_for(split: Split, digit: int) -> np.ndarray:
    """Indices of the images of `digit` reserved for `split` (every other one, so splits never share)."""
    _, targets = _digit_pool()
    idx = np.flatnonzero(targets == digit)
    return idx[_SPLIT_CODE[split] :: 2]


def _rng(seed: int, split: Split, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, _SPLIT_CODE[split], index])


def _draw_digits(rng: np.random.Generator, task: Task = "sum") -> tuple[int, ...]:
    """Task "sum": a uniform random composition of a uniform target sum into 3-5 non-negative digits.
    Task "digit": 3-5 copies of one uniform digit."""
    total = int(rng.integers(NUM_CLASSES))
    count = int(rng.integers(3, 6))
    if task == "digit":
        return (total,) * count
    # Stars and bars: choose count-1 bar positions among total+count-1 slots.
    bars = np.sort(rng.choice(total + count - 1, size=count - 1, replace=False))
    edges = np.concatenate([[-1], bars, [total + count - 1]])
    return tuple(int(d) for d in np.diff(edges) - 1)


def check_ultramnist(
    split: str, size: int, task: str = "sum", scale: tuple[float, float] = PAPER_SCALE
) -> None:
    if split not in _SPLIT_CODE:
        raise DataError(f"split={split!r}: must be 'train' or 'val'")
    if task not in ("sum", "digit"):
        raise DataError(f"task={task!r}: must be 'sum' or 'digit'")
    if not 0 < scale[0] <= scale[1] <= 1:
        raise DataError(f"scale={scale}: need 0 < smallest <= largest <= 1 (fractions of the canvas side)")
    if size < 64:
        raise DataError(f"size={size}: UltraMNIST canvases need at least 64 pixels")


def ultramnist_label(index: int, *, seed: int = 0, split: Split = "train", task: Task = "sum") -> int:
    """The label of canvas `index` without rendering it."""
    return _label(_draw_digits(_rng(seed, split, index), task), task)


def _label(digits: tuple[int, ...], task: Task) -> int:
    return digits[0] if task == "digit" else sum(digits)


def render_canvas(
    index: int,
    *,
    size: int = 512,
    seed: int = 0,
    split: Split = "train",
    task: Task = "sum",
    scale: tuple[float, float] = PAPER_SCALE,
) -> UltraMNISTCanvas:
    """Render canvas `index` deterministically: black background, white digits, label by `task`."""
    check_ultramnist(split, size, task, scale)
    rng = _rng(seed, split, index)
    digits = _draw_digits(rng, task)
    images, _ = _digit_pool()
    smallest, largest = size * scale[0], size * scale[1]
    # Log-uniform sides, placed largest first so the small ones fill the gaps.
    sides = sorted(
        (float(np.exp(rng.uniform(np.log(smallest), np.log(largest)))) for _ in digits), reverse=True
    )
    canvas = np.zeros((size, size), np.float32)
    boxes: list[tuple[int, int, int]] = []
    for digit, side in zip(digits, sides):
        box = _place(round(side), boxes, size, rng)
        pool = _pool_for(split, digit)
        glyph = images[pool[rng.integers(len(pool))]]
        x0, y0, s = box
        big = transform.resize(glyph, (s, s), order=1, mode="edge", anti_aliasing=False)
        np.maximum(canvas[y0 : y0 + s, x0 : x0 + s], big, out=canvas[y0 : y0 + s, x0 : x0 + s])
        boxes.append(box)
    return UltraMNISTCanvas(image=canvas, label=_label(digits, task), digits=digits, boxes=tuple(boxes))


def _place(
    side: int, boxes: list[tuple[int, int, int]], size: int, rng: np.random.Generator
) -> tuple[int, int, int]:
    """A random box of `side` that overlaps no placed box by more than _MAX_OVERLAP; shrink if crowded."""
    side = max(8, side)
    for attempt in range(400):
        if attempt and attempt % 50 == 0:
            side = max(8, int(side * 0.8))
        x0, y0 = (int(v) for v in rng.integers(0, size - side + 1, size=2))
        if all(_overlap((x0, y0, side), b) <= _MAX_OVERLAP for b in boxes):
            return x0, y0, side
    return x0, y0, side


def _overlap(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """Intersection area over the smaller box's area."""
    w = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
    h = min(a[1] + a[2], b[1] + b[2]) - max(a[1], b[1])
    return max(0, w) * max(0, h) / min(a[2], b[2]) ** 2


def make_ultramnist(
    n: int, *, size: int = 512, seed: int = 0, split: Split = "train"
) -> tuple[np.ndarray, np.ndarray]:
    """`n` canvases as RGB uint8 (n, size, size, 3) and their labels (n,) int64."""
    check_ultramnist(split, size)
    images = np.empty((n, size, size, 3), np.uint8)
    labels = np.empty(n, np.int64)
    for i in range(n):
        canvas = render_canvas(i, size=size, seed=seed, split=split)
        images[i] = np.round(canvas.image * 255).astype(np.uint8)[..., None]
        labels[i] = canvas.label
    return images, labels
