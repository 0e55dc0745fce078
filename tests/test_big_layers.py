"""Big-Layers against the native PyTorch layers: forward, backward and BatchNorm running statistics."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from bigslide.errors import ConfigError
from bigslide.nn.big import BigBatchNorm2d, BigConv2d, plan_partitions, track_device_memory
from bigslide.nn.big.partition import conv_input_rows


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
# The native-match tests run with activations (and conv weights) in the standard and in channels-last
# memory (the layout of a channels-last encoder's host activations).
LAYOUTS = pytest.mark.parametrize(
    "layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "channels_last"]
)


def conv_budget(conv: nn.Conv2d, width: int, rows: int, item: int) -> int:
    """A budget that fits `rows` output rows of one sample: forces row partitions with halos."""
    k_h, s_h, d_h = conv.kernel_size[0], conv.stride[0], conv.dilation[0]
    w_out = (width + 2 * conv.padding[1] - conv.dilation[1] * (conv.kernel_size[1] - 1) - 1) // conv.stride[
        1
    ] + 1
    in_rows = (rows - 1) * s_h + d_h * (k_h - 1) + 1
    params = sum(p.numel() for p in conv.parameters())
    return (
        2 * conv.in_channels * in_rows * width * item
        + conv.out_channels * rows * w_out * item
        + 3 * params * item
    )


# (in, out, kernel, stride, padding, dilation, groups, bias, H, W, rows per partition or None = whole samples)
CONV_CASES = [
    (3, 8, 7, 2, 3, 1, 1, False, 23, 19, 2),  # ResNet stem geometry, odd size
    (4, 6, 3, 1, 1, 1, 1, True, 13, 11, 3),
    (4, 6, 3, 2, 1, 1, 2, True, 14, 9, 4),  # grouped, stride 2, rows not divisible
    (4, 4, 3, 3, 2, 2, 4, True, 19, 9, 1),  # depthwise, dilation 2, stride 3, one row per partition
    (6, 4, 1, 2, 0, 1, 1, False, 9, 10, 2),  # 1x1 downsample
    (2, 5, (5, 3), (1, 2), (0, 1), (2, 1), 1, True, 17, 12, 3),  # rectangular, no row padding
    (4, 6, 3, 1, 1, 1, 1, True, 10, 10, None),  # whole samples grouped under the budget
    (4, 6, 4, 2, 0, 1, 1, True, 11, 9, 2),  # trailing input row unused by any output
]


@LAYOUTS
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", CONV_CASES)
def test_big_conv_matches_native(case: tuple, dtype: torch.dtype, layout: torch.memory_format) -> None:
    c_in, c_out, k, s, p, d, g, bias, h, w, rows = case
    torch.manual_seed(0)
    native = nn.Conv2d(c_in, c_out, k, s, p, d, g, bias).to(dtype).to(memory_format=layout)
    item = torch.empty((), dtype=dtype).element_size()
    budget = conv_budget(native, w, rows, item) if rows else conv_budget(native, w, 40, item) * 2
    big = BigConv2d.from_native(copy.deepcopy(native), budget)
    x = torch.randn(3, c_in, h, w, dtype=dtype).contiguous(memory_format=layout)
    x_native, x_big = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_native = native(x_native)
    with track_device_memory() as meter:
        y_big = big(x_big)
        grad_y = torch.randn_like(y_native)
        y_big.backward(grad_y)
    assert y_big.is_contiguous(memory_format=layout)  # the host activations keep the input's layout
    y_native.backward(grad_y)
    tol = TOL[dtype]
    assert y_big.shape == y_native.shape
    assert rel(y_big, y_native) <= tol
    assert rel(x_big.grad, x_native.grad) <= tol
    assert rel(big.weight.grad, native.weight.grad) <= tol
    if bias:
        assert rel(big.bias.grad, native.bias.grad) <= tol
    expected_parts = 3 * -(-y_native.shape[2] // rows) if rows else 1
    assert meter.partitions == 2 * expected_parts  # forward + backward replay
    assert meter.max_partition_bytes <= budget


@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular"])
def test_big_conv_padding_modes_and_same(padding_mode: str) -> None:
    torch.manual_seed(1)
    for native in (
        nn.Conv2d(3, 4, 3, padding=1, padding_mode=padding_mode).double(),
        nn.Conv2d(3, 4, 4, padding="same").double(),  # asymmetric 'same' padding
    ):
        big = BigConv2d.from_native(copy.deepcopy(native), 12_000)
        x = torch.randn(2, 3, 11, 12, dtype=torch.float64)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = native(xa), big(xb)
        ya.sum().backward()
        yb.sum().backward()
        assert rel(yb, ya) <= 1e-10
        assert rel(xb.grad, xa.grad) <= 1e-10
        assert rel(big.weight.grad, native.weight.grad) <= 1e-10


# (N, C, H, W, rows per partition or None = whole samples, affine, momentum)
NORM_CASES = [
    (3, 5, 13, 11, 2, True, 0.1),
    (2, 4, 7, 9, 1, True, 0.3),
    (4, 3, 6, 5, None, True, 0.1),
    (2, 4, 9, 7, 4, False, 0.1),
    (1, 6, 5, 17, 3, True, None),  # cumulative moving average
]


@LAYOUTS
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", NORM_CASES)
def test_big_batchnorm_matches_native(case: tuple, dtype: torch.dtype, layout: torch.memory_format) -> None:
    n, c, h, w, rows, affine, momentum = case
    torch.manual_seed(2)
    native = nn.BatchNorm2d(c, affine=affine, momentum=momentum).to(dtype)
    if affine:
        nn.init.uniform_(native.weight, 0.5, 1.5)
        nn.init.normal_(native.bias)
    item = 8 if dtype == torch.float64 else 4
    budget = 3 * c * (rows or h * 2) * w * item + 8 * c * item
    big = BigBatchNorm2d.from_native(copy.deepcopy(native), budget)
    tol = TOL[dtype]
    for step, training in enumerate([True, True, False]):
        native.train(training)
        big.train(training)
        x = torch.randn(n, c, h, w, dtype=dtype) * (2 + step) + 3  # offset mean: a naive variance would drift
        x = x.contiguous(memory_format=layout)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        with track_device_memory() as meter:
            yb = big(xb)
            grad_y = torch.randn_like(yb)
            yb.backward(grad_y)
        ya = native(xa)
        ya.backward(grad_y)
        assert rel(yb, ya) <= tol
        assert rel(xb.grad, xa.grad) <= tol
        if affine:
            assert rel(big.weight.grad, native.weight.grad) <= tol
            assert rel(big.bias.grad, native.bias.grad) <= tol
        assert rel(big.running_mean, native.running_mean) <= tol
        assert rel(big.running_var, native.running_var) <= tol
        assert int(big.num_batches_tracked) == int(native.num_batches_tracked)
        assert meter.max_partition_bytes <= budget
        if rows:
            assert meter.partitions >= 2 * n * -(-h // rows)


@pytest.mark.parametrize("offset", [0.0, 1000.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_big_batchnorm_float32_gradients_are_as_accurate_as_native(offset: float, seed: int) -> None:
    """Errors of ∇x, ∇W, ∇b against a float64 truth, big (32 partitions) vs native, both in float32.

    A mean far from zero relative to the spread (activations after a large bias) is where an
    uncentred Σ∇y·x − μΣ∇y loses digits: it was 5-12x native's error at an offset of 1000.
    """
    n, c, h, w, rows = 4, 8, 32, 32, 4
    torch.manual_seed(seed)
    x = (torch.randn(n, c, h, w, dtype=torch.float64) + offset).float()  # values float32 can hold
    grad_y = torch.randn(n, c, h, w)
    truth = nn.BatchNorm2d(c).double()
    nn.init.uniform_(truth.weight, 0.5, 1.5)
    nn.init.normal_(truth.bias)
    native = copy.deepcopy(truth).float()
    big = BigBatchNorm2d.from_native(copy.deepcopy(native), 3 * c * rows * w * 4 + 8 * c * 4)
    grads = {}
    for name, layer, dtype in (("truth", truth, torch.float64), ("native", native, None), ("big", big, None)):
        xr = x.to(dtype or x.dtype).requires_grad_()
        with track_device_memory() as meter:
            layer(xr).backward(grad_y.to(dtype or grad_y.dtype))
        grads[name] = (xr.grad, layer.weight.grad, layer.bias.grad)
        if name == "big":
            assert meter.partitions >= 3 * n * h // rows  # statistics, ∇ sums and ∇x, partition by partition
    for what, expected, got_native, got_big in zip(("∇x", "∇W", "∇b"), *grads.values()):
        native_error = rel(got_native.double(), expected)
        big_error = rel(got_big.double(), expected)
        assert big_error <= 2 * native_error, f"{what}: big {big_error:.2e}, native {native_error:.2e}"


def test_big_batchnorm_rejects_single_value_per_channel_like_native() -> None:
    big = BigBatchNorm2d(3)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        big(torch.randn(1, 3, 1, 1))


def test_state_dicts_load_both_ways() -> None:
    conv, bn = nn.Conv2d(3, 4, 3, bias=True), nn.BatchNorm2d(4)
    big_conv, big_bn = BigConv2d(3, 4, 3, bias=True), BigBatchNorm2d(4)
    bn.running_mean.normal_()
    big_conv.load_state_dict(conv.state_dict())
    big_bn.load_state_dict(bn.state_dict())
    assert torch.equal(big_conv.weight, conv.weight)
    assert torch.equal(big_bn.running_mean, bn.running_mean)
    nn.BatchNorm2d(4).load_state_dict(big_bn.state_dict())
    nn.Conv2d(3, 4, 3).load_state_dict(big_conv.state_dict())


def test_plan_covers_every_output_row_once_with_halos() -> None:
    def cost(samples: int, rows: int) -> int:
        return samples * (rows + 2) * 10

    parts = plan_partitions(
        2, 10, cost, 55, what="test", input_rows=lambda o0, o1: conv_input_rows(o0, o1, 2, 1, 2, 20)
    )
    covered = [(p.b0, r) for p in parts for r in range(p.o0, p.o1)]
    assert sorted(covered) == [(b, r) for b in range(2) for r in range(10)]
    assert all(cost(p.b1 - p.b0, p.o1 - p.o0) <= 55 for p in parts)
    first = parts[0]
    assert (first.i0, first.pad_top) == (0, 1)  # row −1 is padding
    assert first.i1 == (first.o1 - 1) * 2 + 2 + 1 - 1  # halo reaches one row past the stride
    with pytest.raises(ConfigError, match="budget"):
        plan_partitions(1, 10, cost, 20, what="a conv")


def test_autocast_computes_in_the_autocast_dtype_and_keeps_float32_parameter_grads() -> None:
    # CPU autocast stands in for CUDA AMP: the layers ask the compute device's autocast state.
    torch.manual_seed(3)
    native = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))
    big = nn.Sequential(
        BigConv2d.from_native(copy.deepcopy(native[0]), 20_000),
        BigBatchNorm2d.from_native(copy.deepcopy(native[1]), 20_000),
    )
    x = torch.randn(2, 3, 16, 16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ya, yb = native(xa), big(xb)
    assert yb.dtype == ya.dtype == torch.bfloat16
    assert rel(yb.float(), ya.float()) <= 1e-2
    ya.float().square().sum().backward()
    yb.float().square().sum().backward()
    assert big[0].weight.grad.dtype == torch.float32
    assert rel(big[0].weight.grad, native[0].weight.grad) <= 2e-2
    assert rel(xb.grad, xa.grad) <= 2e-2


@pytest.mark.parametrize("case", [CONV_CASES[4], CONV_CASES[7], CONV_CASES[0]])
def test_big_conv_input_gradient_does_not_depend_on_buffer_contents(
    case: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ∇x is stitched into an uninitialised host buffer: rows no partition reads (stride gaps, unused
    # trailing rows) must be zeroed and halo overlaps summed, whatever the buffer held before.
    import bigslide.nn.big.conv as conv_module

    def nan_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, like: object = None):
        return torch.full(shape, float("nan"), dtype=dtype)

    monkeypatch.setattr(conv_module, "host_empty", nan_buffer)
    c_in, c_out, k, s, p, d, g, bias, h, w, rows = case
    torch.manual_seed(4)
    native = nn.Conv2d(c_in, c_out, k, s, p, d, g, bias).double()
    big = BigConv2d.from_native(copy.deepcopy(native), conv_budget(native, w, rows, 8))
    x = torch.randn(2, c_in, h, w, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = native(xa), big(xb)
    grad_y = torch.randn_like(ya)
    ya.backward(grad_y)
    yb.backward(grad_y)
    assert torch.isfinite(xb.grad).all()
    assert rel(yb, ya) <= 1e-10
    assert rel(xb.grad, xa.grad) <= 1e-10


def test_cpu_partitions_are_counted_at_their_slice_size() -> None:
    # On the CPU a partition is a view of the host tensor, yet the meter counts its slice as if it
    # had been copied to a device: the budget keeps the meaning it has on CUDA.
    torch.manual_seed(5)
    conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
    rows, width = 3, 16
    budget = conv_budget(conv, width, rows, 4)
    big = BigConv2d.from_native(conv, budget)
    x = torch.randn(1, 4, 24, width, requires_grad=True)
    with track_device_memory() as meter:
        big(x).sum().backward()
    whole_input = x.numel() * x.element_size()
    assert meter.partitions == 2 * (24 // rows)
    assert 0 < meter.max_tensor_bytes < whole_input  # slices, not the whole host tensor
    assert meter.max_partition_bytes <= budget


def test_bench_fit_recovers_a_known_power_law() -> None:
    from bigslide.bench.biglayer import power_law_fit

    areas = np.repeat(np.array([256, 384, 512, 640, 768, 896, 1024], dtype=float) ** 2, 3)
    a, b, c = 2.5e-6, 1.1, 0.05
    rng = np.random.default_rng(0)
    times = a * areas**b + c
    fit = power_law_fit(areas, times * (1 + 0.01 * rng.standard_normal(areas.shape)))
    assert fit["b"] == pytest.approx(b, abs=0.05)
    # The offset is weakly identified under noise; the fitted curve itself must match the truth.
    sides = np.array([256.0, 640.0, 1024.0])
    predicted = fit["a"] * sides ** (2 * fit["b"]) + fit["c"]
    np.testing.assert_allclose(predicted, a * sides ** (2 * b) + c, rtol=0.05)
    assert fit["r2"] > 0.99
    median_area = 640.0**2
    doubling = (a * (2 * median_area) ** b + c) / (a * median_area**b + c)
    assert fit["doubling"] == pytest.approx(doubling, rel=0.03)


@pytest.fixture
def copies_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device faked on the CPU has no streams: the big layers copy to and from it in order."""
    import bigslide.nn.big.conv as conv_module
    import bigslide.nn.big.norm as norm_module
    from bigslide.nn.big.partition import Transfers

    class InOrder(Transfers):
        def __init__(self, device: torch.device) -> None:
            super().__init__(torch.device("cpu"))
            self.device = device

    monkeypatch.setattr(conv_module, "Transfers", InOrder)
    monkeypatch.setattr(norm_module, "Transfers", InOrder)


@pytest.mark.usefixtures("copies_in_order")
@pytest.mark.parametrize("training", [True, False], ids=["batch-stats", "running-stats"])
def test_big_layers_on_a_device_give_their_output_where_the_native_layers_do(training: bool) -> None:
    """A CUDA device faked on the CPU (FakeTensorMode: shapes, dtypes and devices, no data; ops mixing
    devices raise as on CUDA): a big conv and BatchNorm whose parameters and input are on the device
    return their output there, as the native layers do, so it mixes with the native layers' tensors;
    inside a big stack (host inputs) outputs stay on the host. (The fake device has no backward:
    tests/test_cuda.py checks the gradients on a real GPU.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cuda = torch.device("cuda", 0)
    with FakeTensorMode(allow_non_fake_inputs=True), cuda:
        conv, norm = nn.Conv2d(4, 6, 3, 2, 1), nn.BatchNorm2d(6).train(training)
        big_conv, big_norm = BigConv2d.from_native(conv, 24_000), BigBatchNorm2d.from_native(norm, 24_000)
        x = torch.rand(3, 4, 37, 29)
        want, got = norm(conv(x)), big_norm(big_conv(x))
        assert got.device == want.device == cuda
        assert (got * torch.rand_like(want)).shape == want.shape
        host = big_norm(big_conv(torch.rand(3, 4, 37, 29, device="cpu")))
        assert host.device.type == "cpu"


@pytest.mark.usefixtures("copies_in_order")
@pytest.mark.parametrize(
    "layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "channels_last"]
)
def test_a_big_encoder_on_a_device_takes_a_host_image_and_gives_device_features(
    layout: torch.memory_format,
) -> None:
    """The whole stack on a (faked) CUDA device: host input, host activations in the input's layout
    through the big stages, features on the device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bigslide.nn.backbones import create_encoder
    from bigslide.nn.big import make_big

    cuda = torch.device("cuda", 0)
    encoder = make_big(create_encoder("resnet18"), 2, 2**22).to(memory_format=layout)
    with FakeTensorMode(allow_non_fake_inputs=True):
        encoder = encoder.to(cuda)
        seen: list[torch.Tensor] = []
        encoder.backbone.layer2.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
        with track_device_memory() as meter:  # 256²: the layers' partitions are runs of rows
            features = encoder(torch.rand(1, 3, 256, 256, device="cpu").contiguous(memory_format=layout))
        assert meter.partitions > 2 * 11
        assert features.device == cuda
        assert features.shape == (1, encoder.dim)
        assert seen[0].device.type == "cpu"
        assert seen[0].is_contiguous(memory_format=layout)
