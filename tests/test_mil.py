"""MIL aggregators: the paper formulas, exact TransMIL class-token attention, DTFD's split, no N x N."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from bigslide.errors import ConfigError
from bigslide.nn.mil import AGGREGATORS, DTFD, TransMIL, make_aggregator

IN_DIM, CLASSES = 24, 3


def _bag(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, IN_DIM, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", AGGREGATORS)
@pytest.mark.parametrize("n", [1, 2, 7, 30])
def test_output_shapes_and_attention_is_a_distribution(name: str, n: int) -> None:
    torch.manual_seed(0)
    head = make_aggregator(name, IN_DIM, CLASSES, hidden=16).eval()
    logits, attention = head(_bag(n))
    assert logits.shape == (1, CLASSES)
    assert attention.shape == (n,)
    assert bool((attention >= 0).all())
    total = float(attention.detach().sum())
    if name == "transmil":  # the class token's attention to itself is the rest
        assert 0.0 < total <= 1.0 + 1e-6
    else:
        assert total == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("gated", [False, True])
def test_abmil_matches_ilse_formula(gated: bool) -> None:
    torch.manual_seed(1)
    head = make_aggregator("abmil_gated" if gated else "abmil", IN_DIM, CLASSES, hidden=16, attention_dim=8)
    z = _bag(11)
    logits, attention = head(z)
    h = torch.relu(head.project[0](z))
    score = head.pool.score
    inner = torch.tanh(score.V(h))
    if gated:
        inner = inner * torch.sigmoid(score.U(h))
    a = torch.softmax(score.w(inner)[:, 0], dim=0)
    expected = head.classifier((a[:, None] * h).sum(0))
    torch.testing.assert_close(attention, a)
    torch.testing.assert_close(logits[0], expected)


def test_abmil_is_permutation_invariant() -> None:
    torch.manual_seed(2)
    head = make_aggregator("abmil_gated", IN_DIM, CLASSES, hidden=16)
    z = _bag(25)
    order = torch.randperm(25)
    logits, attention = head(z)
    logits_p, attention_p = head(z[order])
    torch.testing.assert_close(logits_p, logits)
    torch.testing.assert_close(attention_p, attention[order])


def test_transmil_class_token_layer_equals_full_self_attention() -> None:
    torch.manual_seed(3)
    head = TransMIL(IN_DIM, CLASSES, hidden=16, heads=4)
    tokens = torch.randn(1, 26, 16)
    out, weights = head.layer2.class_token(tokens)
    torch.testing.assert_close(out[:, 0], head.layer2(tokens)[:, 0])
    normed = head.layer2.norm(tokens)
    _, full_weights = head.layer2.attn(normed, normed, normed, need_weights=True)
    torch.testing.assert_close(weights, full_weights[0, 0])


def test_transmil_padding_attention_returns_to_its_instance() -> None:
    torch.manual_seed(4)
    head = TransMIL(IN_DIM, CLASSES, hidden=16, heads=4).eval()
    n = 7  # a 3 x 3 grid: instances 0 and 1 are repeated as padding
    z = _bag(n)
    _, attention = head(z)
    captured: dict[str, torch.Tensor] = {}
    original = head.layer2.class_token

    def spy(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, weights = original(tokens)
        captured["weights"] = weights
        return out, weights

    head.layer2.class_token = spy  # type: ignore[method-assign]
    head(z)
    w = captured["weights"]
    assert w.shape == (1 + 9,)
    expected = w[1 : n + 1].clone()
    expected[:2] += w[n + 1 :]
    torch.testing.assert_close(attention, expected)
    assert float((attention.sum() + w[0]).detach()) == pytest.approx(1.0, abs=1e-6)


def test_dtfd_split_follows_the_global_rng_in_training_and_is_fixed_in_eval() -> None:
    torch.manual_seed(5)
    head = DTFD(IN_DIM, CLASSES, hidden=16, pseudo_bags=3)
    z = _bag(20)
    torch.manual_seed(11)
    logits_a, attention_a = head(z)
    torch.manual_seed(11)
    logits_b, attention_b = head(z)
    torch.testing.assert_close(logits_a, logits_b)
    torch.testing.assert_close(attention_a, attention_b)
    torch.manual_seed(12)
    _, attention_c = head(z)
    assert not torch.allclose(attention_a, attention_c)  # a different split

    head.eval()
    torch.manual_seed(1)
    first = head(z)[1]
    torch.manual_seed(2)
    torch.testing.assert_close(head(z)[1], first)


def test_dtfd_scores_are_tier1_times_tier2_attention_and_aux_loss_is_tier1_ce() -> None:
    torch.manual_seed(6)
    head = DTFD(IN_DIM, CLASSES, hidden=16, pseudo_bags=4).eval()
    z = _bag(21)
    logits, attention = head(z)
    groups = head.split(21, z.device)
    h = head.project(z)
    tier1 = [torch.softmax(head.tier1_pool.score(h[g]), 0) for g in groups]
    pooled = torch.stack([(a[:, None] * h[g]).sum(0) for a, g in zip(tier1, groups)])
    group_attention = torch.softmax(head.tier2_pool.score(pooled), 0)
    for g, a, b in zip(groups, tier1, group_attention):
        torch.testing.assert_close(attention[g], a * b)
    torch.testing.assert_close(logits[0], head.tier2_classifier(group_attention @ pooled))
    target = torch.tensor([2])
    expected = F.cross_entropy(head.tier1_classifier(pooled), target.expand(4))
    torch.testing.assert_close(head.aux_loss(target), expected)


def test_dtfd_maxs_distils_one_instance_per_pseudo_bag() -> None:
    torch.manual_seed(7)
    head = DTFD(IN_DIM, CLASSES, hidden=16, pseudo_bags=2, distill="maxs").eval()
    z = _bag(10)
    captured: dict[str, torch.Tensor] = {}
    head.tier2_pool.register_forward_hook(lambda _m, args, _o: captured.update(features=args[0]))
    head(z)
    h = head.project(z)
    for feature in captured["features"]:
        assert bool(torch.isclose(h, feature).all(dim=1).any())


def test_unknown_aggregator_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="clam"):
        make_aggregator("clam", IN_DIM, CLASSES)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operator produces (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.op = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest, self.op = t.numel(), str(func)
        return out


@pytest.mark.parametrize("name", AGGREGATORS)
def test_no_tensor_of_size_n_squared_at_3000_instances(name: str) -> None:
    n = 3000
    torch.manual_seed(8)
    kwargs = {"hidden": 32} if name == "transmil" else {"hidden": 32, "attention_dim": 16}
    head = make_aggregator(name, IN_DIM, CLASSES, **kwargs)
    z = _bag(n).requires_grad_(True)
    with _LargestTensor() as spy:
        logits, _ = head(z)
        loss = F.cross_entropy(logits, torch.tensor([1]))
        aux = head.aux_loss(torch.tensor([1]))
        (loss if aux is None else loss + aux).backward()
    assert z.grad is not None
    assert bool(torch.isfinite(z.grad).all())
    # The largest tensors are (N, a few x hidden) activations; one attention matrix is N * N = 9e6.
    assert spy.largest <= n * n // 20, f"{spy.op} produced {spy.largest} elements"
