"""Synthetic slides with planted lesions and UltraMNIST canvases: geometry, ground truth, caching."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tiffslide
from scipy import ndimage
from skimage import draw

from bigslide.data.ultramnist import UltraMNIST
from bigslide.errors import DataError
from bigslide.synthetic import (
    SlideInfo,
    he,
    lesion_fraction,
    lesion_tiles,
    load_lesions,
    make_slide_set,
    make_synthetic_slide,
    make_ultramnist,
    render_canvas,
    synthesize_slide,
    ultramnist_label,
)
from bigslide.tiling.regions import load_regions


@pytest.mark.parametrize(("flavour", "suffix"), [("svs", ".svs"), ("tiff", ".tiff"), ("ome", ".ome.tif")])
def test_slide_file_has_requested_size_levels_mpp_and_pixels(tmp_path: Path, flavour, suffix) -> None:
    path = tmp_path / f"s{suffix}"
    info = make_synthetic_slide(path, size=(1024, 768), lesions=1, seed=3, mpp=0.25, flavour=flavour)
    expected = synthesize_slide((1024, 768), lesions=1, seed=3).rgb
    with tiffslide.TiffSlide(path) as slide:
        assert slide.dimensions == (1024, 768)
        assert slide.level_count == 3
        assert slide.level_dimensions == ((1024, 768), (512, 384), (256, 192))
        assert float(slide.properties["tiffslide.mpp-x"]) == pytest.approx(0.25)
        assert float(slide.properties["tiffslide.mpp-y"]) == pytest.approx(0.25)
        region = np.asarray(slide.read_region((300, 200), 0, (256, 128)))[..., :3]
    # Lossless and deterministic: the file holds exactly the rendered image.
    np.testing.assert_array_equal(region, expected[200:328, 300:556])
    assert info.dimensions == (1024, 768)
    assert info.mpp == 0.25


def test_label_is_lesion_presence() -> None:
    for lesions in (0, 1, 3):
        image = synthesize_slide((768, 768), lesions=lesions, seed=lesions)
        assert len(image.lesions) == lesions
        assert image.lesion_mask.any() == (lesions > 0)


def test_written_info_labels_and_boxes(tmp_path: Path) -> None:
    negative = make_synthetic_slide(tmp_path / "n.svs", size=(512, 512), lesions=0, seed=1)
    positive = make_synthetic_slide(tmp_path / "p.svs", size=(512, 512), lesions=2, seed=1)
    assert (negative.label, negative.lesions, negative.boxes) == (0, [], [])
    assert positive.label == 1
    assert len(positive.boxes) == 2
    for (x0, y0, x1, y1), poly in zip(positive.boxes, positive.lesions):
        assert 0 <= x0 < x1 < 512
        assert 0 <= y0 < y1 < 512
        assert (x0, y0) == tuple(poly.min(axis=0))


@pytest.mark.parametrize("seed", [0, 1])
def test_lesions_lie_inside_tissue_at_the_documented_size(seed: int) -> None:
    image = synthesize_slide((1024, 1024), lesions=3, seed=seed)
    assert 0.2 < image.tissue.mean() < 0.6
    assert not (image.lesion_mask & ~image.tissue).any()
    labels, n = ndimage.label(image.lesion_mask)
    assert n == 3  # non-overlapping
    diameters = np.sqrt(4 * np.bincount(labels.ravel())[1:] / np.pi)
    # default diameters: 12-25 % of the slide side (crowded placement may shrink them to 60 %)
    assert np.all((diameters > 0.6 * 0.12 * 1024 * 0.9) & (diameters < 0.25 * 1024 * 1.15)), diameters
    # Background is near-white glass; tissue is stained.
    assert image.rgb[~image.tissue].mean() > 235
    assert image.rgb[image.tissue].mean() < 225


@pytest.mark.parametrize("kind", ["tumour", "subtle"])
def test_lesion_mask_is_exactly_where_pixels_change(kind: str) -> None:
    """The same seed with and without lesions differs only inside the mask, and over much of it."""
    with_lesions = synthesize_slide((768, 768), lesions=2, seed=7, lesion_kind=kind)
    without = synthesize_slide((768, 768), lesions=0, seed=7, lesion_kind=kind)
    changed = (with_lesions.rgb != without.rgb).any(axis=-1)
    assert changed.any()
    assert not (changed & ~with_lesions.lesion_mask).any()
    share = changed[with_lesions.lesion_mask].mean()
    assert share > (0.7 if kind == "tumour" else 0.02), share  # subtle: nuclei only
    # The polygons are the mask (pixel centres inside them).
    from_polygons = np.zeros_like(with_lesions.lesion_mask)
    for poly in with_lesions.lesions:
        rr, cc = draw.polygon(poly[:, 1] - 0.5, poly[:, 0] - 0.5, from_polygons.shape)
        from_polygons[rr, cc] = True
    np.testing.assert_array_equal(from_polygons, with_lesions.lesion_mask)


def test_tumour_is_dark_and_crowded_subtle_keeps_the_colour() -> None:
    """Tumour: much more hematoxylin; subtle: the same mean colour as the tissue it replaced."""
    for seed in range(3):
        tumour = synthesize_slide((768, 768), lesions=2, seed=seed, lesion_kind="tumour")
        subtle = synthesize_slide((768, 768), lesions=2, seed=seed, lesion_kind="subtle")
        plain = synthesize_slide((768, 768), lesions=0, seed=seed)
        mask = tumour.lesion_mask
        np.testing.assert_array_equal(mask, subtle.lesion_mask)
        before = plain.rgb[mask].astype(float).mean(0)
        assert (before - tumour.rgb[mask].astype(float).mean(0)).min() > 30
        assert np.abs(before - subtle.rgb[mask].astype(float).mean(0)).max() < 4


def test_subtle_nuclei_are_their_twins_enlarged_and_paler() -> None:
    """Subtle nuclei cover more pixels at a lower peak density: a cell-level change, not a colour one."""
    normal, subtle = he.nucleus_bank("normal"), he.nucleus_bank("subtle")
    np.testing.assert_allclose(subtle.radius, normal.radius * he.SUBTLE_ENLARGEMENT, rtol=1e-6)
    area = [(bank.templates > 0.1).sum((1, 2)).mean() for bank in (normal, subtle)]
    assert area[1] > 1.5 * area[0], area
    mean_od = [np.median(bank.templates[bank.templates > 0.1]) for bank in (normal, subtle)]
    assert mean_od[1] < 0.8 * mean_od[0], mean_od


def test_generator_is_deterministic_per_seed() -> None:
    a = synthesize_slide((512, 384), lesions=1, seed=3, lesion_kind="subtle")
    b = synthesize_slide((512, 384), lesions=1, seed=3, lesion_kind="subtle")
    np.testing.assert_array_equal(a.rgb, b.rgb)
    np.testing.assert_array_equal(a.lesions[0], b.lesions[0])
    assert not np.array_equal(a.rgb, synthesize_slide((512, 384), lesions=1, seed=4).rgb)


def test_bad_lesion_kind_is_a_data_error() -> None:
    with pytest.raises(DataError, match="lesion_kind='cancer'"):
        synthesize_slide((128, 128), lesions=1, seed=0, lesion_kind="cancer")  # type: ignore[arg-type]


def test_lesion_fraction_is_exact_on_a_square() -> None:
    square = [np.array([[100, 100], [200, 100], [200, 200], [100, 200]], float)]
    coords = np.array([[0, 0], [128, 128], [256, 0], [64, 64], [100, 100]])
    fraction = lesion_fraction(square, coords, 128)
    expected = np.array([28 * 28, 72 * 72, 0, 92 * 92, 100 * 100]) / 128**2
    np.testing.assert_allclose(fraction, expected, rtol=1e-12)
    info = SlideInfo(path=Path("x.svs"), label=1, lesions=square, dimensions=(512, 512))
    np.testing.assert_allclose(lesion_fraction(info, coords, 128), expected, rtol=1e-12)
    np.testing.assert_array_equal(
        lesion_tiles(info, coords, 128, threshold=0.1), [False, True, False, True, True]
    )
    assert lesion_fraction([], coords, 128).tolist() == [0.0] * 5


def test_lesion_fraction_agrees_with_the_rendered_mask() -> None:
    image = synthesize_slide((1024, 1024), lesions=3, seed=5)
    tile = 64
    ys, xs = np.mgrid[0:1024:tile, 0:1024:tile]
    coords = np.stack([xs.ravel(), ys.ravel()], axis=1)
    from_pixels = image.lesion_mask.reshape(16, tile, 16, tile).mean(axis=(1, 3)).ravel()
    exact = lesion_fraction(image.lesions, coords, tile)
    assert exact.sum() > 1
    assert np.abs(exact - from_pixels).max() < 0.06


def test_too_many_lesions_is_a_data_error() -> None:
    with pytest.raises(DataError, match="lesions=50"):
        synthesize_slide((128, 128), lesions=50, seed=0)


def _mtimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


def test_slide_set_table_splits_lesions_and_cache(tmp_path: Path) -> None:
    out = tmp_path / "set"
    csv_path = make_slide_set(out, n_slides=8, size=(512, 512), seed=2)
    assert csv_path == out / "slides.csv"
    with csv_path.open() as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == ["slide", "label", "split"]
        rows = list(reader)
    assert len(rows) == 8
    assert all(not Path(r["slide"]).is_absolute() and (out / r["slide"]).is_file() for r in rows)
    assert Counter(r["label"] for r in rows) == {"tumor": 4, "normal": 4}
    per_split = Counter((r["split"], r["label"]) for r in rows)
    for split in ("train", "val", "test"):
        assert per_split[(split, "tumor")] >= 1
        assert per_split[(split, "normal")] >= 1
    assert per_split[("train", "tumor")] == per_split[("train", "normal")] == 2

    lesions = load_lesions(out / "lesions.json")
    assert set(lesions) == {r["slide"] for r in rows}
    for row in rows:
        polys = lesions[row["slide"]]
        assert (len(polys) > 0) == (row["label"] == "tumor")
        regions = load_regions(out / f"{row['slide'].split('.')[0]}.lesions.geojson")
        assert len(regions) == len(polys)
        assert all(r.name == "lesion" for r in regions)
        for region, poly in zip(regions, polys):
            assert region.geometry.area == pytest.approx(abs(_shoelace(poly)), rel=1e-3)
        with tiffslide.TiffSlide(out / row["slide"]) as slide:
            assert slide.dimensions == (512, 512)

    before = _mtimes(out)
    assert make_slide_set(out, n_slides=8, size=(512, 512), seed=2) == csv_path
    assert _mtimes(out) == before
    make_slide_set(out, n_slides=8, size=(512, 512), seed=3)  # other parameters: rewritten
    after = _mtimes(out)
    assert all(after[name] != before[name] for name in before)
    assert json.loads((out / "synthetic_set.json").read_text())["params"]["seed"] == 3


def _shoelace(poly: np.ndarray) -> float:
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def test_ultramnist_labels_are_digit_sums_below_ten() -> None:
    canvases = [render_canvas(i, size=256, seed=1) for i in range(150)]
    for i, canvas in enumerate(canvases):
        assert canvas.label == sum(canvas.digits) < 10
        assert 3 <= len(canvas.digits) <= 5
        assert ultramnist_label(i, seed=1) == canvas.label
        for x0, y0, side in canvas.boxes:
            assert x0 >= 0
            assert y0 >= 0
            assert x0 + side <= 256
            assert y0 + side <= 256
            assert canvas.image[y0 : y0 + side, x0 : x0 + side].max() > 0.5  # the digit is drawn
    counts = np.bincount([ultramnist_label(i, seed=1) for i in range(2000)], minlength=10)
    assert counts.min() > 150, counts
    assert counts.max() < 250, counts


def test_ultramnist_digits_span_scales_without_heavy_overlap() -> None:
    canvases = [render_canvas(i, size=512, seed=0) for i in range(60)]
    sides = np.array([side for c in canvases for *_, side in c.boxes])
    assert sides.min() < 512 / 10
    assert sides.max() > 512 / 3
    spread = [max(s for *_, s in c.boxes) / min(s for *_, s in c.boxes) for c in canvases]
    assert np.median(spread) > 2.5
    for c in canvases:
        for a in range(len(c.boxes)):
            for b in range(a + 1, len(c.boxes)):
                (xa, ya, sa), (xb, yb, sb) = c.boxes[a], c.boxes[b]
                w = max(0, min(xa + sa, xb + sb) - max(xa, xb))
                h = max(0, min(ya + sa, yb + sb) - max(ya, yb))
                assert w * h <= 0.1 * min(sa, sb) ** 2 + 1e-9


def test_ultramnist_is_deterministic_and_dataset_matches() -> None:
    first, again = render_canvas(7, size=256, seed=5), render_canvas(7, size=256, seed=5)
    np.testing.assert_array_equal(first.image, again.image)
    assert first.digits == again.digits
    assert not np.array_equal(first.image, render_canvas(8, size=256, seed=5).image)
    assert not np.array_equal(first.image, render_canvas(7, size=256, seed=6).image)
    assert not np.array_equal(first.image, render_canvas(7, size=256, seed=5, split="val").image)

    dataset = UltraMNIST(20, size=256, seed=5)
    sample = dataset[7]
    assert sample.x.shape == (3, 256, 256)
    assert sample.x.dtype.is_floating_point
    assert float(sample.x.min()) >= 0
    assert float(sample.x.max()) <= 1
    assert sample.y == first.label == dataset.labels[7]
    assert sample.slide == "ultramnist:7"
    np.testing.assert_allclose(sample.x[0].numpy(), first.image)
    np.testing.assert_array_equal(sample.x[0], sample.x[2])

    images, labels = make_ultramnist(20, size=256, seed=5)
    assert images.shape == (20, 256, 256, 3)
    assert images.dtype == np.uint8
    np.testing.assert_array_equal(labels, dataset.labels)
    np.testing.assert_array_equal(images[7, ..., 1], np.round(first.image * 255).astype(np.uint8))
    with pytest.raises(DataError, match="split"):
        UltraMNIST(2, size=256, split="test")  # type: ignore[arg-type]


def test_ultramnist_digit_task_repeats_one_digit_at_the_requested_scale() -> None:
    scale = (1 / 32, 1 / 8)
    for i in range(40):
        canvas = render_canvas(i, size=256, seed=2, task="digit", scale=scale)
        assert set(canvas.digits) == {canvas.label}
        assert 3 <= len(canvas.digits) <= 5
        assert ultramnist_label(i, seed=2, task="digit") == canvas.label
        assert all(8 <= side <= 256 / 8 + 1 for *_, side in canvas.boxes)
    counts = np.bincount([ultramnist_label(i, seed=2, task="digit") for i in range(1000)], minlength=10)
    assert counts.min() > 70, counts
    with pytest.raises(DataError, match="task"):
        render_canvas(0, task="product")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="scale"):
        render_canvas(0, scale=(0.5, 0.25))


def test_ultramnist_shrunk_canvas_is_the_full_canvas_downsampled() -> None:
    full = UltraMNIST(4, size=256, seed=3, task="digit")
    small = UltraMNIST(4, size=64, seed=3, task="digit", canvas=256)
    np.testing.assert_array_equal(full.labels, small.labels)
    big, shrunk = full[2].x[0].numpy(), small[2].x[0].numpy()
    assert shrunk.shape == (64, 64)
    # Each low-resolution pixel is close to the mean of the 4 x 4 block it covers (anti-aliased shrink).
    blocks = big.reshape(64, 4, 64, 4).mean(axis=(1, 3))
    assert np.abs(shrunk - blocks).mean() < 0.03
    assert abs(shrunk.mean() - big.mean()) < 0.01
    with pytest.raises(DataError, match="size"):
        UltraMNIST(2, size=512, canvas=256)
