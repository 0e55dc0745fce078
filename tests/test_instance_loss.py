"""Teaching annotations add a loss on annotated tiles: ABMIL-ACC still gives the exact full-bag gradient of
bag loss + instance loss, chunk by chunk, and every bag method learns from it or says why it cannot."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from bigslide.errors import ConfigError
from bigslide.memory.stepper import OptimStepper
from bigslide.methods import get_method
from bigslide.methods.abmil_acc import ABMILACC, ABMILACCParams, accumulated_bag_backward
from bigslide.methods.base import Batch, ModelSpec
from bigslide.methods.instances import InstanceTerm
from bigslide.methods.mil import bn_policy
from bigslide.methods.mil_baselines import full_bag_backward
from bigslide.nn.mil import make_aggregator
from bigslide.nn.mil.base import batch_loss
from tests.test_abmil_acc import (
    BAG,
    CHUNK,
    ENCODERS,
    FORWARD_CHUNK,
    TOLERANCE,
    _batch,
    _take_grads,
    _worst_relative_error,
)

CLASSES = 3  # instance labels 0..2 are the task's classes, 3 is "Not lesion"
NOT_LESION = CLASSES
# Two bags of BAG tiles: some tiles of each class, some "Not lesion", most unannotated (-1).
LABELS = [-1, 0, 3, -1, -1, 2, 3, 3, -1, 1, 3, -1, -1, 0, 0, -1, -1, -1, 3, -1]
WEIGHT = 0.7


def _setup(
    encoder_name: str, aggregator: str, dtype: torch.dtype, mode: str, bags: int = 1
) -> tuple[nn.Module, nn.Module, nn.Module, torch.Tensor, torch.Tensor, InstanceTerm]:
    factory, tile, stochastic = ENCODERS[encoder_name]
    torch.manual_seed(0)
    encoder = factory().to(dtype).train()
    dropout = 0.2 if stochastic else 0.0
    head = make_aggregator(aggregator, encoder.dim, CLASSES, hidden=16, dropout=dropout).to(dtype).train()
    tiles = nn.Linear(encoder.dim, CLASSES + 1).to(dtype)
    bag = torch.rand(BAG * bags, 3, tile, tile, dtype=dtype)
    labels = torch.tensor(LABELS[: BAG * bags])
    term = InstanceTerm(labels, WEIGHT, mode, NOT_LESION, tiles if mode == "tiles" else None)
    return encoder, head, tiles, bag, torch.tensor([2, 0][:bags]), term


def _written_out_loss(
    head: nn.Module, tiles: nn.Module, z: torch.Tensor, target: torch.Tensor, mode: str, bags: int
) -> torch.Tensor:
    """Bag loss + instance loss of features `z`, written out from the definitions (not `InstanceTerm`)."""
    loss, _, _ = batch_loss(head, z, [BAG] * bags, target)
    labels = torch.tensor(LABELS[: BAG * bags])
    annotated = labels >= 0
    if mode == "tiles":
        instance = F.cross_entropy(tiles(z[annotated]), labels[annotated])
    else:
        lesion = (labels[annotated] != NOT_LESION).to(z.dtype)
        instance = F.binary_cross_entropy_with_logits(head.instance_logits(z[annotated]), lesion)
    return loss + WEIGHT * instance


CASES = [
    pytest.param(encoder, aggregator, mode, dtype, id=f"{encoder}-{aggregator}-{mode}-{str(dtype)[6:]}")
    for encoder in ENCODERS
    for aggregator, mode in (("abmil", "attention"), ("abmil_gated", "tiles"), ("dtfd", "attention"))
    for dtype in (torch.float32, torch.float64)
    # float64 ResNet-18 is slow on CPU: one case (attention), and one float32 case of the tile classifier
    if encoder != "resnet18_bn_eval"
    or (aggregator, dtype) in (("abmil", torch.float64), ("abmil_gated", torch.float32))
] + [pytest.param("groupnorm_no_bn", "transmil", "tiles", torch.float64, id="groupnorm_no_bn-transmil-tiles")]


@pytest.mark.parametrize(("encoder_name", "aggregator", "mode", "dtype"), CASES)
def test_accumulated_gradient_of_bag_and_instance_loss_equals_the_full_bag_gradient(
    encoder_name: str, aggregator: str, mode: str, dtype: torch.dtype
) -> None:
    encoder, head, tiles, bag, target, term = _setup(encoder_name, aggregator, dtype, mode)
    # Truth: one graph over the whole bag (the encoder called in the replay's chunk sizes, for the same
    # dropout masks and float32 rounding), the loss written out, one backward.
    torch.manual_seed(7)
    with bn_policy(encoder, "eval", chunked=False):  # exact only with running BatchNorm statistics
        z = torch.cat([encoder(chunk) for chunk in bag.split(CHUNK)])
    truth_loss = _written_out_loss(head, tiles, z, target, mode, bags=1)
    truth_loss.backward()
    truth = _take_grads(encoder, head, tiles)

    torch.manual_seed(7)
    step = accumulated_bag_backward(
        encoder, head, bag, target, chunk_size=CHUNK, forward_chunk_size=FORWARD_CHUNK, instance=term
    )
    acc = _take_grads(encoder, head, tiles)
    assert float(step.loss) == pytest.approx(float(truth_loss.detach()), rel=TOLERANCE[dtype])
    assert _worst_relative_error(truth, acc) <= TOLERANCE[dtype]
    # the tile classifier gets a gradient only when it is what the annotations teach, and exactly once
    assert (acc["2.weight"] is not None) == (mode == "tiles")


@pytest.mark.parametrize("mode", ["attention", "tiles"])
def test_a_batch_of_bags_with_annotated_tiles_in_each_is_exact(mode: str) -> None:
    encoder, head, tiles, bag, target, term = _setup("groupnorm_no_bn", "abmil", torch.float64, mode, bags=2)
    z = torch.cat([encoder(chunk) for chunk in bag.split(CHUNK)])
    _written_out_loss(head, tiles, z, target, mode, bags=2).backward()
    truth = _take_grads(encoder, head, tiles)
    accumulated_bag_backward(
        encoder, head, bag, target, chunk_size=CHUNK, sizes=[BAG, BAG], instance=term, forward_chunk_size=7
    )
    assert _worst_relative_error(truth, _take_grads(encoder, head, tiles)) <= 1e-10
    full_bag_backward(encoder, head, bag, target, sizes=[BAG, BAG], instance=term, encode_chunk_size=CHUNK)
    assert _worst_relative_error(truth, _take_grads(encoder, head, tiles)) <= 1e-10


@pytest.mark.parametrize("mode", ["attention", "tiles"])
def test_the_instance_term_changes_the_encoder_gradient(mode: str) -> None:
    encoder, head, tiles, bag, target, term = _setup("groupnorm_no_bn", "abmil", torch.float64, mode)
    accumulated_bag_backward(encoder, head, bag, target, chunk_size=CHUNK)
    without = _take_grads(encoder, head, tiles)
    accumulated_bag_backward(encoder, head, bag, target, chunk_size=CHUNK, instance=term)
    taught = _take_grads(encoder, head, tiles)
    encoder_keys = [k for k in without if k.startswith("0.") and without[k] is not None]
    change = max(float((taught[k] - without[k]).norm() / without[k].norm()) for k in encoder_keys)  # type: ignore[operator]
    assert change > 0.01  # far above the 1e-10 the exactness tests allow


def _taught_batch(n: int, labels: list[int]) -> Batch:
    """A bag whose lesion tiles (label 0) are bright and "Not lesion" tiles (label 2) dark, so that even
    frozen random features tell them apart."""
    batch = _batch(n, 1, seed=5)
    batch.x[torch.tensor(labels) == 0] = 0.5 + 0.5 * batch.x[torch.tensor(labels) == 0]
    batch.x[torch.tensor(labels) == 2] *= 0.5
    batch.instance_labels = torch.tensor(labels)
    return batch


def _method(name: str, mode: str, **params: object) -> object:
    spec = ModelSpec(backbone="test_resnet", num_classes=2, instance_loss=mode, instance_weight=1.0)
    torch.manual_seed(0)
    cls = get_method(name)
    return cls(cls.Params(hidden=16, **params), spec, torch.device("cpu"))


@pytest.mark.parametrize(
    ("name", "mode", "params"),
    [
        ("abmil_acc", "attention", {"chunk_size": 4}),
        ("abmil_acc", "tiles", {"chunk_size": 4, "aggregator": "transmil"}),
        ("full_bag", "attention", {}),
        ("frozen_abmil", "attention", {}),
        ("biglayer_mil", "tiles", {"stages": 1}),
        ("biglayer_mil", "attention", {"stages": 1}),
    ],
)
def test_every_bag_method_learns_from_annotated_tiles(
    name: str, mode: str, params: dict[str, object]
) -> None:
    """A step with annotated tiles moves what the annotations teach: annotated lesion tiles' attention
    scores rise against "Not lesion" ones (attention), or the tile classifier learns them (tiles)."""
    method = _method(name, mode, **params)
    method.check_instances()  # type: ignore[attr-defined]
    labels = [0, 2, -1, 0, 2, -1, -1, 0, 2, -1, -1, -1]
    batch = _taught_batch(12, labels)
    model = method.model  # type: ignore[attr-defined]
    stepper = OptimStepper(
        torch.optim.Adam(method.trainable_parameters(), lr=1e-2 if name == "frozen_abmil" else 2e-3)
    )  # type: ignore[attr-defined]
    x = batch.x.float()

    def instance_loss() -> float:
        with torch.no_grad():
            z = model.encoder(x)
            lesion = torch.tensor([label == 0 for label in labels])
            annotated = torch.tensor([label >= 0 for label in labels])
            if mode == "tiles":
                return float(F.cross_entropy(model.tiles(z[annotated]), torch.tensor(labels)[annotated]))
            scores = model.aggregator.instance_logits(z[annotated])
            return float(F.binary_cross_entropy_with_logits(scores, lesion[annotated].double().float()))

    model.eval()  # measured with the running BatchNorm statistics before and after
    before = instance_loss()
    model.train()
    for _ in range(3):
        method.train_step(batch, stepper)  # type: ignore[attr-defined]
    model.eval()
    assert instance_loss() < before - 1e-3


def test_methods_that_cannot_learn_from_annotated_tiles_say_why() -> None:
    with pytest.raises(ConfigError, match=r"TransMIL.*tiles through self-attention.*instance_loss: tiles"):
        _method("abmil_acc", "attention", aggregator="transmil").check_instances()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"frozen.*instance_loss: attention"):
        _method("frozen_abmil", "tiles").check_instances()  # type: ignore[attr-defined]
    image = get_method("full_image")
    spec = ModelSpec(backbone="test_resnet", num_classes=2, instance_loss="attention", instance_weight=1.0)
    with pytest.raises(ConfigError, match=r"does not learn from annotated tiles.*instance_weight: 0"):
        image(image.Params(), spec, torch.device("cpu")).check_instances()


def test_the_tile_classifier_draws_a_lesion_map_and_attention_mode_adds_no_parameters() -> None:
    tiles = _method("abmil_acc", "tiles", chunk_size=4)
    attention = _method("abmil_acc", "attention", chunk_size=4)
    plain = ABMILACC(ABMILACCParams(hidden=16), ModelSpec(backbone="test_resnet"), torch.device("cpu"))
    assert set(attention.model.state_dict()) == set(plain.model.state_dict())  # type: ignore[attr-defined]
    assert {k for k in tiles.model.state_dict() if k.startswith("tiles.")} == {"tiles.weight", "tiles.bias"}  # type: ignore[attr-defined]
    tiles.model.eval()  # type: ignore[attr-defined]
    prediction = tiles.predict(_batch(6, 0, seed=1).samples[0])  # type: ignore[attr-defined]
    lesion = prediction.instance_maps["lesion"]
    assert lesion.shape == (6,)
    assert ((lesion >= 0) & (lesion <= 1)).all()
