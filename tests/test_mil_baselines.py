"""The baselines: full bag in one graph, and a frozen encoder with a per-tile feature cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bigslide.memory.stepper import OptimStepper
from bigslide.methods.base import Batch, ModelSpec, Sample
from bigslide.methods.mil_baselines import FeatureCache, FrozenABMIL, FrozenParams, FullBag

SPEC = ModelSpec(backbone="test_resnet", num_classes=3)
CPU = torch.device("cpu")


def _batch(n: int, label: int, seed: int, coords: bool = True) -> Batch:
    bag = torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
    xy = np.stack([np.arange(n) * 16, np.full(n, seed * 16)], axis=1).astype(np.int64) if coords else None
    sample = Sample(x=bag, y=label, slide=f"slide{seed}.svs", coords=xy, tile_size_level0=16)
    return Batch(x=bag, y=torch.tensor([label]), samples=[sample])


def _clone_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


class _CountCalls:
    def __init__(self, module: torch.nn.Module) -> None:
        self.tiles = 0
        module.register_forward_hook(self._hook)

    def _hook(self, _module: torch.nn.Module, args: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        self.tiles += args[0].shape[0]


def test_full_bag_trains_encoder_and_head_and_predicts() -> None:
    torch.manual_seed(0)
    method = FullBag(FullBag.Params(aggregator="transmil", hidden=16, heads=2), SPEC, CPU)
    start = _clone_state(method.model)
    stepper = OptimStepper(torch.optim.Adam(method.trainable_parameters(), lr=1e-2))
    method.model.train()
    results = [method.train_step(_batch(9, step % 3, seed=step), stepper) for step in range(3)]
    assert all(np.isfinite(r.loss) and r.logits.shape == (1, 3) for r in results)
    assert stepper.steps == 3
    end = method.model.state_dict()
    for name in ("encoder.backbone.conv1.0.weight", "aggregator.classifier.weight"):
        assert not torch.equal(start[name], end[name]), name
    method.model.eval()
    prediction = method.predict(_batch(6, 0, seed=9).samples[0])
    assert prediction.probs.shape == (3,)
    assert prediction.probs.sum() == pytest.approx(1.0, abs=1e-6)
    assert prediction.instance_scores is not None
    assert prediction.instance_scores.shape == (6,)


def test_frozen_abmil_trains_only_the_head_and_caches_tile_features() -> None:
    torch.manual_seed(0)
    method = FrozenABMIL(FrozenParams(aggregator="abmil_gated", hidden=16), SPEC, CPU)
    encoder, head = method.mil_model.encoder, method.mil_model.aggregator
    encoder_start, head_start = _clone_state(encoder), _clone_state(head)
    assert {id(p) for p in method.trainable_parameters()} == {id(p) for p in head.parameters()}
    calls = _CountCalls(encoder)
    stepper = OptimStepper(torch.optim.Adam(method.trainable_parameters(), lr=1e-2))
    method.model.train()  # as the engine does; the frozen encoder must stay in eval mode

    losses = [method.train_step(_batch(8, 1, seed=1), stepper).loss for _ in range(3)]
    assert all(np.isfinite(losses))
    assert calls.tiles == 8  # encoded once, then served from the cache
    assert len(method.cache) == 8
    for name, value in encoder.state_dict().items():  # weights and BatchNorm running statistics
        torch.testing.assert_close(value, encoder_start[name], rtol=0, atol=0, msg=name)
    assert not torch.equal(head.state_dict()["classifier.weight"], head_start["classifier.weight"])

    # Cached features are the eval-mode encoder's features.
    bag = _batch(8, 1, seed=1).x
    with torch.no_grad():
        expected = encoder.eval()(bag)
    torch.testing.assert_close(method.features(_batch(8, 1, seed=1).samples[0], bag), expected)

    method.model.eval()
    prediction = method.predict(_batch(8, 1, seed=1).samples[0])
    assert calls.tiles == 8 + 8  # the check above encoded once; prediction is cached
    assert prediction.probs.shape == (3,)
    assert prediction.probs.sum() == pytest.approx(1.0, abs=1e-6)
    assert prediction.instance_scores is not None
    assert prediction.instance_scores.shape == (8,)


@pytest.mark.parametrize(("cache_features", "coords"), [(False, True), (True, False)])
def test_frozen_abmil_encodes_every_step_without_cache_or_coords(cache_features: bool, coords: bool) -> None:
    torch.manual_seed(0)
    method = FrozenABMIL(FrozenParams(hidden=16, cache_features=cache_features), SPEC, CPU)
    calls = _CountCalls(method.mil_model.encoder)
    stepper = OptimStepper(torch.optim.SGD(method.trainable_parameters(), lr=0.1))
    for _ in range(2):
        method.train_step(_batch(5, 0, seed=2, coords=coords), stepper)
    assert calls.tiles == 10
    assert len(method.cache) == 0


def test_feature_cache_is_bounded_and_least_recently_used() -> None:
    row = torch.zeros(4)  # 16 bytes
    cache = FeatureCache(max_bytes=3 * 16)
    for i in range(3):
        cache.put(("s", i), row + i)
    assert cache.get(("s", 0)) is not None  # now the most recent
    cache.put(("s", 3), row + 3)
    assert len(cache) == 3
    assert cache.bytes == 48
    assert cache.get(("s", 1)) is None  # the least recently used went
    got = cache.get(("s", 0))
    assert got is not None
    assert float(got[0]) == 0.0
    cache.put(("s", 0), row + 7)  # replacing keeps the byte count right
    assert cache.bytes == 48
