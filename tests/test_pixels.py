"""Datasets give uint8 pixels (a quarter of float32's host memory and transfer); every method scales them
to [0, 1] on its device, so a uint8 sample and its float copy are the same input to the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bigslide.data.sample import Sample, as_float
from bigslide.engine import setup
from bigslide.methods import available_methods, get_method
from tests.test_engine import TINY, small_config
from tests.toy_method import toy_method

__all__ = ["toy_method"]  # the fixture


@pytest.mark.parametrize("method", sorted(TINY))
def test_every_method_sees_uint8_pixels_as_the_same_floats(method: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert set(TINY) == set(available_methods())
    assert get_method(method).takes_uint8
    config = small_config(tmp_path / "none.csv", tmp_path, method, **TINY[method])
    config.model.backbone = "test_resnet"
    torch.manual_seed(0)
    built = setup.build_method(config, ["a", "b"], torch.device("cpu"))
    built.model.eval()
    gen = torch.Generator().manual_seed(1)
    if get_method(method).kind == "bag":
        pixels = torch.randint(0, 256, (6, 3, 32, 32), generator=gen, dtype=torch.uint8)
        coords = np.stack([np.arange(6) * 32, np.zeros(6, np.int64)], axis=1)
        sample = Sample(x=pixels, y=1, slide="s", coords=coords, tile_size_level0=32)
    else:
        pixels = torch.randint(0, 256, (3, 64, 64), generator=gen, dtype=torch.uint8)
        sample = Sample(x=pixels, y=1, slide="s")
    as_uint8 = built.predict(sample)
    sample.slide = "s, as floats"  # a new name: frozen_abmil caches features per slide and tile
    sample.x = as_float(pixels)
    assert sample.x.dtype == torch.float32
    assert float(sample.x.max()) <= 1.0
    as_floats = built.predict(sample)
    np.testing.assert_allclose(as_uint8.probs, as_floats.probs, rtol=0, atol=1e-6)
    # and not merely insensitive to its input: other pixels give another answer
    sample.slide = "s, inverted"
    sample.x = 1 - as_float(pixels)
    assert not np.allclose(built.predict(sample).probs, as_floats.probs, atol=1e-6)


def test_a_method_that_does_not_scale_pixels_gets_floats_from_the_engine(toy_method: type) -> None:
    from bigslide.data.sample import collate
    from bigslide.engine.inference import predict_sample
    from bigslide.methods.base import ModelSpec

    assert not toy_method.takes_uint8  # a script's method written before uint8 samples existed
    torch.manual_seed(0)
    method = toy_method(toy_method.Params(), ModelSpec("test_resnet", num_classes=2), torch.device("cpu"))
    pixels = torch.randint(
        0, 256, (5, 3, 8, 8), generator=torch.Generator().manual_seed(2), dtype=torch.uint8
    )
    coords = np.zeros((5, 2), np.int64)
    sample = Sample(x=pixels, y=0, slide="s", coords=coords, tile_size_level0=8)
    from_uint8 = predict_sample(method, sample)
    from_floats = predict_sample(method, Sample(x=as_float(pixels), y=0, slide="s", coords=coords))
    np.testing.assert_allclose(from_uint8.probs, from_floats.probs, rtol=0, atol=1e-6)
    batch = collate([sample], torch.device("cpu"), uint8=False)
    assert batch.x.dtype == torch.float32
    assert float(batch.x.max()) <= 1.0
