"""Pens of any colour on the glass: with `ink_flatness` set (the default), a flat film of one hue lying on
open glass is ink whatever its colour (the pink and violet pens H&E's own colours hide), and tissue beside
it is kept; `ink_flatness: 0` is the rule without films."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage
from skimage import data as skdata

from bigslide.bench.tissue import Scan, scanned_levels
from bigslide.data.config import DataConfig
from bigslide.errors import DataError
from bigslide.synthetic.marks import FAMILIES, Pen, random_pen, synthesize_marked_slide
from bigslide.synthetic.pyramid import downsample_pyramid, write_pyramid
from bigslide.synthetic.slides import synthesize_slide
from bigslide.tiling import films
from bigslide.tiling.grid import INK as INK_TILE
from bigslide.tiling.grid import TileGrid
from bigslide.tiling.pixel_classes import INK, PEN_FLATNESS, TISSUE, TissueSettings
from bigslide.tiling.tissue import block_mean, classify_pixels
from bigslide.wsi.slide import open_slide
from tests.conftest import MakeSlide

FILMS = TissueSettings(ink_flatness=PEN_FLATNESS)
NO_FILMS = TissueSettings(ink_flatness=0.0)


def _pixels(family: str, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A marked slide at 4 µm/px drawn with two random pens of `family`; its classes with and without
    films, ink lying on the glass and clean tissue away from every mark."""
    rng = np.random.default_rng([404, index])
    pens = tuple(random_pen(family, rng) for _ in range(2))
    slide = synthesize_marked_slide((512, 512), seed=40 + index, mpp=4.0, inks=pens)
    assert slide.pen is not None
    assert set(np.unique(slide.pen)) <= {-1, 0, 1}
    near_tissue = ndimage.binary_dilation(slide.tissue, iterations=3)
    on_glass = slide.ink & ~near_tissue
    marks = ndimage.binary_dilation(slide.ink | slide.dust, iterations=3)
    clean = ndimage.binary_erosion(slide.tissue, iterations=3) & ~marks & ~slide.blur
    films = classify_pixels(slide.rgb, FILMS, pixel_um=4.0)
    no_films = classify_pixels(slide.rgb, NO_FILMS, pixel_um=4.0)
    return films, no_films, on_glass, clean


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pens_of_every_family_on_glass_are_ink_and_the_tissue_is_kept(family: str) -> None:
    films, no_films, on_glass, clean = _pixels(family, list(FAMILIES).index(family))
    assert on_glass.sum() > 2000
    assert (films[on_glass] == INK).mean() > 0.85, family
    # the tissue away from the marks keeps what the rule without films keeps
    assert (films[clean] == TISSUE).mean() > (no_films[clean] == TISSUE).mean() - 0.01, family
    # films only add ink: what the rule without films calls ink stays ink
    assert (films[no_films == INK] == INK).all()


def test_a_violet_pen_that_colour_alone_keeps_is_ink_with_films() -> None:
    films, no_films, on_glass, _clean = _pixels("violet", 11)
    assert (no_films[on_glass] == TISSUE).mean() > 0.5  # colour alone: a violet pen is hematoxylin's hue
    assert (films[on_glass] == INK).mean() > 0.85


def test_flat_tissue_inside_the_tissue_is_not_a_film() -> None:
    """A blurred (flat) patch and a pale patch lie among textured tissue, not on glass: they stay tissue."""
    slide = synthesize_marked_slide((512, 512), seed=5, mpp=4.0, inks=("green",))
    films = classify_pixels(slide.rgb, FILMS, pixel_um=4.0)
    no_films = classify_pixels(slide.rgb, NO_FILMS, pixel_um=4.0)
    inside = ndimage.binary_erosion(slide.tissue, iterations=6) & ~ndimage.binary_dilation(
        slide.ink, iterations=6
    )
    for name in ("blur", "pale"):
        part = getattr(slide, name) & inside
        assert part.sum() > 200, name
        assert (films[part] == INK).mean() <= (no_films[part] == INK).mean() + 0.01, name


def test_random_pens_are_drawn_within_their_family_and_reproducibly() -> None:
    for family in FAMILIES:
        pens = [random_pen(family, np.random.default_rng(k)) for k in range(20)]
        assert pens[3] == random_pen(family, np.random.default_rng(3))
        for pen in pens:
            assert isinstance(pen, Pen)
            assert pen.family == family
            assert 80 <= pen.width_um[0] <= 180
            assert 0.3 <= pen.density[1] <= 1.0
    with pytest.raises(DataError, match="family='pink'"):
        random_pen("pink", np.random.default_rng(0))


def test_films_are_a_data_setting_on_by_default() -> None:
    assert DataConfig().tissue == FILMS == TissueSettings()
    assert DataConfig(ink_flatness=0).tissue == NO_FILMS
    assert "flat films on the glass" in FILMS.describe()
    assert "flat films" not in NO_FILMS.describe()


def test_an_ihc_section_on_glass_keeps_what_colour_alone_keeps(make_slide: MakeSlide) -> None:
    """A real IHC image (hematoxylin counterstain and DAB, no eosin) cut round and laid on glass: its flat
    counterstain and DAB fields meet the glass, yet films are looked for only on eosin-stained tissue."""
    tissue = np.tile(skdata.immunohistochemistry(), (2, 2, 1))
    h, w = tissue.shape[:2]
    rows, cols = np.mgrid[:h, :w]
    inside = (rows - h / 2) ** 2 + (cols - w / 2) ** 2 < (0.42 * h) ** 2
    image = np.full((h + 256, w + 256, 3), 240, np.uint8)
    image[128 : 128 + h, 128 : 128 + w][inside] = tissue[inside]
    written = make_slide(image, flavour="tiff", mpp=2.0, n_levels=5, name="ihc-section")
    with open_slide(written.path) as slide:
        default = TileGrid.from_slide(slide, 64, target_mpp=2.0)
        colour = TileGrid.from_slide(slide, 64, target_mpp=2.0, tissue=NO_FILMS)
    assert len(default) > 100
    np.testing.assert_array_equal(default.coords, colour.coords)


@pytest.mark.parametrize(("seed", "lab", "lesions", "edge_decides"), [(7, "A", 1, False), (13, "B", 2, True)])
def test_a_dense_orange_stroke_round_the_tissue_is_ink_to_its_edge(
    seed: int, lab: str, lesions: int, edge_decides: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dense orange-red stroke 180 µm wide drawn round the tissue, scanned (JPEG, focus blur) and read on
    8 µm pixels: its soft edge fills the narrow ring a film's surroundings are judged on. Its hue is one
    no stain makes, so that edge counts with the glass, and the whole stroke is ink. On seed 13 that is
    what decides; on seed 7 the stroke is ink either way."""
    pen = Pen("red", (208, 89, 65), (0.9, 0.97), (180.0, 180.0))
    marked = synthesize_marked_slide(
        (1024, 1024), seed=seed, mpp=2.0, lab=lab, lesions=lesions, inks=(pen,), aggregates=2
    )
    image = scanned_levels(marked.rgb, Scan(80, 0.8))[2]  # 8 µm/px

    def coarse(mask: np.ndarray) -> np.ndarray:
        return block_mean(np.repeat(mask.astype(np.uint8)[..., None] * 255, 3, axis=-1), 4)[..., 0]

    on_glass = (coarse(marked.ink) > 200) & ~ndimage.binary_dilation(coarse(marked.tissue) > 30)
    clean = ndimage.binary_erosion(coarse(marked.tissue) > 200, iterations=2) & ~ndimage.binary_dilation(
        coarse(marked.ink | marked.dust | marked.blur) > 0, iterations=2
    )
    classes = classify_pixels(image, FILMS, pixel_um=8.0)
    monkeypatch.setattr(films, "STAIN_HUES", (0.0, 360.0))  # as if a stain could make every hue
    stain_hued = classify_pixels(image, FILMS, pixel_um=8.0)
    assert on_glass.sum() > 3000
    assert (classes[on_glass] == INK).mean() >= 0.97
    if edge_decides:
        assert (stain_hued[on_glass] == INK).mean() < 0.92
    np.testing.assert_array_equal(classes[clean], stain_hued[clean])  # the tissue keeps its classes


def test_a_pen_crossed_by_a_bubbles_rim_is_ink_inside_the_rim_too() -> None:
    # the rim (dark, ink by colour) closes the glass inside it; that glass is still open glass, which a film
    # must lie on: tissue, not ink, is what makes glass a lumen
    rng = np.random.default_rng([404, 11])
    pens = (random_pen("violet", rng), random_pen("violet", rng))
    slide = synthesize_marked_slide((512, 512), seed=51, mpp=4.0, inks=pens)
    on_glass = slide.ink & ~ndimage.binary_dilation(slide.tissue | slide.dust, iterations=12)
    middle = np.argwhere(ndimage.binary_erosion(on_glass, iterations=4))
    y, x = middle[len(middle) // 2]
    yy, xx = np.ogrid[:512, :512]
    distance = np.hypot(yy - y, xx - x)
    rgb = slide.rgb.copy()
    rgb[(distance >= 34) & (distance < 36)] = 70  # the rim: 280 µm across, a lumen's size
    inside = on_glass & (distance < 30)
    assert inside.sum() > 1000
    classes = classify_pixels(rgb, FILMS, pixel_um=4.0)
    assert (classes[inside] == INK).mean() > 0.85


@pytest.mark.parametrize("where", ["middle", "corner", "none", "scattered"])
def test_thin_ink_opened_on_its_rectangle_equals_the_whole_image_opened(where: str) -> None:
    # the film rule opens the ink (so thin rims do not wall glass in) only around it: the same pixels
    rng = np.random.default_rng(3)
    mask = np.zeros((90, 120), bool)
    if where == "middle":
        mask[30:60, 40:80] = rng.random((30, 40)) > 0.3
    elif where == "corner":
        mask[:12, 100:] = True
        mask[5, 95:] = True
    elif where == "scattered":
        mask = rng.random(mask.shape) > 0.6
    for iterations in (1, 2, 4):
        expected = ndimage.binary_opening(mask, iterations=iterations)
        np.testing.assert_array_equal(films._opened(mask, iterations), expected)


STROMA, STROKE = (1250, 1650, 150, 560), (200, 420, 300, 1800)  # rows, columns at 0.5 µm/px


def _stroma_and_a_light_stroke(path: Path) -> Path:
    """A 0.5 µm/px slide: tissue with a tongue of pale stroma (eosin-pink, sparse nuclei: flat on 8 µm
    pixels) reaching from its edge onto the glass, and a light greyish blue stroke (118, 145, 183 at 0.45
    of its strength, paler than the tissue) on the glass above it."""
    rng = np.random.default_rng(0)
    rgb = synthesize_slide((2048, 2048), lesions=0, seed=3).rgb.copy()
    r0, r1, c0, c1 = STROMA
    stroma = np.array((238, 200, 225), np.float32) + rng.normal(0, 2, (r1 - r0, c1 - c0, 3))
    rows, cols = np.mgrid[0 : r1 - r0, 0 : c1 - c0]
    for y, x in zip(rng.integers(0, r1 - r0, 45), rng.integers(0, c1 - c0, 45), strict=True):
        stroma[(rows - y) ** 2 + (cols - x) ** 2 <= 16] = (120, 80, 160)  # a nucleus 4 µm across
    rgb[r0:r1, c0:c1] = np.clip(stroma, 0, 255).astype(np.uint8)
    r0, r1, c0, c1 = STROKE
    od = -np.log(np.array((118, 145, 183)) / 255.0) * 0.45
    rgb[r0:r1, c0:c1] = np.clip(rgb[100, 100] * np.exp(-od), 0, 255).astype(np.uint8)
    return write_pyramid(path, downsample_pyramid(rgb, 3, 4), mpp=0.5)


def _within(coords: np.ndarray, box: tuple[int, int, int, int], size0: int) -> np.ndarray:
    r0, r1, c0, c1 = box
    x, y = coords[:, 0], coords[:, 1]
    return (x >= c0) & (x + size0 <= c1) & (y >= r0) & (y + size0 <= r1)


def test_pale_stroma_at_the_tissues_edge_is_tissue_and_a_paler_blue_stroke_stays_ink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stroma flat on 8 µm pixels and meeting the glass is paler than the tissue and eosin-pink: not a
    film. A stroke as pale, but blue, still is one."""
    path = _stroma_and_a_light_stroke(tmp_path / "stroma.svs")

    def tiles() -> tuple[int, int, int, int]:
        with open_slide(path) as slide:
            grid = TileGrid.from_slide(slide, 64, target_mpp=1.0)  # 128 px tiles at level 0
        as_ink = grid.rejected[grid.rejected_reason == INK_TILE]
        size0 = grid.tile_size_level0
        return (
            int(_within(grid.coords, STROMA, size0).sum()),
            int(_within(as_ink, STROMA, size0).sum()),
            int(_within(grid.coords, STROKE, size0).sum()),
            int(_within(as_ink, STROKE, size0).sum()),
        )

    assert tiles() == (4, 0, 0, 11)  # the stroma's 4 tiles kept, the stroke's 11 ink
    monkeypatch.setattr(films, "FILM_OVER_TISSUE", 0.0)  # films judged by place and flatness alone
    assert tiles() == (0, 4, 0, 11)  # the stroma was taken for a film
