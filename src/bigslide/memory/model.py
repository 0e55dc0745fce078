"""Linear memory models fitted to calibration peaks: memory = fixed + Σ per_unit × units."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LinearFit:
    """`fixed + Σ slopes[name] × units[name]` bytes, fitted by least squares to measured peaks."""

    fixed: float
    slopes: Mapping[str, float]

    def __call__(self, **units: float) -> float:
        return self.fixed + sum(slope * units[name] for name, slope in self.slopes.items())

    @classmethod
    def fit(cls, points: Sequence[Mapping[str, float]], peaks: Sequence[float]) -> LinearFit:
        """Least squares over the calibration points (slopes clipped at zero: memory never shrinks
        as the input grows, so a negative slope is measurement noise)."""
        names = sorted(points[0])
        design = np.array([[1.0, *(p[n] for n in names)] for p in points])
        coef, *_ = np.linalg.lstsq(design, np.asarray(peaks, dtype=float), rcond=None)
        slopes = {n: max(float(c), 0.0) for n, c in zip(names, coef[1:])}
        fixed = float(
            np.mean([peak - sum(slopes[n] * p[n] for n in names) for p, peak in zip(points, peaks)])
        )
        return cls(fixed, slopes)

    def describe(self, unit_names: Mapping[str, str] | None = None) -> str:
        parts = [f"{self.fixed / 2**20:.1f} MiB"]
        for name, slope in self.slopes.items():
            label = (unit_names or {}).get(name, name)
            parts.append(f"{slope / 2**10:.2f} KiB/{label}")
        return " + ".join(parts)


@dataclass(frozen=True)
class StepModel:
    """Peak of one training step of a method: state + inputs + max(compute phase, update phase).

    `state`: parameters, buffers and optimizer state; `compute`: forward/backward peak above the state;
    `update`: optimizer update peak above the state (gradients and the optimizer's temporaries).
    """

    state: int
    compute: LinearFit
    update: int

    def peak(self, input_bytes: int = 0, extra: float = 0.0, **units: float) -> int:
        return int(self.state + input_bytes + max(self.compute(**units) + extra, self.update))


@dataclass(frozen=True)
class PatchGDModel:
    """PatchGD: max(inner iteration with k patches + Z-block + head, no-grad fill + Z-block)."""

    inner: StepModel  # units k (patches with grad per inner iteration)
    fill: LinearFit  # units fill (patches per no-grad encoder call)
    head: LinearFit  # units cells (head forward + backward on the grid)
    latent_dim: int

    def peak(self, *, images: int, cells: int, k: int, fill_batch: int, input_bytes: int) -> int:
        z_bytes = 4 * images * cells * self.latent_dim  # Z is kept in float32
        inner = self.inner.compute(k=images * k) + 2 * z_bytes + self.head(cells=images * cells)
        fill = self.fill(fill=fill_batch) + z_bytes
        step = max(inner, fill, self.inner.update)
        return int(self.inner.state + input_bytes + step)


@dataclass(frozen=True)
class AccModel:
    """ABMIL-ACC: max(head on the whole Z, replay of one chunk with grad while Z and dL/dZ are kept)."""

    replay: StepModel  # units chunk (tiles replayed with grad)
    head: LinearFit  # units tiles (aggregator forward + backward on Z)
    feature_dim: int

    def peak(self, *, tiles: int, chunk: int, input_bytes: int) -> int:
        z_bytes = 4 * tiles * self.feature_dim
        replay = self.replay.compute(chunk=min(chunk, tiles)) + 2 * z_bytes
        head = self.head(tiles=tiles) + z_bytes
        return int(self.replay.state + input_bytes + max(replay, head, self.replay.update))


@dataclass(frozen=True)
class BigLayerModel:
    """Big-Layer: device = state + one partition (≤ budget) + the native tail; host = big activations.

    `total` is the whole step measured with the big layers computing on the calibration device (host and
    device memory are then the same pool): it is what a CPU run needs and what the CPU check compares.
    """

    stages: int
    tail: StepModel  # units px: native layers after the big stages, forward + backward, on the device
    total: StepModel  # units px: the whole step, host + device

    def device_peak(self, *, px: int, budget_bytes: int) -> int:
        return self.tail.peak(px=px) + budget_bytes

    def total_peak(self, *, px: int, input_bytes: int) -> int:
        return self.total.peak(input_bytes=input_bytes, px=px)
