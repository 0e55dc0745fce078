"""A set of synthetic slides on disk: the slides, `slides.csv` (slide,label,split), `lesions.json` and a
QuPath GeoJSON of each slide's lesions, cached by the parameters that made them."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import shapely

from bigslide.errors import DataError
from bigslide.synthetic.labs import LABS, lab_named
from bigslide.synthetic.pyramid import Flavour
from bigslide.synthetic.slides import LesionKind, SlideInfo, make_synthetic_slide
from bigslide.tiling.regions import Region, save_regions

_SUFFIX = {"svs": ".svs", "tiff": ".tiff", "ome": ".ome.tif"}
_MANIFEST = "synthetic_set.json"
_SET_VERSION = 3


def _stratified_splits(labels: list[int], rng: np.random.Generator) -> list[str]:
    """About 50/25/25 train/val/test per class, with each class in every split when it has >= 3 slides."""
    splits = [""] * len(labels)
    for k, cls in enumerate(sorted(set(labels))):
        idx = rng.permutation([i for i, lab in enumerate(labels) if lab == cls])
        n = len(idx)
        n_train = max(1, min(-(-n // 2), n - 2)) if n >= 3 else 1
        rest = n - n_train
        n_val = (rest + 1) // 2 if k % 2 == 0 else rest // 2  # alternate so totals stay balanced
        if n == 2:
            n_val = 1
        for j, i in enumerate(idx):
            splits[i] = "train" if j < n_train else "val" if j < n_train + n_val else "test"
    return splits


def _write_lesion_geojson(polygons: list[np.ndarray], path: Path) -> None:
    """QuPath-style GeoJSON: one Polygon annotation classified "lesion" per lesion, level-0 pixel (x, y)."""
    save_regions([Region(shapely.Polygon(poly), name="lesion") for poly in polygons], path)


def load_lesions(path: str | Path) -> dict[str, list[np.ndarray]]:
    """Read a set's `lesions.json`: slide file name -> list of (K, 2) level-0 (x, y) polygons."""
    raw = json.loads(Path(path).read_text())
    return {name: [np.asarray(p, dtype=np.float64) for p in polys] for name, polys in raw.items()}


def make_slide_set(
    out_dir: str | Path,
    *,
    n_slides: int = 40,
    size: tuple[int, int] = (1024, 1024),
    seed: int = 0,
    positive_fraction: float = 0.5,
    flavour: Flavour = "svs",
    lesion_diameter: tuple[float, float] | None = None,
    lesion_kind: LesionKind = "tumour",
    lesion_count: tuple[int, int] = (1, 3),
    lab: str = "A",
    splits: Sequence[str] | None = None,
) -> Path:
    """Write slides, `slides.csv` (slide,label,split), `lesions.json` and per-slide lesion GeoJSON.

    `lesion_diameter` = (min, max) in level-0 pixels; None scales the default with the slide size.
    Each positive slide holds `lesion_count` = (min, max) lesions of `lesion_kind`.
    `lab`: whose staining (`bigslide.synthetic.labs`: "A", "B", "C" or "drawn-<seed>"); another lab with
    the same other parameters writes the same tissue, lesions, labels and splits in that lab's colours.
    `splits`: write (and list) only the slides of these splits, e.g. ("test",) for a lab that only
    tests a model; None: all.

    Returns the CSV path. A folder already holding a set made with the same parameters is reused as is.
    """
    if n_slides < 1:
        raise DataError(f"n_slides={n_slides}: must be >= 1")
    if not 1 <= lesion_count[0] <= lesion_count[1]:
        raise DataError(f"lesion_count={lesion_count}: need 1 <= min <= max")
    if not 0 <= positive_fraction <= 1:
        raise DataError(f"positive_fraction={positive_fraction}: must be in [0, 1]")
    stains = lab_named(lab)
    if splits is not None and not set(splits) <= {"train", "val", "test"}:
        raise DataError(f"splits={list(splits)}: each must be one of train, val, test")
    out = Path(out_dir)
    csv_path = out / "slides.csv"
    params = {
        "version": _SET_VERSION,
        "n_slides": n_slides,
        "size": [int(size[0]), int(size[1])],
        "seed": seed,
        "positive_fraction": positive_fraction,
        "flavour": flavour,
        "lesion_diameter": list(lesion_diameter) if lesion_diameter else None,
        "lesion_kind": lesion_kind,
        "lesion_count": list(lesion_count),
    }
    if lab != "A":  # lab A's sets keep the parameters (and so the caches) they had before labs existed
        params["lab"] = lab
    if lab not in LABS:  # a drawn lab: what it was drawn as, so a changed draw is not taken from the cache
        params["lab_stain"] = stains.describe()
    if splits is not None:
        params["splits"] = sorted(splits)
    names = [f"slide_{i:03d}{_SUFFIX[flavour]}" for i in range(n_slides)]

    rng = np.random.default_rng([seed, 7919])
    n_pos = round(n_slides * positive_fraction)
    labels = [0] * n_slides
    for i in rng.permutation(n_slides)[:n_pos]:
        labels[i] = 1
    split_of = _stratified_splits(labels, rng)
    counts = [int(rng.integers(lesion_count[0], lesion_count[1] + 1)) if y else 0 for y in labels]
    kept = [i for i in range(n_slides) if splits is None or split_of[i] in splits]
    if _cached(out, params, [names[i] for i in kept]):
        return csv_path
    out.mkdir(parents=True, exist_ok=True)
    (out / _MANIFEST).unlink(missing_ok=True)  # an interrupted rewrite must not look complete

    def write(i: int) -> SlideInfo:
        name = names[i]
        info = make_synthetic_slide(
            out / name,
            size=size,
            lesions=counts[i],
            seed=seed * 100_003 + i,
            flavour=flavour,
            lesion_diameter=lesion_diameter,
            lesion_kind=lesion_kind,
            lab=lab,
        )
        _write_lesion_geojson(info.lesions, out / f"{name.split('.')[0]}.lesions.geojson")
        return info

    # numpy and zlib release the GIL, so two threads nearly halve the time.
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        infos = dict(zip(kept, pool.map(write, kept)))
    lesions = {names[i]: [poly.round(2).tolist() for poly in info.lesions] for i, info in infos.items()}

    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["slide", "label", "split"])
        for i in kept:
            writer.writerow([names[i], "tumor" if labels[i] else "normal", split_of[i]])
    (out / "lesions.json").write_text(json.dumps(lesions))
    kept_names = [names[i] for i in kept]
    (out / _MANIFEST).write_text(json.dumps({"params": params, "slides": kept_names}, indent=1))
    return csv_path


def _cached(out: Path, params: dict, names: list[str]) -> bool:
    try:
        manifest = json.loads((out / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("params") != params or manifest.get("slides") != names:
        return False
    return all((out / n).is_file() for n in [*names, "slides.csv", "lesions.json"])
