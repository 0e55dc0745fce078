"""Per-sample pixel maps applied where pixels become floats on the method's device.

A dataset attaches to each sample what is known per slide (`SampleStain`: its fitted stain for
normalisation, its random stain perturbation for augmentation) and its augmentation view (`SampleView`:
turns, mirror and tone, drawn per sample and epoch); the method, which holds the run's stain reference,
turns a batch's samples into a `RowColour`: one map per row of the batch's pixel tensor (a tile of a
bag, or an image). Methods that move pixels chunk by chunk slice it like the pixels
(`colour[start:stop]`), so a bag is transformed one chunk at a time on the device, never whole, and the
host only ever holds the pixels as read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from bigslide.data.stain import NO_JITTER, StainJitter
from bigslide.data.stain_norm import LOG_EPS, LogAffine, StainFit, fit_stain, normalising_map
from bigslide.data.transfer import send


class _Part(Protocol):
    """What `row_colour` reads of a `bigslide.data.sample.SlidePart`: the bag's tiles from one slide."""

    @property
    def tiles(self) -> np.ndarray: ...


class _Stained(Protocol):
    """What `row_colour` reads of a `bigslide.data.sample.Sample` (which holds a `SampleStain`)."""

    x: torch.Tensor
    coords: np.ndarray | None
    slide: str
    stain: SampleStain | None
    view: SampleView | None

    @property
    def parts(self) -> Sequence[_Part]: ...


@dataclass(frozen=True)
class SampleStain:
    """What a sample's slide needs for its colour map: its stain (normalisation) and its perturbation
    (augmentation: one draw per slide and epoch, the same for all its tiles). A case's bag over several
    slides gives each slide's stain in `parts`, in the order of the sample's `parts`: each slide is
    normalised from its own stain, as it would be alone."""

    source: StainFit | None = None
    jitter: StainJitter | None = None
    parts: tuple[StainFit, ...] = ()


@dataclass(frozen=True)
class SampleView:
    """A sample's augmentation, the same for all its tiles (Big-Layers §4.2.6: a bag stays one coherent
    view of its slide): `turns` quarter turns and a left-right `mirror` of every tile, and a tone change
    `x · contrast + shift` of its pixels in [0, 1], clamped."""

    turns: int = 0
    mirror: bool = False
    contrast: float = 1.0
    shift: float = 0.0


@dataclass(frozen=True)
class _Views:
    orient: torch.Tensor  # (B,) turns * 2 + mirror, per sample
    tone: torch.Tensor  # (B, 2) contrast, shift


@dataclass(frozen=True)
class _LogStage:
    matrix: torch.Tensor  # (B, 3, 3) per sample
    shift: torch.Tensor  # (B, 3)
    mix: torch.Tensor | None  # (3, 3), shared
    unmix: torch.Tensor | None


class RowColour:
    """Maps of the rows of a batch's pixels: the augmentation view's turn and mirror (`oriented`), then
    (`__call__`) its tone, normalisation, the stain perturbation, hue and saturation; every part
    optional. `index[r]` is row r's sample; `units[r]` its stain unit, the row of the stages' maps (the
    sample, or its slide where a case's bag spans several; None: the sample)."""

    def __init__(
        self,
        index: torch.Tensor,
        stages: list[_LogStage],
        rgb: torch.Tensor | None,
        random: bool,
        views: _Views | None = None,
        units: torch.Tensor | None = None,
    ) -> None:
        self.index = index
        self.units = index if units is None else units
        self.stages = stages
        self.rgb = rgb
        self.random = random  # holds a random stain perturbation (features of these pixels are not reusable)
        self.views = views

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def __getitem__(self, rows: slice | torch.Tensor) -> RowColour:
        units = None if self.units is self.index else self.units[rows]
        return RowColour(self.index[rows], self.stages, self.rgb, self.random, self.views, units)

    def oriented(self, x: torch.Tensor) -> torch.Tensor:
        """(R, 3, H, W) or (3, H, W) pixels, one per row, each turned and mirrored as its sample's view
        says (before they become floats: uint8 moves a quarter of the bytes)."""
        if self.views is None:
            return x
        rows = _oriented(x.unsqueeze(0) if x.ndim == 3 else x, self.views.orient.index_select(0, self.index))
        return rows[0] if x.ndim == 3 else rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(R, 3, H, W) or (3, H, W) float pixels in [0, 1], one per row, `oriented` already -> mapped
        (tone, stain normalisation and perturbation, hue and saturation), clamped to [0, 1]."""
        single = x.ndim == 3
        rows = x.unsqueeze(0) if single else x
        if rows.shape[0] != len(self):
            raise ValueError(f"colour map of {len(self)} rows applied to {rows.shape[0]} rows")
        n, c, h, w = rows.shape
        flat = rows.reshape(n, c, h * w).float()
        index = send(self.index, flat.device)
        units = index if self.units is self.index else send(self.units, flat.device)
        if self.views is not None:
            tone = _rows(self.views.tone, index).unsqueeze(-1)
            flat = torch.addcmul(tone[:, 1:], flat, tone[:, :1]).clamp_(0, 1)
        for stage in self.stages:
            flat = _log_affine(flat, stage, units)
        if self.rgb is not None:
            flat = torch.bmm(_rows(self.rgb, index).transpose(1, 2), flat)
        out = flat.clamp_(0, 1).reshape(n, c, h, w)
        return out[0] if single else out


def _oriented(rows: torch.Tensor, orient: torch.Tensor) -> torch.Tensor:
    """Each row turned and mirrored as `orient` (host, per row) says; rows sharing one are moved together."""
    kinds = orient.unique().tolist()
    if kinds == [0]:
        return rows

    def turn(t: torch.Tensor, kind: int) -> torch.Tensor:
        t = torch.rot90(t, kind // 2, dims=(-2, -1)) if kind // 2 else t
        return torch.flip(t, dims=(-1,)) if kind % 2 else t

    if len(kinds) == 1:
        return turn(rows, kinds[0])
    out = torch.empty_like(rows)
    for kind in kinds:
        where = send((orient == kind).nonzero().squeeze(1), rows.device)
        out.index_copy_(0, where, turn(rows.index_select(0, where), kind))
    return out


def _rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return send(values, index.device).index_select(0, index)


def _log_affine(flat: torch.Tensor, stage: _LogStage, index: torch.Tensor) -> torch.Tensor:
    """(R, 3, P) pixels through `exp(ln(mix x) · matrix + shift)`, unmixed (matrices act on row
    vectors, so on column pixels as their transposes)."""
    if stage.mix is not None:
        flat = torch.matmul(send(stage.mix, flat.device).to(flat.dtype), flat)
    logs = flat.clamp(min=LOG_EPS).log_()
    logs = torch.bmm(_rows(stage.matrix, index).transpose(1, 2), logs)
    logs += _rows(stage.shift, index).unsqueeze(-1)
    out = logs.exp_()
    if stage.unmix is not None:
        out = torch.matmul(send(stage.unmix, out.device).to(out.dtype), out)
    return out


def _stage(maps: Sequence[LogAffine]) -> _LogStage:
    mix = maps[0].mix
    return _LogStage(
        torch.as_tensor(np.stack([m.matrix for m in maps]), dtype=torch.float32),
        torch.as_tensor(np.stack([m.shift for m in maps]), dtype=torch.float32),
        None if mix is None else torch.as_tensor(mix, dtype=torch.float32),
        None if mix is None else torch.as_tensor(np.linalg.inv(mix), dtype=torch.float32),
    )


def row_colour(samples: Sequence[_Stained], reference: StainFit | None) -> RowColour | None:
    """The colour maps of a batch of `samples` (bags: their tiles in order; images: one row each);
    None when no sample needs one (the pixels pass untouched)."""
    stains = [s.stain for s in samples]
    jitters = [st.jitter if st is not None else None for st in stains]
    augment = any(j is not None for j in jitters)
    views = _views([s.view for s in samples])
    if reference is None and not augment and views is None:
        return None
    sizes = [s.x.shape[0] if s.coords is not None else 1 for s in samples]
    index = torch.repeat_interleave(torch.arange(len(samples)), torch.as_tensor(sizes))
    units, owner, sources = _units(samples, sizes, index)
    stages: list[_LogStage] = []
    if reference is not None:
        norms = []
        for sample_no, (source, rows) in zip(owner, sources):
            sample = samples[sample_no]
            if source is None or source.method != reference.method:  # no slide fit: fit these pixels
                source = fit_stain(reference.method, _pixels(sample, rows), where=sample.slide)
            norms.append(normalising_map(source, reference))
        stages.append(_stage(norms))
    rgb = None
    if augment:
        used = [j if j is not None else NO_JITTER for j in jitters]
        od = [LogAffine(used[s].log_matrix, used[s].log_shift) for s in owner]  # one draw per sample
        if stages and stages[0].mix is None:  # both in OD space: one stage
            stages[0] = _compose(stages[0], _stage(od))
        else:
            stages.append(_stage(od))
        rgb = torch.as_tensor(np.stack([j.rgb_matrix for j in used]), dtype=torch.float32)
    return RowColour(index, stages, rgb, augment, views, None if units is index else units)


def _units(
    samples: Sequence[_Stained], sizes: list[int], index: torch.Tensor
) -> tuple[torch.Tensor, list[int], list[tuple[StainFit | None, np.ndarray | None]]]:
    """The stain units of a batch: each sample, or each of its slides where its stain gives them
    (`SampleStain.parts`). Returns each row's unit, each unit's sample, and each unit's stain fit (None:
    fit its pixels) with its rows in the sample (None: all of them)."""
    if not any(s.stain is not None and s.stain.parts for s in samples):
        return (
            index,
            list(range(len(samples))),
            [(s.stain.source if s.stain else None, None) for s in samples],
        )
    units = torch.empty_like(index)
    owner: list[int] = []
    sources: list[tuple[StainFit | None, np.ndarray | None]] = []
    start = 0
    for k, (sample, size) in enumerate(zip(samples, sizes)):
        stain = sample.stain
        if stain is not None and stain.parts:
            if len(stain.parts) != len(sample.parts):
                raise ValueError(
                    f"{sample.slide}: {len(stain.parts)} stain fits for a bag of {len(sample.parts)} slides"
                )
            for fit, part in zip(stain.parts, sample.parts):
                units[start + torch.as_tensor(part.tiles, dtype=torch.long)] = len(owner)
                owner.append(k)
                sources.append((fit, part.tiles))
        else:
            units[start : start + size] = len(owner)
            owner.append(k)
            sources.append((stain.source if stain is not None else None, None))
        start += size
    return units, owner, sources


def _views(views: Sequence[SampleView | None]) -> _Views | None:
    if all(v is None for v in views):
        return None
    used = [v or SampleView() for v in views]
    return _Views(
        torch.tensor([v.turns % 4 * 2 + v.mirror for v in used]),
        torch.tensor([[v.contrast, v.shift] for v in used], dtype=torch.float32),
    )


def _compose(first: _LogStage, second: _LogStage) -> _LogStage:
    """z · A1 + b1, then · A2 + b2 = z · (A1 A2) + (b1 A2 + b2)."""
    matrix = torch.bmm(first.matrix, second.matrix)
    shift = torch.bmm(first.shift.unsqueeze(1), second.matrix).squeeze(1) + second.shift
    return _LogStage(matrix, shift, None, None)


def _pixels(sample: _Stained, rows: np.ndarray | None = None) -> np.ndarray:
    x = sample.x if rows is None else sample.x[torch.as_tensor(rows, dtype=torch.long)]
    return x.movedim(-3, -1).reshape(-1, 3).cpu().numpy()
