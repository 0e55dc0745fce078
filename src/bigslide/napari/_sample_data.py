"""Sample data: a synthetic H&E slide with its tumour lesions, and a small labelled training set.

Files are written once into a cache folder (`$BIGSLIDE_CACHE`, else `~/.cache/bigslide/samples`) and
reused, so the menu entries open instantly the second time.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np

from bigslide.napari._layers import polygons_to_shapes, slide_display_name, slide_layer_data
from bigslide.napari._placement import keep_current_viewer_in_place
from bigslide.napari._roles import ROLE

LayerData = tuple[Any, dict[str, Any], str]

SAMPLE_SIZE = (3072, 2048)
SAMPLE_SEED = 11
SET_SLIDES = 8
SET_SIZE = (1024, 1024)
SET_GAP_UM = 100.0


def cache_dir() -> Path:
    root = os.environ.get("BIGSLIDE_CACHE")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bigslide"
    folder = base / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sample_slide_path() -> Path:
    """The synthetic sample slide (written on first use) with its `.lesions.geojson` beside it."""
    from bigslide.synthetic.slides import make_synthetic_slide
    from bigslide.tiling.regions import Region, save_regions

    path = cache_dir() / "sample_slide_he.svs"  # new name: a cached slide of an older generator stays unused
    lesions = lesions_path(path)
    if not (path.is_file() and lesions.is_file()):
        info = make_synthetic_slide(path, size=SAMPLE_SIZE, lesions=2, seed=SAMPLE_SEED)
        from shapely.geometry import Polygon

        save_regions([Region(Polygon(p), "lesion") for p in info.lesions], lesions)
    return path


def lesions_path(slide_path: Path) -> Path:
    return slide_path.with_name(f"{slide_display_name(slide_path)}.lesions.geojson")


def load_sample_slide() -> list[LayerData]:
    """Sample data command: the synthetic slide plus a Shapes layer of its lesions (level-0 px)."""
    from bigslide.wsi.slide import open_slide

    path = sample_slide_path()
    slide = open_slide(path)
    keep_current_viewer_in_place()
    layers = [slide_layer_data(slide, "sample slide")]
    layers.append(_lesion_layer(slide, lesions_path(path), "sample slide", (0.0, 0.0)))
    return layers


def load_training_set() -> list[LayerData]:
    """Sample data command: a small labelled slide set, laid out side by side, with lesion outlines.

    Each slide layer carries its label and split in its metadata, so the Slides panel lists them
    ready to train.
    """
    from bigslide.synthetic.slide_set import make_slide_set
    from bigslide.wsi.slide import open_slide

    keep_current_viewer_in_place()
    csv_path = make_slide_set(cache_dir() / "training_set", n_slides=SET_SLIDES, size=SET_SIZE, seed=3)
    layers: list[LayerData] = []
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    columns = 4
    for index, row in enumerate(rows):
        slide = open_slide(csv_path.parent / row["slide"])
        mpp = slide.mpp or (1.0, 1.0)
        width, height = slide.dimensions
        offset = (
            (index // columns) * (height * mpp[1] + SET_GAP_UM),
            (index % columns) * (width * mpp[0] + SET_GAP_UM),
        )
        name = slide_display_name(slide.path)
        data, kwargs, kind = slide_layer_data(slide, f"{name} ({row['label']})")
        kwargs["translate"] = offset
        kwargs["metadata"].update(label=row["label"], split=row.get("split", ""))
        layers.append((data, kwargs, kind))
        lesions = lesions_path(slide.path)
        if row["label"] == "tumor" and lesions.is_file():
            layers.append(_lesion_layer(slide, lesions, name, offset))
    return layers


def _lesion_layer(slide: Any, geojson: Path, name: str, offset: tuple[float, float]) -> LayerData:
    from bigslide.explain.placement import Placement
    from bigslide.napari._layers import outline_width
    from bigslide.napari._placement import WORLD_UNITS
    from bigslide.tiling.regions import load_regions

    shapes = polygons_to_shapes([r.geometry for r in load_regions(geojson)])
    placement = Placement(slide.mpp, offset)
    scale, translate = placement.vertices()
    kwargs = {
        "name": f"{name} lesions",
        "shape_type": "polygon",
        "scale": scale,
        "translate": translate,
        "units": WORLD_UNITS,
        "edge_color": "#ff2d55",
        "face_color": "transparent",
        "edge_width": outline_width([slide.dimensions]),
        "metadata": {ROLE: "lesions", "slide": str(slide.path), "path": str(geojson), "shapes": True},
    }
    return [np.asarray(s) for s in shapes], kwargs, "shapes"
