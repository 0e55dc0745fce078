"""`make_big` on timm ResNets: same function, same gradients, same state dict as the native model."""

from __future__ import annotations

import copy

import pytest
import timm
import torch
from torch import nn

from bigslide.errors import ConfigError
from bigslide.nn.backbones import Encoder, create_encoder
from bigslide.nn.big import BigBatchNorm2d, BigConv2d, HostReLU, make_big, set_budget, track_device_memory


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def big_layer_count(model: nn.Module) -> int:
    return sum(isinstance(m, BigConv2d | BigBatchNorm2d) for m in model.modules())


@pytest.mark.parametrize(
    ("name", "stages", "budget_mb"),
    [
        ("resnet18", 2, 4.0),  # layer2's 3x3 convs only fit a few rows at a time
        pytest.param("resnet50", 2, 6.0, marks=pytest.mark.slow),
    ],
)
def test_converted_resnet_trains_like_native(name: str, stages: int, budget_mb: float) -> None:
    torch.manual_seed(0)
    native = timm.create_model(name, num_classes=0).double().train()
    budget = int(budget_mb * 2**20)
    big = make_big(copy.deepcopy(native), stages, budget)
    assert list(big.state_dict()) == list(native.state_dict())
    assert big_layer_count(big) == 2 + sum(
        isinstance(m, nn.Conv2d | nn.BatchNorm2d)
        for i in range(1, stages + 1)
        for m in native.get_submodule(f"layer{i}").modules()
    )
    assert type(big.layer3.get_submodule("0.conv1")) is nn.Conv2d  # the tail stays native

    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    x_native, x_big = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_native = native(x_native)
    with track_device_memory() as meter:
        y_big = big(x_big)
        (y_big.square().sum() + y_big.sum()).backward()
    (y_native.square().sum() + y_native.sum()).backward()

    assert rel(y_big, y_native) <= 1e-10
    assert rel(x_big.grad, x_native.grad) <= 1e-10
    native_params = dict(native.named_parameters())
    worst = max(rel(p.grad, native_params[n].grad) for n, p in big.named_parameters())
    assert worst <= 1e-10
    native_buffers = dict(native.named_buffers())
    for n, b in big.named_buffers():
        assert rel(b, native_buffers[n]) <= 1e-10, n  # BN statistics over the whole input
    # The budget holds, and it was tight enough that some layers ran in several partitions.
    assert meter.max_tensor_bytes <= budget
    assert meter.max_partition_bytes <= budget
    assert meter.partitions > 2 * big_layer_count(big)

    native.eval()
    big.eval()
    with torch.no_grad():
        assert rel(big(x), native(x)) <= 1e-10


def test_state_dict_loads_both_ways_and_pretrained_function_is_kept() -> None:
    torch.manual_seed(1)
    native = timm.create_model("resnet18", num_classes=0).eval()
    big = make_big(timm.create_model("resnet18", num_classes=0), 1, 64 * 2**20).eval()
    big.load_state_dict(native.state_dict())  # e.g. ImageNet weights into a big model
    x = torch.rand(1, 3, 48, 48)
    with torch.no_grad():
        assert rel(big(x), native(x)) <= 1e-5
    round_trip = timm.create_model("resnet18", num_classes=0)
    round_trip.load_state_dict(big.state_dict())
    for key, value in round_trip.state_dict().items():
        assert torch.equal(value, native.state_dict()[key]), key


def test_conversion_shares_parameters_and_records_stages() -> None:
    model = timm.create_model("resnet18", num_classes=0)
    params_before = [id(p) for p in model.parameters()]
    make_big(model, 3, 2**24)
    assert [id(p) for p in model.parameters()] == params_before  # an optimizer built earlier still works
    assert model.big_stages == 3
    assert isinstance(model.act1, HostReLU)
    set_budget(model, 12345)
    assert {m.budget_bytes for m in model.modules() if isinstance(m, BigConv2d | BigBatchNorm2d)} == {12345}


def test_encoder_wrapper_is_converted_with_host_normalisation() -> None:
    torch.manual_seed(2)
    native = create_encoder("resnet18").double().train()
    big = make_big(copy.deepcopy(native), 1, 8 * 2**20)
    x = torch.rand(4, 3, 32, 32, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = native(xa), big(xb)
    assert yb.shape == (4, big.dim)
    ya.sum().backward()
    yb.sum().backward()
    assert rel(yb, ya) <= 1e-10
    assert rel(xb.grad, xa.grad) <= 1e-10
    assert list(big.state_dict()) == list(native.state_dict())


def test_a_plain_modules_resnet_returning_its_feature_map_is_converted_before_its_pooling() -> None:
    torch.manual_seed(3)
    trunk = timm.create_model("resnet18", num_classes=0, global_pool="")  # a factory's own model
    native = Encoder(
        nn.Sequential(trunk, nn.AdaptiveAvgPool2d(1), nn.Flatten()), (0.5,) * 3, (0.25,) * 3, 512
    )
    native = native.double().train()
    big = make_big(copy.deepcopy(native), 1, 8 * 2**20)
    x = torch.rand(4, 3, 32, 32, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = native(xa), big(xb)
    ya.sum().backward()
    yb.sum().backward()
    assert any(isinstance(m, BigConv2d) for m in big.modules())
    assert rel(yb, ya) <= 1e-10
    assert rel(xb.grad, xa.grad) <= 1e-10


def test_make_big_rejects_what_it_cannot_convert() -> None:
    with pytest.raises(ConfigError, match="ResNet"):
        make_big(nn.Sequential(nn.Conv2d(3, 4, 3)), 1, 2**20)
    with pytest.raises(ConfigError, match="stages"):
        make_big(timm.create_model("resnet18", num_classes=0), 5, 2**20)
    model = make_big(timm.create_model("resnet18", num_classes=0), 1, 2**18)
    with pytest.raises(ConfigError, match="already"):
        make_big(model, 1, 2**20)
    with pytest.raises(ConfigError, match="budget"):
        model(torch.rand(2, 3, 32, 32))  # 256 KiB cannot hold layer1's weights and their gradients


def test_a_stem_without_batchnorm_asks_for_another_backbone_not_fewer_stages() -> None:
    """The stem is always converted: with a GroupNorm in it, no number of stages keeps it native."""
    with pytest.raises(ConfigError, match=r"bn1 \(GroupNorm\) .* stem of Conv2d, BatchNorm2d"):
        make_big(timm.create_model("resnet50_gn", num_classes=0), 0, 2**20)
