"""Stain colour: torch colour deconvolution against scikit-image, the per-slide stain augmentation, and
stain normalisation of a second lab's rendering of the same tissue."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from skimage import color

from bigslide.data.bags import BagDataset
from bigslide.data.colour import SampleStain, row_colour
from bigslide.data.config import DataConfig
from bigslide.data.sample import Sample, as_float, to_device
from bigslide.data.stain import draw_stain_jitter, hed_to_rgb, rgb_to_hed
from bigslide.data.stain_norm import BUNDLED_REFERENCES, fit_stain, stain_reference
from bigslide.data.table import SlideTable
from bigslide.errors import ConfigError, DataError
from bigslide.methods.abmil_acc import accumulated_bag_backward
from bigslide.methods.mil_baselines import full_bag_backward
from bigslide.nn.backbones import create_encoder
from bigslide.nn.mil import make_aggregator
from bigslide.synthetic.slide_set import make_slide_set
from bigslide.synthetic.slides import synthesize_slide


@pytest.fixture(scope="module")
def labs() -> dict[str, np.ndarray]:
    """One tissue (with a lesion) rendered by labs A, B and C, and another lab-A slide."""
    a = synthesize_slide((384, 384), lesions=1, seed=5, lab="A")
    b = synthesize_slide((384, 384), lesions=1, seed=5, lab="B")
    c = synthesize_slide((384, 384), lesions=1, seed=5, lab="C")
    other = synthesize_slide((384, 384), lesions=1, seed=9, lab="A")
    for shifted in (b, c):
        assert (a.lesion_mask == shifted.lesion_mask).all()
        assert (a.tissue == shifted.tissue).all()
    return {"A": a.rgb, "B": b.rgb, "C": c.rgb, "other": other.rgb, "tissue": a.tissue}


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("stain-slides"), n_slides=3, size=(384, 384), seed=2)


def test_an_unknown_lab_is_named() -> None:
    with pytest.raises(DataError, match="lab='Z'"):
        synthesize_slide((64, 64), lesions=0, seed=0, lab="Z")


def test_torch_hed_matches_scikit_image() -> None:
    rgb = np.random.default_rng(0).random((500, 3))
    rgb[:5] = [[0, 0, 0], [1, 1, 1], [1, 0, 0], [0, 1, 0.5], [1e-7, 0.3, 1]]  # clamps at both ends
    hed = rgb_to_hed(torch.from_numpy(rgb).double()).numpy()
    np.testing.assert_allclose(hed, color.rgb2hed(rgb), atol=1e-6)
    np.testing.assert_allclose(hed_to_rgb(torch.from_numpy(hed)).numpy(), color.hed2rgb(hed), atol=1e-6)
    # channel-first batches, as tiles are
    tiles = torch.from_numpy(rgb[:48].reshape(2, 4, 6, 3)).permute(0, 3, 1, 2)
    expected = color.rgb2hed(rgb[:48].reshape(2, 4, 6, 3))
    np.testing.assert_allclose(rgb_to_hed(tiles, 1).permute(0, 2, 3, 1).numpy(), expected, atol=1e-6)


def _bag_sample(x: torch.Tensor, seed: int | None, slide: str = "s") -> Sample:
    jitter = draw_stain_jitter(np.random.default_rng(seed)) if seed is not None else None
    coords = np.zeros((x.shape[0], 2))
    return Sample(x=x, y=0, slide=slide, coords=coords, stain=SampleStain(jitter=jitter))


def test_augmentation_is_one_draw_per_slide_and_chunks_agree() -> None:
    tile = torch.randint(0, 256, (1, 3, 8, 8), dtype=torch.uint8)
    bag = tile.repeat(5, 1, 1, 1)  # five copies of one tile
    samples = [_bag_sample(bag, 1, "a"), _bag_sample(bag.clone(), 2, "b")]
    colour = row_colour(samples, None)
    assert colour is not None
    assert colour.random
    x = torch.cat([bag, bag])
    out = as_float(x, colour)
    first, second = out[:5], out[5:]
    assert torch.equal(first, first[:1].expand_as(first))  # the same map for every tile of a slide
    assert torch.equal(second, second[:1].expand_as(second))
    assert (first[0] - second[0]).abs().max() > 0.01  # another slide, another draw
    assert (first[0] - as_float(tile[0])).abs().max() > 0.01  # and it does change the colours
    # ABMIL-ACC moves a bag chunk by chunk: a chunk's maps are its rows' maps
    chunks = torch.cat([to_device(x[s : s + 3], "cpu", colour[s : s + 3]) for s in range(0, 10, 3)])
    assert torch.equal(chunks, out)


def test_zero_strength_is_the_identity() -> None:
    x = torch.randint(1, 256, (2, 3, 8, 8), dtype=torch.uint8)
    sample = Sample(x=x, y=0, slide="s", coords=np.zeros((2, 2)))
    sample.stain = SampleStain(jitter=draw_stain_jitter(np.random.default_rng(0), strength=0.0))
    out = as_float(x, row_colour([sample], None))
    assert (out - as_float(x)).abs().max() < 1e-5


def test_dataset_draws_from_seed_epoch_and_slide_and_off_leaves_pixels_alone(slide_csv: Path) -> None:
    table = SlideTable.from_csv(slide_csv)

    def bags(strength: float, seed: int = 0) -> BagDataset:
        return BagDataset(table, tile_size=32, bag_size=4, seed=seed, stain_augment=strength)

    on, again, other_seed, off = bags(1.0), bags(1.0), bags(1.0, seed=1), bags(0.0)
    draw = on[0].stain.jitter  # type: ignore[union-attr]
    assert draw is not None
    np.testing.assert_array_equal(draw.log_matrix, again[0].stain.jitter.log_matrix)  # type: ignore[union-attr]
    assert not np.allclose(draw.log_matrix, on[1].stain.jitter.log_matrix)  # type: ignore[union-attr]
    assert not np.allclose(draw.log_matrix, other_seed[0].stain.jitter.log_matrix)  # type: ignore[union-attr]
    on.set_epoch(1)
    assert not np.allclose(draw.log_matrix, on[0].stain.jitter.log_matrix)  # type: ignore[union-attr]
    # off: no stain on the sample, no map, the model gets exactly the scaled pixels
    sample = off[0]
    assert sample.stain is None
    assert row_colour([sample], None) is None
    assert torch.equal(to_device(sample.x, "cpu", None), sample.x.float() / 255)


def _delta_e(x: np.ndarray, y: np.ndarray, mask: np.ndarray) -> float:
    return float(np.linalg.norm(color.rgb2lab(x) - color.rgb2lab(y), axis=-1)[mask].mean())


@pytest.mark.parametrize(("method", "most"), [("macenko", 0.25), ("reinhard", 0.5)])
def test_normalisation_maps_lab_b_close_to_lab_a(
    labs: dict[str, np.ndarray], method: str, most: float
) -> None:
    reference = fit_stain(method, labs["other"])  # another lab-A slide
    out = {}
    for lab in ("A", "B"):
        x = torch.from_numpy(labs[lab]).permute(2, 0, 1).contiguous()
        sample = Sample(x=x, y=0, slide=lab, stain=SampleStain(source=fit_stain(method, labs[lab])))
        mapped = as_float(x, row_colour([sample], reference))
        out[lab] = (mapped.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    before = _delta_e(labs["B"], labs["A"], labs["tissue"])
    after = _delta_e(out["B"], out["A"], labs["tissue"])
    assert before > 8  # lab B looks clearly different (mean ΔE over the tissue)
    assert after < most * before, (before, after)


def test_bundled_reference_is_lab_a_stain(labs: dict[str, np.ndarray]) -> None:
    fitted = fit_stain("macenko", labs["A"])
    bundled = BUNDLED_REFERENCES["macenko"]
    cosines = (fitted.values["vectors"] * bundled.values["vectors"]).sum(axis=0)
    assert cosines.min() > 0.97  # the same stain vectors to within ~14°


def test_abmil_acc_gradient_is_exact_with_stain_maps() -> None:
    torch.manual_seed(0)
    encoder = create_encoder("test_resnet").eval()
    aggregator = make_aggregator("abmil", encoder.dim, 2, hidden=8, attention_dim=4)
    bag = torch.randint(0, 256, (7, 3, 16, 16), dtype=torch.uint8)
    sample = _bag_sample(bag, 3)
    sample.stain = SampleStain(source=fit_stain("macenko", _he_pixels()), jitter=sample.stain.jitter)  # type: ignore[union-attr]
    colour = row_colour([sample], BUNDLED_REFERENCES["macenko"])
    target = torch.tensor([1])

    def grads() -> list[torch.Tensor]:
        out = [
            p.grad.clone() for p in [*encoder.parameters(), *aggregator.parameters()] if p.grad is not None
        ]
        encoder.zero_grad()
        aggregator.zero_grad()
        return out

    full_bag_backward(encoder, aggregator, as_float(bag, colour), target)
    expected = grads()
    accumulated_bag_backward(encoder, aggregator, bag, target, chunk_size=3, colour=colour)
    for got, want in zip(grads(), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def _he_pixels() -> np.ndarray:
    return synthesize_slide((128, 128), lesions=0, seed=1).rgb


def test_config_errors_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.stain_normalise"):
        DataConfig(stain_normalise="vahadane")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"data\.stain_augment_strength"):
        DataConfig(stain_augment_strength=-1)
    with pytest.raises(ConfigError, match=r"data\.stain_reference"):
        DataConfig(stain_reference="ref.svs")  # without a normalisation
    missing = tmp_path / "nowhere.svs"
    with pytest.raises(ConfigError, match=re.escape(f"data.stain_reference: {missing}: no such slide file")):
        stain_reference("macenko", str(missing), tile_size=32, target_mpp=0.5)
    not_a_slide = tmp_path / "notes.svs"
    not_a_slide.write_text("not a slide")
    with pytest.raises(Exception, match=r"notes\.svs"):
        stain_reference("reinhard", str(not_a_slide), tile_size=32, target_mpp=0.5)
