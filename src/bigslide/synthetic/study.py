"""Synthetic study data: slides like the demo's with a survival, regression or case-level endpoint.

Each table carries an `oracle` column, the quantity the outcome was made from, so a model's score can be
compared with the best one possible:

- survival (`slide,time,event,split,oracle`): the tumour burden b is the lesion area as a percentage of
  the tissue area, measured on the rendered slide; the log-hazard is `oracle = beta * b`, with beta chosen
  so that the oracle's expected C-index on the true times is `c_index`. Times are exponential, in months;
  independent exponential censoring leaves about `censored` of the slides censored.
- regression (`slide,target,split,oracle`): `oracle` = lesion area as a percentage of the tissue area,
  `target` = oracle + Gaussian noise sized so that the expected Pearson r(oracle, target) is `r`.
- cases (`slide,label,case,split,oracle`): three slides per case; a "tumor" case holds lesions in exactly
  one of its slides (oracle 1 there, 0 elsewhere), a "normal" case in none.

Splits are about 50/25/25 train/val/test, stratified (by event, by lesion count, by case label) and by
case for `cases`. Slides, `lesions.json` and per-slide lesion GeoJSON are written as `make_slide_set`
writes them, and the set is cached the same way.
"""

from __future__ import annotations

import csv
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from bigslide.errors import DataError
from bigslide.synthetic.pyramid import Flavour, downsample_pyramid, write_pyramid
from bigslide.synthetic.slide_set import (
    _MANIFEST,
    _SUFFIX,
    _cached,
    _stratified_splits,
    _write_lesion_geojson,
)
from bigslide.synthetic.slides import LesionKind, synthesize_slide

StudyKind = Literal["survival", "regression", "cases"]
STUDY_KINDS: tuple[str, ...] = ("survival", "regression", "cases")
SLIDES_PER_CASE = 3
MPP = 0.5  # µm/px, as the demo set
_STUDY_VERSION = 1
_MEDIAN_MONTHS = 36.0  # median survival time at the set's mean log-hazard


@dataclass(frozen=True)
class _Rendered:
    polygons: list[np.ndarray]
    burden: float  # lesion area as a percentage of the tissue area


def make_study_set(
    out_dir: str | Path,
    kind: StudyKind,
    *,
    n: int = 48,
    seed: int = 0,
    size: tuple[int, int] = (1024, 1024),
    flavour: Flavour = "svs",
    lesion_kind: LesionKind = "tumour",
    max_lesions: int = 3,
    c_index: float = 0.8,
    censored: float = 0.3,
    r: float = 0.95,
) -> Path:
    """Write `n` slides, `slides.csv`, `lesions.json` and per-slide lesion GeoJSON for a `kind` study.

    Slides hold 0 to `max_lesions` lesions (1 to `max_lesions` on the lesion slide of a "tumor" case);
    `n` must be a multiple of 3 for `cases`. `c_index` and `censored` shape the survival endpoint, `r`
    the regression one (see the module docstring).

    Returns the CSV path. A folder already holding a set made with the same parameters is reused as is.
    """
    if kind not in STUDY_KINDS:
        raise DataError(f"kind={kind!r}: must be one of {', '.join(STUDY_KINDS)}")
    if n < 4:
        raise DataError(f"n={n}: a study set needs at least 4 slides (train, val and test)")
    if kind == "cases" and n % SLIDES_PER_CASE:
        raise DataError(f"n={n}: a cases set needs a multiple of {SLIDES_PER_CASE} slides")
    if max_lesions < 1:
        raise DataError(f"max_lesions={max_lesions}: must be >= 1")
    if not 0.5 < c_index < 1:
        raise DataError(f"c_index={c_index}: must be in (0.5, 1)")
    if not 0 <= censored < 1:
        raise DataError(f"censored={censored}: must be in [0, 1)")
    if not 0 < r <= 1:
        raise DataError(f"r={r}: must be in (0, 1]")
    out = Path(out_dir)
    csv_path = out / "slides.csv"
    outcome = {"survival": {"c_index": c_index, "censored": censored}, "regression": {"r": r}}
    params = {
        "version": _STUDY_VERSION,
        "kind": kind,
        "n": n,
        "seed": seed,
        "size": [int(size[0]), int(size[1])],
        "flavour": flavour,
        "lesion_kind": lesion_kind,
        "max_lesions": max_lesions,
        **outcome.get(kind, {}),
    }
    names = [f"slide_{i:03d}{_SUFFIX[flavour]}" for i in range(n)]
    if _cached(out, params, names):
        return csv_path
    out.mkdir(parents=True, exist_ok=True)
    (out / _MANIFEST).unlink(missing_ok=True)  # an interrupted rewrite must not look complete

    # Separate streams: the design, the slides' pixels and the outcome noise do not shift one another.
    r_design, r_slides, r_outcome = (
        np.random.default_rng(s) for s in np.random.SeedSequence([seed, STUDY_KINDS.index(kind)]).spawn(3)
    )
    if kind == "cases":
        n_cases = n // SLIDES_PER_CASE
        case_labels = [0] * n_cases
        for c in r_design.permutation(n_cases)[: n_cases // 2]:
            case_labels[c] = 1
        counts = [0] * n
        for c, lab in enumerate(case_labels):
            if lab:
                counts[c * SLIDES_PER_CASE + int(r_design.integers(SLIDES_PER_CASE))] = int(
                    r_design.integers(1, max_lesions + 1)
                )
    else:
        # Every count equally often, so the burden spans its range even in a small set.
        counts = [int(c) for c in r_design.permutation(np.resize(np.arange(max_lesions + 1), n))]
    slide_seeds = r_slides.integers(2**31, size=n)

    def write(i: int) -> _Rendered:
        rendered = _render(out / names[i], counts[i], int(slide_seeds[i]), size, flavour, lesion_kind)
        _write_lesion_geojson(rendered.polygons, out / f"{names[i].split('.')[0]}.lesions.geojson")
        return rendered

    # numpy and zlib release the GIL, so two threads nearly halve the time.
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        slides = list(pool.map(write, range(n)))
    burden = np.array([s.burden for s in slides])

    header: list[str]
    rows: list[list[object]]
    if kind == "survival":
        oracle, time, event = _survival(burden, c_index, censored, r_outcome)
        splits = _stratified_splits(event.tolist(), r_design)
        header = ["slide", "time", "event", "split", "oracle"]
        rows = [
            [nm, f"{t:.1f}", int(e), sp, f"{o:.4f}"]
            for nm, t, e, sp, o in zip(names, time, event, splits, oracle)
        ]
    elif kind == "regression":
        oracle = np.round(burden, 2)
        noise_sd = float(oracle.std()) * math.sqrt(1 / r**2 - 1)
        target = oracle + r_outcome.normal(0, noise_sd, n)
        splits = _stratified_splits([len(s.polygons) for s in slides], r_design)
        header = ["slide", "target", "split", "oracle"]
        rows = [[nm, f"{t:.2f}", sp, f"{o:.2f}"] for nm, t, sp, o in zip(names, target, splits, oracle)]
    else:
        case_splits = _stratified_splits(case_labels, r_design)
        header = ["slide", "label", "case", "split", "oracle"]
        rows = []
        for i, nm in enumerate(names):
            c = i // SLIDES_PER_CASE
            label = "tumor" if case_labels[c] else "normal"
            rows.append([nm, label, f"case_{c:03d}", case_splits[c], int(bool(slides[i].polygons))])

    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    lesions = {nm: [poly.round(2).tolist() for poly in s.polygons] for nm, s in zip(names, slides)}
    (out / "lesions.json").write_text(json.dumps(lesions))
    (out / _MANIFEST).write_text(json.dumps({"params": params, "slides": names}, indent=1))
    return csv_path


def _render(
    path: Path, count: int, seed: int, size: tuple[int, int], flavour: Flavour, lesion_kind: LesionKind
) -> _Rendered:
    """Write one slide and measure its burden; a slide too small for `count` lesions gets fewer."""
    while True:
        try:
            image = synthesize_slide(size, lesions=count, seed=seed, lesion_kind=lesion_kind)
            break
        except DataError:
            if count <= 1:
                raise
            count -= 1
    write_pyramid(path, downsample_pyramid(image.rgb, 3), mpp=MPP, tile=256, flavour=flavour)
    burden = 100 * float(image.lesion_mask.sum()) / max(1, int(image.tissue.sum()))
    return _Rendered(image.lesions, burden)


def _survival(
    burden: np.ndarray, c_index: float, censored: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Log-hazard `beta * burden`, exponential event times and independent exponential censoring, in
    months (rounded to 0.1, at least 0.1). Returns (oracle, time, event)."""
    beta = _beta_for_c_index(burden, c_index)
    oracle = beta * burden
    hazard = math.log(2) / _MEDIAN_MONTHS * np.exp(oracle - oracle.mean())
    event_time = rng.exponential(1 / hazard)
    # P(censored) for slide i is rate / (rate + hazard_i): pick the rate that gives `censored` on average.
    rate = _censoring_rate(hazard, censored)
    censor_time = rng.exponential(1 / rate, len(burden)) if rate > 0 else np.full(len(burden), np.inf)
    event = event_time <= censor_time
    time = np.maximum(0.1, np.round(np.where(event, event_time, censor_time), 1))
    return oracle, time, event.astype(int)


def _pair_concordance(burden: np.ndarray, beta: float) -> float:
    """Expected Harrell C-index of `beta * burden` on uncensored exponential times: a pair whose
    log-hazards differ by d is concordant with probability 1 / (1 + exp(-|d|)); ties count one half."""
    diff = np.abs(burden[:, None] - burden[None, :])[np.triu_indices(len(burden), 1)]
    return float(np.mean(1 / (1 + np.exp(-beta * diff))))


def _beta_for_c_index(burden: np.ndarray, c_index: float) -> float:
    lo, hi = 0.0, 1.0
    while _pair_concordance(burden, hi) < c_index:
        if hi > 1e3:  # too many slides share a burden for any beta to reach it
            raise DataError(f"c_index={c_index}: out of reach for these slides' tumour burdens")
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _pair_concordance(burden, mid) < c_index else (lo, mid)
    return hi


def _censoring_rate(hazard: np.ndarray, censored: float) -> float:
    if censored == 0:
        return 0.0
    lo, hi = 0.0, float(hazard.max()) * 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.mean(mid / (mid + hazard)) < censored else (lo, mid)
    return hi
