"""The exactness of the three methods on CUDA, and two training steps of every method there.

`make test-gpu` (`pytest -m cuda`) runs them; where PyTorch sees no CUDA device they are skipped, with
the reason in pytest's summary. BIGSLIDE_TEST_DEVICE=cpu runs them on the CPU instead, to check the tests
themselves on a machine without a GPU.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from bigslide.engine import Loss, train
from bigslide.methods.base import available_methods
from bigslide.nn.big import BigBatchNorm2d, BigConv2d
from bigslide.synthetic.slide_set import make_slide_set
from tests.test_abmil_acc import check_accumulated_gradient
from tests.test_engine import TINY, drain, small_config
from tests.test_patchgd import check_step_is_whole_images_gradient
from tests.test_step_sync import STEPS, prepare

DEVICE = torch.device(os.environ.get("BIGSLIDE_TEST_DEVICE", "cuda"))

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE.type == "cuda" and not torch.cuda.is_available(),
        reason="no CUDA device (torch.cuda.is_available() is False): the CUDA tests need an NVIDIA GPU",
    ),
]


@pytest.fixture(autouse=True)
def deterministic_kernels() -> Iterator[None]:
    """cuDNN's deterministic algorithms: the truth and the method then differ by the method alone."""
    before = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    yield
    torch.backends.cudnn.deterministic = before


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize(
    ("encoder_name", "aggregator_name", "dtype"),
    [
        ("resnet18_bn_eval", "abmil", torch.float32),
        ("resnet18_bn_eval", "abmil", torch.float64),
        ("dropout_droppath", "abmil_gated", torch.float64),
    ],
)
def test_abmil_acc_gives_the_full_bag_gradient(
    encoder_name: str, aggregator_name: str, dtype: torch.dtype, channels_last: bool
) -> None:
    check_accumulated_gradient(encoder_name, aggregator_name, dtype, DEVICE, channels_last=channels_last)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_patchgd_step_is_the_whole_images_gradient(channels_last: bool) -> None:
    """Algorithm 1 with inner iterations that cover every patch once: the step's gradient is the whole
    model's, the encoder's share over epsilon."""
    check_step_is_whole_images_gradient("pool", DEVICE, channels_last=channels_last)


def test_big_layers_match_the_native_layers() -> None:
    """A Big-Layer convolution and BatchNorm cut into partitions that fit a small budget give the native
    layers' outputs and gradients in float64."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, 2, 1, bias=True).double().to(DEVICE)
    norm = nn.BatchNorm2d(6).double().to(DEVICE)
    big_conv = BigConv2d.from_native(copy.deepcopy(conv), 24_000)
    big_norm = BigBatchNorm2d.from_native(copy.deepcopy(norm), 24_000)
    x = torch.rand(3, 4, 37, 29, dtype=torch.float64, device=DEVICE)
    x_native, x_big = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = norm(conv(x_native))
    got = big_norm(big_conv(x_big))
    weights = torch.rand_like(want)
    (want * weights).sum().backward()
    (got * weights).sum().backward()
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(x_big.grad, x_native.grad, atol=1e-10, rtol=1e-10)
    for (name, a), b in zip(conv.named_parameters(), big_conv.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-10, rtol=1e-10, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(big_norm.running_mean, norm.running_mean, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("amp", [None, "bf16", "fp16"])
@pytest.mark.parametrize("name", list(STEPS))
def test_a_step_waits_for_the_device_only_when_its_loss_is_read(name: str, amp: str | None) -> None:
    """ABMIL-ACC, the full-bag step and PatchGD run with no host synchronisation: any (a value read, a
    data-dependent shape, a blocking copy) raises under the sync debug mode. Their losses are read
    after it, as the engine does. The first step (cuDNN and allocator set-up) runs before."""
    if DEVICE.type != "cuda":
        pytest.skip("the sync debug mode is CUDA's (tests/test_step_sync.py checks the steps on the CPU)")
    step = prepare(name, DEVICE, amp)
    step()
    torch.cuda.synchronize(DEVICE)
    torch.cuda.set_sync_debug_mode("error")
    try:
        results = [step() for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(math.isfinite(r.loss) for r in results)


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("cuda-slides"), n_slides=6, size=(512, 512), seed=3)


@pytest.mark.parametrize("method", available_methods())
def test_every_method_trains_two_steps(method: str, slide_csv: Path, tmp_path: Path) -> None:
    config = small_config(slide_csv, tmp_path / method, method, **TINY[method])
    config.optim.max_steps = 2
    config.run.device = DEVICE.type
    config.run.tensorboard = False
    events, result = drain(train(config))
    losses = [e.value for e in events if isinstance(e, Loss)]
    assert len(losses) == 2
    assert all(torch.isfinite(torch.tensor(losses)))
    assert result.checkpoint is not None
    assert Path(result.checkpoint).is_file()
