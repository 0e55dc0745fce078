"""ABMIL-ACC gives the full-bag gradient of every encoder and head parameter, chunk by chunk."""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from timm.layers import DropPath
from torch import nn

from bigslide.memory.stepper import OptimStepper
from bigslide.methods import replay
from bigslide.methods.abmil_acc import ABMILACC, ABMILACCParams, accumulated_bag_backward, bag_backward
from bigslide.methods.base import Batch, ModelSpec, Sample
from bigslide.methods.mil_baselines import FrozenABMIL, FullBag, full_bag_backward
from bigslide.methods.replay import InexactGradientWarning, batchnorm_layers, has_stochastic_layers
from bigslide.nn.backbones import create_encoder
from bigslide.nn.mil import AGGREGATORS, Aggregator, make_aggregator

BAG, CHUNK, FORWARD_CHUNK = 10, 4, 8  # neither divides the bag: ragged last chunks
TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-10}


class SmallConvNet(nn.Module):
    """A BatchNorm-free encoder (GroupNorm); with `drop` > 0 it has dropout and drop-path too.

    Convolutions feeding a GroupNorm carry no bias, as in real networks: the norm all but cancels such a
    bias, so its gradient is a near-zero difference of large terms, i.e. float rounding noise.
    """

    def __init__(self, drop: float = 0.0) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.GroupNorm(2, 8), nn.GELU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.GroupNorm(2, 8), nn.GELU())
        self.drop_path = DropPath(drop)
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.Dropout2d(drop), nn.GELU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(drop), nn.Linear(16, 12))
        self.dim = 12

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.head(self.down(x + self.drop_path(self.block(x))))


@functools.cache
def _resnet18_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return create_encoder("resnet18").state_dict()


def _resnet18() -> nn.Module:
    encoder = create_encoder("resnet18")
    encoder.load_state_dict(_resnet18_state())
    return encoder


# name -> (encoder factory, tile size, whether it draws random numbers)
ENCODERS: dict[str, tuple[Callable[[], nn.Module], int, bool]] = {
    "resnet18_bn_eval": (_resnet18, 16, False),
    "groupnorm_no_bn": (SmallConvNet, 16, False),
    "dropout_droppath": (lambda: SmallConvNet(drop=0.3), 16, True),
}
# Float64 ResNet-18 is slow on CPU: it runs with one aggregator; the small encoders run with all. Every
# case runs with the encoder in the standard and in channels-last memory (`run.channels_last`).
LAYOUTS = {"nchw": False, "channels_last": True}
CASES = [
    pytest.param(encoder, aggregator, dtype, last, id=f"{encoder}-{aggregator}-{str(dtype)[6:]}-{layout}")
    for encoder in ENCODERS
    for aggregator in AGGREGATORS
    for dtype in (torch.float32, torch.float64)
    for layout, last in LAYOUTS.items()
    if not (encoder == "resnet18_bn_eval" and dtype == torch.float64 and aggregator != "abmil")
]


def _setup(
    encoder_name: str,
    aggregator_name: str,
    dtype: torch.dtype,
    head_dropout: float = 0.0,
    channels_last: bool = False,
) -> tuple[nn.Module, Aggregator, torch.Tensor, torch.Tensor]:
    factory, tile, _ = ENCODERS[encoder_name]
    torch.manual_seed(0)
    encoder = factory().to(dtype).train()
    if channels_last:
        encoder = encoder.to(memory_format=torch.channels_last)
        assert replay.is_channels_last(encoder)
    head = make_aggregator(aggregator_name, encoder.dim, 3, hidden=16, dropout=head_dropout).to(dtype).train()
    bag = torch.rand(BAG, 3, tile, tile, dtype=dtype)
    return encoder, head, bag, torch.tensor([2])


def _take_grads(*modules: nn.Module) -> dict[str, torch.Tensor | None]:
    grads = {}
    for i, module in enumerate(modules):
        for name, p in module.named_parameters():
            grads[f"{i}.{name}"] = None if p.grad is None else p.grad.clone()
            p.grad = None
    return grads


def _worst_relative_error(
    truth: dict[str, torch.Tensor | None], test: dict[str, torch.Tensor | None]
) -> float:
    """Largest per-parameter relative L2 error.

    Rounding error scales with the terms a gradient sums, not with its result: gradients that are zero
    in exact arithmetic (the attention scorer's last bias: softmax ignores a shift) or tiny through
    cancellation (scorers at near-uniform attention) hold noise of about eps times the gradient's
    scale, whichever way they are computed. So each error is relative to at least 1% of the norm of
    the whole gradient.
    """
    assert truth.keys() == test.keys()
    present = [g for g in truth.values() if g is not None]
    floor = 1e-2 * float(torch.cat([g.flatten() for g in present]).norm())
    worst = 0.0
    for name, expected in truth.items():
        got = test[name]
        assert (expected is None) == (got is None), name
        if expected is None or got is None:
            continue
        worst = max(worst, float((got - expected).norm()) / max(float(expected.norm()), floor))
    return worst


@pytest.mark.parametrize(("encoder_name", "aggregator_name", "dtype", "channels_last"), CASES)
def test_accumulated_gradient_equals_full_bag_gradient(
    encoder_name: str, aggregator_name: str, dtype: torch.dtype, channels_last: bool
) -> None:
    check_accumulated_gradient(encoder_name, aggregator_name, dtype, channels_last=channels_last)


def check_accumulated_gradient(
    encoder_name: str,
    aggregator_name: str,
    dtype: torch.dtype,
    device: torch.device | None = None,
    *,
    channels_last: bool = False,
) -> None:
    """ABMIL-ACC's loss and gradients against one backward through the whole bag, on `device` (the CPU
    by default; tests/test_cuda.py runs it on CUDA), with the encoder in standard or channels-last
    memory (the truth gets the bag as read, NCHW; ABMIL-ACC converts each chunk on the device)."""
    stochastic = ENCODERS[encoder_name][2]
    encoder, head, bag, target = _setup(
        encoder_name, aggregator_name, dtype, 0.2 if stochastic else 0.0, channels_last
    )
    if device is not None:
        encoder, head, bag, target = encoder.to(device), head.to(device), bag.to(device), target.to(device)
    # Truth: one graph over the whole bag and one backward through it. Its encoder is called in the
    # replay's chunk sizes: dropout masks depend on how the encoder is called, and float32 kernels round
    # differently per batch size (enough, alone, to move the small GroupNorm net's gradients by 1e-6).
    # So the comparison isolates the accumulation algorithm from the backend's rounding.
    torch.manual_seed(7)
    truth = full_bag_backward(encoder, head, bag, target, encode_chunk_size=CHUNK)
    after_truth = torch.rand(3)
    truth_grads = _take_grads(encoder, head)

    torch.manual_seed(7)
    loss = bag_backward(encoder, head, bag, target, chunk_size=CHUNK, forward_chunk_size=FORWARD_CHUNK)
    after_acc = torch.rand(3)
    acc_grads = _take_grads(encoder, head)

    assert all(g is None or g.device == bag.device for g in acc_grads.values())
    assert has_stochastic_layers(encoder) == stochastic
    assert not loss.requires_grad
    assert float(loss) == pytest.approx(float(truth.loss), rel=TOLERANCE[dtype])
    assert _worst_relative_error(truth_grads, acc_grads) <= TOLERANCE[dtype]
    # The global RNG ends where the full-bag step leaves it: later draws do not depend on the method.
    torch.testing.assert_close(after_acc, after_truth)
    assert all(layer.training for layer in batchnorm_layers(encoder))  # eval only during the step


def test_without_rng_replay_the_dropout_gradient_is_wrong() -> None:
    encoder, head, bag, target = _setup("dropout_droppath", "abmil", torch.float64)
    torch.manual_seed(7)
    full_bag_backward(encoder, head, bag, target, encode_chunk_size=CHUNK)
    truth = _take_grads(encoder, head)
    torch.manual_seed(7)
    accumulated_bag_backward(encoder, head, bag, target, chunk_size=CHUNK, stochastic=False)
    assert _worst_relative_error(truth, _take_grads(encoder, head)) > 1e-2


class UnlistedRandomness(SmallConvNet):
    """Draws random numbers through no layer `has_stochastic_layers` knows: functional dropout and RReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.rrelu = nn.RReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(self.rrelu(super().forward(x)), 0.3, self.training)


def test_an_encoder_drawing_random_numbers_through_unlisted_layers_gets_the_full_bag_gradient() -> None:
    torch.manual_seed(0)
    encoder = UnlistedRandomness().double().train()
    head = make_aggregator("abmil", encoder.dim, 3, hidden=16).double().train()
    bag, target = torch.rand(BAG, 3, 16, 16, dtype=torch.float64), torch.tensor([2])
    assert not has_stochastic_layers(encoder)  # seen drawing in pass 1 instead
    torch.manual_seed(7)
    full_bag_backward(encoder, head, bag, target, encode_chunk_size=CHUNK)
    after_truth = torch.rand(3)
    truth = _take_grads(encoder, head)
    torch.manual_seed(7)
    bag_backward(encoder, head, bag, target, chunk_size=CHUNK, forward_chunk_size=FORWARD_CHUNK)
    torch.testing.assert_close(torch.rand(3), after_truth)
    assert _worst_relative_error(truth, _take_grads(encoder, head)) <= TOLERANCE[torch.float64]


def test_gradients_accumulate_like_backward() -> None:
    encoder, head, bag, target = _setup("groupnorm_no_bn", "abmil_gated", torch.float64)
    bag_backward(encoder, head, bag, target, chunk_size=CHUNK)
    once = _take_grads(encoder, head)
    bag_backward(encoder, head, bag, target, chunk_size=CHUNK)
    bag_backward(encoder, head, bag, target, chunk_size=CHUNK)
    twice = _take_grads(encoder, head)
    doubled = {k: None if g is None else 2 * g for k, g in once.items()}
    assert _worst_relative_error(doubled, twice) <= 1e-12


def test_frozen_bn_gives_no_bn_gradient_and_exact_other_gradients() -> None:
    torch.manual_seed(0)
    encoder = create_encoder("test_resnet").double().train()
    head = make_aggregator("abmil", encoder.dim, 2, hidden=16).double()
    bag, target = torch.rand(BAG, 3, 16, 16, dtype=torch.float64), torch.tensor([1])
    full_bag_backward(encoder, head, bag, target, bn_mode="frozen")
    truth = _take_grads(encoder, head)
    bag_backward(encoder, head, bag, target, chunk_size=CHUNK, bn_mode="frozen")
    acc = _take_grads(encoder, head)
    bn_ids = {id(p) for layer in batchnorm_layers(encoder) for p in layer.parameters()}
    bn_params = {f"0.{name}" for name, p in encoder.named_parameters() if id(p) in bn_ids}
    assert bn_params
    assert all(acc[name] is None for name in bn_params)
    assert _worst_relative_error(truth, acc) <= 1e-10
    assert all(p.requires_grad for p in encoder.parameters())  # restored after the step


def test_batch_mode_is_flagged_inexact_and_counts_each_chunk_once() -> None:
    torch.manual_seed(0)
    encoder = create_encoder("test_resnet").double().train()
    head = make_aggregator("abmil", encoder.dim, 2, hidden=16).double()
    bag, target = torch.rand(BAG, 3, 16, 16, dtype=torch.float64), torch.tensor([1])
    start = copy.deepcopy(encoder.state_dict())

    full_bag_backward(encoder, head, bag, target, bn_mode="batch")  # whole-bag statistics
    truth = _take_grads(encoder, head)
    encoder.load_state_dict(start)
    with pytest.warns(InexactGradientWarning, match="per-chunk"):
        bag_backward(encoder, head, bag, target, chunk_size=CHUNK, bn_mode="batch")
    assert _worst_relative_error(truth, _take_grads(encoder, head)) > 1e-3

    # Running statistics see each chunk once (pass 1), not again in the replay.
    reference = copy.deepcopy(encoder)
    reference.load_state_dict(start)
    with torch.no_grad():
        for chunk in bag.split(CHUNK):
            reference(chunk)
    for ours, expected in zip(encoder.buffers(), reference.buffers()):
        torch.testing.assert_close(ours, expected)
    tracked = [layer.num_batches_tracked for layer in batchnorm_layers(encoder)]
    assert all(int(t) == len(bag.split(CHUNK)) for t in tracked)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eval mode is exact: no warning
        bag_backward(encoder, head, bag, target, chunk_size=CHUNK, bn_mode="eval")


class PlainAttentionHead(nn.Module):
    """A scripted user's head: a plain module (no `Aggregator`, no `aux_loss`).

    `bare`: mean pooling returning only (C,) logits; otherwise attention pooling returning
    `((1, C) logits, (N,) attention)`.
    """

    def __init__(self, dim: int, classes: int, *, bare: bool) -> None:
        super().__init__()
        self.score = nn.Linear(dim, 1)
        self.classifier = nn.Linear(dim, classes)
        self.bare = bare

    def forward(self, z: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.bare:
            return self.classifier(z).mean(dim=0)
        attention = torch.softmax(self.score(z).squeeze(-1), dim=0)
        return self.classifier(attention @ z)[None], attention


@pytest.mark.parametrize("bare", [False, True], ids=["logits_and_attention", "bare_logits"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_any_module_head_gets_the_full_bag_gradient(bare: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    encoder = SmallConvNet().to(dtype).train()
    head = PlainAttentionHead(encoder.dim, 3, bare=bare).to(dtype)
    assert not hasattr(head, "aux_loss")
    bag, target = torch.rand(BAG, 3, 16, 16, dtype=dtype), torch.tensor([2])

    # Truth: one graph, the encoder called in the replay's chunk sizes (same float32 rounding).
    z = torch.cat([encoder(chunk) for chunk in bag.split(CHUNK)])
    output = head(z)
    logits = output if bare else output[0]
    truth_loss = nn.functional.cross_entropy(logits.reshape(1, -1), target)
    truth_loss.backward()
    truth_loss = truth_loss.detach()
    truth = _take_grads(encoder, head)

    step = accumulated_bag_backward(
        encoder, head, bag, target, chunk_size=CHUNK, forward_chunk_size=FORWARD_CHUNK
    )
    assert _worst_relative_error(truth, _take_grads(encoder, head)) <= TOLERANCE[dtype]
    assert float(step.loss) == pytest.approx(float(truth_loss), rel=TOLERANCE[dtype])
    assert step.logits.shape == (1, 3)
    if bare:
        assert step.attention is None  # no made-up scores
    else:
        assert step.attention is not None
        torch.testing.assert_close(step.attention, output[1].detach())

    loss = bag_backward(encoder, head, bag, target, chunk_size=CHUNK)
    assert float(loss) == pytest.approx(float(truth_loss), rel=TOLERANCE[dtype])


class DictHead(nn.Module):
    def forward(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": z.sum(dim=0, keepdim=True)}


def test_a_head_returning_something_else_is_a_clear_error() -> None:
    bag, target = torch.rand(4, 3, 16, 16), torch.tensor([0])
    with pytest.raises(TypeError, match=r"expected logits or \(logits, attention\) tensors, got dict"):
        bag_backward(SmallConvNet(), DictHead(), bag, target, chunk_size=2)


class ChunkMoves:
    """Stands in for the host-to-device copy and watches the bag.

    Records each chunk `move_chunk` moves (a fresh tensor, like a copy on another device), what the
    encoder is given, and the rows of every `.to()` call on a tensor sharing the bag's memory: on CPU
    such a call is a no-op, on CUDA it is a device copy of that many instances.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, encoder: nn.Module, bag: torch.Tensor) -> None:
        self.moved: list[torch.Tensor] = []
        self.seen: list[torch.Tensor] = []
        self.bag_copies: list[int] = []
        monkeypatch.setattr(replay, "move_chunk", self.move)
        encoder.register_forward_pre_hook(lambda _, args: self.seen.append(args[0]))
        storage, original_to = bag.untyped_storage().data_ptr(), torch.Tensor.to

        def watched_to(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
            if tensor.untyped_storage().data_ptr() == storage:
                self.bag_copies.append(len(tensor))
            return original_to(tensor, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(torch.Tensor, "to", watched_to)

    def move(
        self, chunk: torch.Tensor, device: torch.device, colour: object = None, *, channels_last: bool = False
    ) -> torch.Tensor:
        assert colour is None  # no stain maps in these runs
        layout = torch.channels_last if channels_last else torch.contiguous_format
        copy = chunk.to(device).clone(memory_format=layout)
        self.moved.append(copy)
        return copy

    def rows(self) -> list[int]:
        return [len(chunk) for chunk in self.moved]

    def encoder_saw_only_moved_chunks(self) -> bool:
        moved = {id(chunk) for chunk in self.moved}
        return bool(self.seen) and all(id(x) in moved for x in self.seen)


# pass 1 in forward chunks (the replay's chunks when the encoder is stochastic), then the replay
@pytest.mark.parametrize(
    ("encoder_name", "rows"),
    [("groupnorm_no_bn", [8, 2, 4, 4, 2]), ("dropout_droppath", [4, 4, 2, 4, 4, 2])],
)
def test_the_bag_stays_where_it_is_and_the_encoder_gets_one_moved_chunk_at_a_time(
    monkeypatch: pytest.MonkeyPatch, encoder_name: str, rows: list[int]
) -> None:
    encoder, head, bag, target = _setup(encoder_name, "abmil", torch.float64)
    torch.manual_seed(7)
    full_bag_backward(encoder, head, bag, target, encode_chunk_size=CHUNK)
    truth = _take_grads(encoder, head)
    original, address = bag.clone(), bag.data_ptr()

    moves = ChunkMoves(monkeypatch, encoder, bag)
    torch.manual_seed(7)
    bag_backward(encoder, head, bag, target, chunk_size=CHUNK, forward_chunk_size=FORWARD_CHUNK)
    assert moves.rows() == rows  # never the whole bag, each instance once per pass
    assert moves.bag_copies == rows
    assert moves.encoder_saw_only_moved_chunks()
    assert bag.data_ptr() == address
    assert torch.equal(bag, original)
    assert _worst_relative_error(truth, _take_grads(encoder, head)) <= 1e-10


def test_mil_methods_move_chunks_not_bags_in_training_and_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec(backbone="test_resnet", num_classes=2)
    acc = ABMILACC(
        ABMILACCParams(hidden=16, chunk_size=4, forward_chunk_size=6, inference_chunk_size=5),
        spec,
        torch.device("cpu"),
    )
    frozen = FrozenABMIL(FrozenABMIL.Params(hidden=16, inference_chunk_size=5), spec, torch.device("cpu"))
    batch = _batch(13, 1, seed=3)
    for method, train_rows in ((acc, [6, 6, 1, 4, 4, 4, 1]), (frozen, [5, 5, 3])):
        moves = ChunkMoves(monkeypatch, method.mil_model.encoder, batch.x)
        method.model.train()
        method.train_step(batch, OptimStepper(torch.optim.SGD(method.trainable_parameters(), lr=0.1)))
        assert moves.rows() == train_rows, method.name
        assert moves.encoder_saw_only_moved_chunks(), method.name
        assert max(moves.bag_copies, default=0) <= 6, method.name  # no copy of the whole bag
        method.model.eval()
        sample = _batch(12, 0, seed=4).samples[0]  # a new slide: nothing cached
        moves = ChunkMoves(monkeypatch, method.mil_model.encoder, sample.x)
        method.predict(sample)
        assert moves.rows() == [5, 5, 2], method.name
        assert moves.encoder_saw_only_moved_chunks(), method.name
        assert max(moves.bag_copies, default=0) <= 5, method.name


def test_a_host_bag_is_pinned_once_for_a_cuda_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    pins: list[torch.Tensor] = []
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda tensor: any(tensor is p for p in pins))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor: pins.append(tensor.clone()) or pins[-1])
    bag = torch.rand(4, 3)
    assert replay.pinned(bag, torch.device("cpu")) is bag
    page_locked = replay.pinned(bag, torch.device("cuda"))
    assert page_locked is pins[0]
    assert replay.pinned(page_locked, torch.device("cuda")) is page_locked  # the engine's batches
    assert len(pins) == 1


def _methods(aggregator: str, channels_last: str = "auto") -> tuple[ABMILACC, FullBag]:
    spec = ModelSpec(backbone="test_resnet", num_classes=2, channels_last=channels_last)
    torch.manual_seed(0)
    acc = ABMILACC(ABMILACCParams(aggregator=aggregator, hidden=16, chunk_size=4), spec, torch.device("cpu"))
    full = FullBag(FullBag.Params(aggregator=aggregator, hidden=16), spec, torch.device("cpu"))
    full.model.load_state_dict(acc.model.state_dict())
    return acc, full


def _batch(n: int, label: int, seed: int) -> Batch:
    bag = torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
    coords = np.stack([np.arange(n) * 16, np.zeros(n)], axis=1).astype(np.int64)
    sample = Sample(x=bag, y=label, slide=f"slide{seed}", coords=coords, tile_size_level0=16)
    return Batch(x=bag, y=torch.tensor([label]), samples=[sample])


@pytest.mark.parametrize("channels_last", ["off", "on"])
@pytest.mark.parametrize("aggregator", ["abmil_gated", "dtfd"])
def test_abmil_acc_method_step_equals_full_bag_step(aggregator: str, channels_last: str) -> None:
    acc, full = _methods(aggregator, channels_last)
    for method in (acc, full):
        assert replay.is_channels_last(method.mil_model.encoder) == (channels_last == "on")
    batch = _batch(10, 1, seed=3)
    for method in (acc, full):
        method.model.train()
        stepper = OptimStepper(torch.optim.SGD(method.trainable_parameters(), lr=0.5))
        torch.manual_seed(1)
        result = method.train_step(batch, stepper)
        assert np.isfinite(result.loss)
        assert result.logits.shape == (1, 2)
        assert stepper.steps == 1
    for (name, p_acc), p_full in zip(acc.model.named_parameters(), full.model.parameters()):
        torch.testing.assert_close(p_acc, p_full, rtol=1e-5, atol=1e-6, msg=name)


def test_abmil_acc_trains_and_predicts() -> None:
    acc, _ = _methods("abmil")
    start = {k: v.clone() for k, v in acc.model.state_dict().items()}
    stepper = OptimStepper(torch.optim.Adam(acc.trainable_parameters(), lr=1e-2))
    acc.model.train()
    losses = [acc.train_step(_batch(8, step % 2, seed=step % 2), stepper).loss for step in range(3)]
    assert all(np.isfinite(losses))
    end = acc.model.state_dict()
    assert not torch.equal(start["encoder.backbone.conv1.0.weight"], end["encoder.backbone.conv1.0.weight"])
    assert not torch.equal(start["aggregator.classifier.weight"], end["aggregator.classifier.weight"])

    acc.model.eval()
    prediction = acc.predict(_batch(9, 0, seed=5).samples[0])
    assert prediction.probs.shape == (2,)
    assert prediction.probs.sum() == pytest.approx(1.0, abs=1e-6)
    assert prediction.instance_scores is not None
    assert prediction.instance_scores.shape == (9,)
    assert prediction.instance_scores.sum() == pytest.approx(1.0, abs=1e-5)


class _BareLogits(nn.Module):
    """A head that scores the bag but no instance: mean-pooled features through a linear layer."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, 2)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc(z.mean(dim=0))


def test_a_head_without_attention_predicts_and_gives_no_heatmap() -> None:
    from bigslide.engine.inference import sample_grids

    acc, _ = _methods("abmil")
    acc.model.aggregator = _BareLogits(acc.model.encoder.dim)
    acc.model.eval()
    sample = _batch(6, 0, seed=3).samples[0]
    sample.coords = np.array([[i * 32, 0] for i in range(6)])
    sample.tile_size_level0 = 32
    prediction = acc.predict(sample)
    assert prediction.probs.sum() == pytest.approx(1.0, abs=1e-6)
    assert prediction.instance_scores is None  # no made-up uniform attention
    assert sample_grids(sample, prediction, (0.5, 0.5)) == {}


@pytest.mark.parametrize(
    ("choice", "backbone", "device", "expected"),
    [
        ("auto", "resnet18", "cuda", True),
        ("auto", "resnet18", "cpu", False),
        ("auto", "vit_tiny_patch16_224", "cuda", False),  # one convolution: the patch embedding
        ("on", "resnet18", "cpu", True),
        ("off", "resnet18", "cuda", False),
    ],
)
def test_channels_last_auto_is_for_cnn_encoders_on_cuda(
    choice: str, backbone: str, device: str, expected: bool
) -> None:
    from bigslide.methods.encoder_layout import wants_channels_last

    encoder = create_encoder(backbone)
    assert wants_channels_last(choice, encoder, torch.device(device)) is expected


def test_a_channels_last_method_feeds_its_encoder_channels_last_floats_of_the_same_pixels() -> None:
    """The bag stays uint8 NCHW on the host; each chunk is scaled and converted on the device."""
    spec = ModelSpec(backbone="test_resnet", num_classes=2, channels_last="on")
    acc = ABMILACC(ABMILACCParams(hidden=16, chunk_size=4), spec, torch.device("cpu"))
    seen: list[torch.Tensor] = []
    acc.mil_model.encoder.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    bag = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8)
    acc.model.train()
    acc.train_step(
        Batch(bag, torch.tensor([1]), [], sizes=[6]),
        OptimStepper(torch.optim.SGD(acc.trainable_parameters(), lr=0.1)),
    )
    assert seen
    for x in seen:
        assert x.dtype == torch.float32
        assert x.is_contiguous(memory_format=torch.channels_last)
    scaled = bag.float() / 255
    # pass 1: the whole bag in one forward chunk (4 x 4 tiles); the replay: chunks of 4
    assert [len(x) for x in seen] == [6, 4, 2]
    assert torch.equal(seen[0], scaled)
    assert torch.equal(torch.cat(seen[1:]), scaled)
    assert bag.is_contiguous()
