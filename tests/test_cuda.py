"""The exactness of the three methods on CUDA, and two training steps of every method there.

`make test-gpu` (`pytest -m cuda`) runs them; where PyTorch sees no CUDA device they are skipped, with
the reason in pytest's summary. BIGSLIDE_TEST_DEVICE=cpu runs them on the CPU instead, to check the tests
themselves on a machine without a GPU.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bigslide.engine import Loss, train
from bigslide.methods.abmil_acc import bag_backward
from bigslide.methods.base import Batch, available_methods
from bigslide.methods.mil_baselines import full_bag_backward
from bigslide.nn.big import BigBatchNorm2d, BigConv2d
from bigslide.synthetic.slide_set import make_slide_set
from tests.test_abmil_acc import CHUNK, FORWARD_CHUNK, TOLERANCE, _setup, _take_grads, _worst_relative_error
from tests.test_engine import TINY, drain, small_config
from tests.test_patchgd import RecordingStepper, make_method

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


@pytest.mark.parametrize(
    ("encoder_name", "aggregator_name", "dtype"),
    [
        ("resnet18_bn_eval", "abmil", torch.float32),
        ("resnet18_bn_eval", "abmil", torch.float64),
        ("dropout_droppath", "abmil_gated", torch.float64),
    ],
)
def test_abmil_acc_gives_the_full_bag_gradient(
    encoder_name: str, aggregator_name: str, dtype: torch.dtype
) -> None:
    stochastic = encoder_name == "dropout_droppath"
    encoder, head, bag, target = _setup(encoder_name, aggregator_name, dtype, 0.2 if stochastic else 0.0)
    encoder, head, bag, target = encoder.to(DEVICE), head.to(DEVICE), bag.to(DEVICE), target.to(DEVICE)
    torch.manual_seed(7)  # seeds the CUDA generators too: dropout masks are drawn there
    truth = full_bag_backward(encoder, head, bag, target, encode_chunk_size=CHUNK)
    truth_grads = _take_grads(encoder, head)
    torch.manual_seed(7)
    loss = bag_backward(encoder, head, bag, target, chunk_size=CHUNK, forward_chunk_size=FORWARD_CHUNK)
    acc_grads = _take_grads(encoder, head)
    assert all(g is None or g.device.type == DEVICE.type for g in acc_grads.values())
    assert float(loss) == pytest.approx(float(truth.loss), rel=TOLERANCE[dtype])
    assert _worst_relative_error(truth_grads, acc_grads) <= TOLERANCE[dtype]


def test_patchgd_step_is_the_whole_images_gradient() -> None:
    """Algorithm 1 with inner iterations that cover every patch once (as on the CPU, in
    tests/test_patchgd.py): the step's gradient is the whole model's, the encoder's share over epsilon."""
    torch.manual_seed(8)
    method = make_method(head="pool", k=2, epsilon=3, head_width=8)
    method.device = DEVICE
    method.model.double().to(DEVICE)
    whole = copy.deepcopy(method.model)
    x = torch.rand(2, 3, 64, 96, dtype=torch.float64, device=DEVICE)
    y = torch.tensor([1, 2], device=DEVICE)
    stepper = RecordingStepper(method.model)
    assert method.train_step(Batch(x, y, []), stepper).optimizer_steps == 1
    patches = x.unfold(2, 32, 32).unfold(3, 32, 32).permute(0, 2, 3, 1, 4, 5).reshape(-1, 3, 32, 32)
    Z = whole.encoder(patches).view(2, 2, 3, -1).permute(0, 3, 1, 2)
    F.cross_entropy(whole.head(Z), y).backward()
    for name, p in whole.named_parameters():
        assert p.grad is not None
        scale = 1 / 3 if name.startswith("encoder.") else 1.0
        torch.testing.assert_close(stepper.grads[0][name], scale * p.grad, atol=1e-10, rtol=1e-8)


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
