"""Tissue, not ink: the stain rule keeps stained tissue and leaves out pen ink, marker and dust; focus is
measured per tile; the tissue check travels with the grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from bigslide.data.config import DataConfig
from bigslide.synthetic.marks import INKS, synthesize_marked_slide
from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling.grid import BLUR, INK, TileGrid
from bigslide.tiling.pixel_classes import GLASS, GREYSCALE_RULE, TISSUE, TissueSettings
from bigslide.tiling.pixel_classes import INK as INK_PIXEL
from bigslide.tiling.tissue import block_mean, classify_pixels
from bigslide.tiling.tissue_measure import box_means, footprints
from bigslide.wsi.slide import open_slide


@pytest.fixture(scope="module")
def tissue_slide() -> tuple[np.ndarray, np.ndarray]:
    """A synthetic slide (lab A, no lesion) at 1 µm/px (a 2x reduction of 0.5 µm/px), and where it is
    tissue well inside its edge."""
    image = synthesize_slide((512, 512), lesions=0, seed=3)
    inside = ndimage.binary_erosion(image.tissue, iterations=12)[::2, ::2]
    return downsample_pyramid(image.rgb, 2)[1], inside


def _on_glass(patch: np.ndarray, glass: int = 245) -> np.ndarray:
    image = np.full((96, 96, 3), glass, np.uint8)
    image[16:80, 16:80] = patch
    return image


@pytest.mark.parametrize("ink", list(INKS))
def test_ink_of_every_colour_on_glass_is_not_tissue(ink: str) -> None:
    rng = np.random.default_rng(0)
    colour = np.array(INKS[ink], np.float64)
    streaks = 1 + 0.08 * ndimage.gaussian_filter(rng.normal(size=(64, 64)), 2)[..., None] / 0.1
    stroke = np.clip(np.rint(255 * (colour / 255) ** streaks), 0, 255).astype(np.uint8)
    classes = classify_pixels(_on_glass(stroke), pixel_um=4.0)
    assert (classes[16:80, 16:80] == INK_PIXEL).mean() > 0.95
    assert (classes[:8] == GLASS).all()
    # the greyscale rule took every one of them for tissue
    assert (classify_pixels(_on_glass(stroke), GREYSCALE_RULE)[16:80, 16:80] == TISSUE).all()


def test_stained_tissue_pale_tissue_and_tissue_under_light_ink_are_tissue(
    tissue_slide: tuple[np.ndarray, np.ndarray],
) -> None:
    rgb, inside = tissue_slide
    od = -np.log((rgb.astype(np.float64) + 0.5) / 255.5)
    glass = -np.log(245.5 / 255.5)
    pale = np.rint(255.5 * np.exp(-(glass + (od - glass) * 0.5)) - 0.5).astype(np.uint8)
    blue = -np.log(np.array(INKS["blue"]) / 255.0)
    under_ink = np.clip(np.rint(rgb * np.exp(-0.3 * blue)), 0, 255).astype(np.uint8)
    for name, image, most in (
        ("tissue", rgb, 0.93),
        ("pale", pale, 0.9),
        ("under light ink", under_ink, 0.8),
    ):
        classes = classify_pixels(image, glass=np.full(3, glass, np.float32), pixel_um=1.0)
        assert (classes[inside] == TISSUE).mean() > most, name


def test_very_pale_tissue_is_judged_with_its_neighbourhood_and_glass_stays_glass() -> None:
    """Tissue stained at 30-40 % strength, on 4 µm pixels: many of its pixels absorb less than GLASS_OD
    alone, between pale nuclei; judged with their neighbourhood (`GLASS_WINDOW_UM`) they are tissue, and
    open glass stays glass. Judged pixel by pixel, 39 % and 87 % of this slide's inside were tissue."""
    image = synthesize_slide((2048, 2048), lesions=0, seed=4)  # 0.5 µm/px
    rgb = block_mean(image.rgb, 8)
    inside = ndimage.binary_erosion(image.tissue, iterations=48)[::8, ::8]
    outside = ~ndimage.binary_dilation(image.tissue, iterations=48)[::8, ::8]
    od = -np.log((rgb.astype(np.float64) + 0.5) / 255.5)
    glass = -np.log(245.5 / 255.5)
    for strength, most in ((0.3, 0.6), (0.4, 0.94)):
        pale = np.rint(255.5 * np.exp(-(glass + (od - glass) * strength)) - 0.5).astype(np.uint8)
        classes = classify_pixels(pale, glass=np.full(3, glass, np.float32), pixel_um=4.0)
        assert (classes[inside] == TISSUE).mean() >= most, strength
        assert (classes[outside] == GLASS).all(), strength


@pytest.mark.parametrize("pixel_um", [0.5, 2.0, 8.0])
def test_ihc_tissue_brown_with_dab_is_tissue(pixel_um: float) -> None:
    """IHC: hematoxylin nuclei and broad, smooth fields of DAB (brown), measured as coarsely as a tile's
    footprint may be; brown is a stain, never a pen."""
    rng = np.random.default_rng(1)
    size = 160
    nuclei = ndimage.gaussian_filter((rng.random((size, size)) < 0.03).astype(float), 1.0) * 6
    glands = ndimage.gaussian_filter(rng.random((size, size)), 12) > 0.5
    dab = ndimage.gaussian_filter(glands.astype(float), 2) * rng.uniform(0.8, 1.6)
    hematoxylin, diaminobenzidine = np.array([0.65, 0.70, 0.29]), np.array([0.27, 0.57, 0.78])
    od = (0.4 + nuclei[..., None]) * hematoxylin + dab[..., None] * diaminobenzidine  # counterstain, DAB
    rgb = np.clip(np.rint(245 * np.exp(-od)), 0, 255).astype(np.uint8)
    classes = classify_pixels(_on_glass(rgb[48:112, 48:112]), pixel_um=pixel_um)
    assert (classes[16:80, 16:80] == TISSUE).mean() > 0.95
    assert (classes[16:80, 16:80] == INK_PIXEL).mean() < 0.02


def test_dust_and_black_are_not_tissue() -> None:
    image = np.full((64, 64, 3), 245, np.uint8)
    image[20:30, 20:30] = (70, 68, 62)  # a grey-brown speck
    image[40:50, 40:50] = 0  # a black border
    classes = classify_pixels(image)
    assert (classes[20:30, 20:30] == INK_PIXEL).all()
    assert (classes[40:50, 40:50] == INK_PIXEL).all()


def test_fat_enclosed_by_tissue_counts_as_tissue_up_to_the_hole_size() -> None:
    image = np.full((200, 200, 3), 245, np.uint8)
    image[20:180, 20:180] = (215, 150, 200)  # pink tissue ...
    image[60:100, 60:100] = 245  # ... around a fat cell of 40 px
    small = classify_pixels(image, TissueSettings(fill_holes_um=100.0), pixel_um=2.0)  # 80 µm: filled
    assert (small[60:100, 60:100] == TISSUE).all()
    large = classify_pixels(image, TissueSettings(fill_holes_um=40.0), pixel_um=2.0)  # 80 µm > 40 µm
    assert (large[60:100, 60:100] == GLASS).all()
    assert (small[:10] == GLASS).all()  # glass reaching the edge is never a hole


@pytest.fixture(scope="module")
def marked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    slide = synthesize_marked_slide((768, 768), seed=11, mpp=2.0, lab="C", lesions=1, inks=("blue", "red"))
    path = tmp_path_factory.mktemp("marked") / "marked.tif"
    write_pyramid(path, downsample_pyramid(slide.rgb, 4), mpp=2.0, flavour="tiff")
    return path, slide


def _tiles(slide: object, coords: np.ndarray, size0: int) -> dict[str, np.ndarray]:
    boxes = footprints(coords, size0, 1.0, slide.tissue.shape)  # type: ignore[attr-defined]
    return {k: box_means(getattr(slide, k), boxes) for k in ("tissue", "ink", "dust", "blur")}


def test_grid_keeps_tissue_and_leaves_out_ink_on_a_marked_slide(marked: tuple[Path, object]) -> None:
    path, slide = marked
    with open_slide(path) as opened:
        every = TileGrid.from_slide(opened, 64, target_mpp=0.5, filter="none", tissue=GREYSCALE_RULE)
        before = TileGrid.from_slide(opened, 64, target_mpp=0.5, tissue=GREYSCALE_RULE)
        after = TileGrid.from_slide(opened, 64, target_mpp=0.5)
    truth = _tiles(slide, every.coords, every.tile_size_level0)
    ink_on_glass = (truth["ink"] >= 0.6) & (truth["tissue"] <= 0.05)
    clean = (truth["tissue"] >= 0.9) & (truth["ink"] == 0) & (truth["dust"] == 0) & (truth["blur"] == 0)
    assert ink_on_glass.sum() > 100
    assert clean.sum() > 300

    def kept(grid: TileGrid) -> np.ndarray:
        rows = {tuple(c) for c in grid.coords.tolist()}
        return np.array([tuple(c) in rows for c in every.coords.tolist()])

    assert kept(before)[ink_on_glass].mean() > 0.95  # the greyscale rule took ink for tissue
    assert kept(after)[ink_on_glass].mean() <= 0.08
    assert kept(after)[clean].mean() >= 0.93
    # the ink left out is named as such, with the check's counts
    reasons = dict(zip(map(tuple, after.rejected.tolist()), after.rejected_reason.tolist(), strict=True))
    assert (
        sum(reasons.get(tuple(c)) == INK for c in every.coords[ink_on_glass].tolist())
        > 0.9 * ink_on_glass.sum()
    )
    assert after.check.kept == len(after)
    assert after.check.ink == int((after.rejected_reason == INK).sum())
    assert after.check.tiles == len(every)
    assert 0.1 < after.check.tissue_fraction < 0.6
    assert after.check.ink_fraction > 0.1


@pytest.fixture(scope="module")
def half_blurred(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 768² slide at 0.5 µm/px whose right half is out of focus (Gaussian blur of 2 µm)."""
    image = synthesize_slide((768, 768), lesions=1, seed=21)
    rgb = image.rgb.copy()
    right = rgb[:, 384:].astype(np.float32)
    rgb[:, 384:] = np.rint(np.stack([ndimage.gaussian_filter(right[..., c], 4.0) for c in range(3)], -1))
    path = tmp_path_factory.mktemp("blur") / "half-blurred.tif"
    write_pyramid(path, downsample_pyramid(rgb, 3), mpp=0.5, flavour="tiff")
    return path


def test_blurred_tiles_are_measured_and_left_out_only_when_asked(half_blurred: Path, tmp_path: Path) -> None:
    with open_slide(half_blurred) as opened:
        kept = TileGrid.from_slide(opened, 64, target_mpp=0.5)
        dropped = TileGrid.from_slide(opened, 64, target_mpp=0.5, tissue=TissueSettings(exclude_blurred=True))
    blurred, sharp = kept.coords[:, 0] >= 384 + 32, kept.coords[:, 0] + 64 <= 384 - 32
    assert blurred.sum() >= 10
    assert sharp.sum() >= 10
    flagged = kept.sharpness < TissueSettings().min_sharpness
    assert flagged[blurred].mean() > 0.9
    assert flagged[sharp].mean() < 0.05
    assert kept.check.blurred == int(flagged.sum()) > 0
    assert not kept.check.blur_excluded
    assert len(dropped) == len(kept) - kept.check.blurred
    assert int((dropped.rejected_reason == BLUR).sum()) == kept.check.blurred
    assert dropped.check.blurred_fraction == pytest.approx(kept.check.blurred_fraction)
    # a saved grid keeps what was left out and why
    loaded = TileGrid.load(dropped.save(tmp_path / "grid"))
    np.testing.assert_array_equal(loaded.rejected, dropped.rejected)
    np.testing.assert_array_equal(loaded.rejected_reason, dropped.rejected_reason)
    np.testing.assert_allclose(loaded.sharpness, dropped.sharpness)
    assert loaded.check == dropped.check
    assert loaded.tissue_settings == dropped.tissue_settings


def test_data_settings_make_the_tissue_settings() -> None:
    data = DataConfig(
        reject_ink=False, exclude_blurred=True, min_sharpness=0.3, exclude_classes="Necrosis, Pen*"
    )
    assert data.tissue == TissueSettings(
        reject_ink=False,
        fill_holes_um=0.0,
        min_sharpness=0.3,
        exclude_blurred=True,
        exclude_classes=("Necrosis", "Pen*"),
    )
    assert DataConfig().tissue == TissueSettings()


@pytest.mark.parametrize(("mpp", "sigma"), [(4.0, 1.5), (2.0, 3.0)])
def test_dye_films_measured_near_candidates_equal_the_whole_image_measure(mpp: float, sigma: float) -> None:
    """Texture and votes are measured only around the pixels that could be ink, group by group: pixel for
    pixel what measuring the whole image gives, with stray candidates scattered in the tissue, strokes and
    the image's edges (a group's box cut off by them)."""
    from bigslide.tiling.ink import _films, colour_texture, dye_films
    from bigslide.tiling.pixel_classes import optical_density
    from bigslide.tiling.tissue import glass_od

    slide = synthesize_marked_slide((640, 512), seed=29, mpp=mpp, aggregates=1)
    od = np.maximum(optical_density(slide.rgb) - glass_od(slide.rgb), 0)
    total = od.sum(axis=-1)
    candidate = (total >= 0.3) & (od[..., 2] >= 0.6 * od[..., 1])
    stray = np.random.default_rng(0).random(candidate.shape) < 0.002
    candidate |= stray & slide.tissue
    candidate[:3, :40] = candidate[-5:, -7:] = True
    # the texture threshold at the candidates' median texture: a window cut short flips pixels
    threshold = float(np.median(colour_texture(od, sigma)[candidate]))
    settings = TissueSettings(ink_texture=threshold)
    whole = _films(od, candidate, settings, sigma)
    assert whole.sum() > 1000  # both outcomes occur
    assert (candidate & ~whole).sum() > 100
    np.testing.assert_array_equal(dye_films(od, candidate, settings, sigma), whole)
