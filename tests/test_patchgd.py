"""PatchGD against the paper's algorithm computed by hand, on tiny images and encoders."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bigslide.errors import ConfigError
from bigslide.memory.stepper import OptimStepper
from bigslide.methods.base import Batch, ModelSpec, Sample
from bigslide.methods.encoder_layout import channels_last_encoder
from bigslide.methods.patchgd import PatchGD, PatchGDParams, fill_z, sample_positions, zblock_maps
from bigslide.methods.replay import InexactGradientWarning
from bigslide.nn.backbones import create_encoder
from bigslide.nn.patchgd_heads import CNNHead, TransformerHead

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny tensors: one thread is faster, and much faster on a shared, busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class TinyEncoder(nn.Module):
    """Conv + mean/max pooling + linear: cheap, no BatchNorm, every patch gives a distinct vector."""

    def __init__(self, dim: int = 6) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(8, dim)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        return self.fc(torch.cat([h.mean((2, 3)), h.amax((2, 3))], 1))


class RecordingStepper:
    """Counts steps and records the accumulated gradient at each step instead of moving the weights."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.grads: list[dict[str, torch.Tensor]] = []

    def autocast(self):  # type: ignore[no-untyped-def]
        return torch.autocast("cpu", enabled=False)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.grads.append(
            {
                n: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                for n, p in self.model.named_parameters()
            }
        )
        self.model.zero_grad(set_to_none=True)


def make_method(
    dim: int = 6, classes: int = 3, tiny: bool = True, device: torch.device = CPU, **params: object
) -> PatchGD:
    values: dict[str, object] = {
        "patch_size": 32,
        "latent_dim": dim,
        "head_dropout": 0.0,
        "channels_last": False,
    }
    values.update(params)
    method = PatchGD(PatchGDParams(**values), ModelSpec("test_resnet", num_classes=classes), device)  # type: ignore[arg-type]
    if tiny:
        encoder = TinyEncoder(dim).to(device)
        if method.params.channels_last:  # as `build_model` lays out its encoder
            encoder = channels_last_encoder(encoder, host=device.type == "cpu")
        method.model.encoder = encoder
    method.model.train()
    return method


# The exactness tests run with the encoder in the standard and in channels-last memory.
LAYOUTS = pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])


def encode_each_patch(encoder: nn.Module, image: torch.Tensor, patch: int, stride: int, rows: int, cols: int):
    out = torch.empty(encoder(image[None, :, :patch, :patch]).shape[1], rows, cols, dtype=image.dtype)
    for r in range(rows):
        for c in range(cols):
            out[:, r, c] = encoder(
                image[None, :, r * stride : r * stride + patch, c * stride : c * stride + patch]
            )[0]
    return out


@LAYOUTS
@pytest.mark.parametrize(
    ("height", "width", "stride", "rows", "cols"),
    [(64, 96, None, 2, 3), (64, 96, 16, 3, 5), (70, 100, None, 3, 4)],
    ids=["2x3", "overlap", "padded"],
)
def test_fill_z_equals_encoding_each_patch_alone(
    height: int, width: int, stride: int | None, rows: int, cols: int, channels_last: bool
):
    torch.manual_seed(0)
    encoder = create_encoder("test_resnet", out_dim=5).double().eval()
    if channels_last:
        encoder = channels_last_encoder(encoder, host=True)
    images = torch.rand(2, 3, height, width, dtype=torch.float64)
    Z = fill_z(encoder, images, 32, stride, batch_size=7, channels_last=channels_last)
    assert Z.shape == (2, 5, rows, cols)
    padded = F.pad(
        images,
        (0, (cols - 1) * (stride or 32) + 32 - width, 0, (rows - 1) * (stride or 32) + 32 - height),
        value=1.0,
    )
    with torch.no_grad():
        for b in range(2):
            expected = encode_each_patch(encoder, padded[b], 32, stride or 32, rows, cols)
            torch.testing.assert_close(Z[b], expected, atol=1e-9, rtol=1e-9)


def test_stride_above_patch_is_refused():
    with pytest.raises(ConfigError, match="stride"):
        fill_z(TinyEncoder(), torch.rand(1, 3, 64, 64), 32, 40)
    with pytest.raises(ConfigError, match="stride"):
        make_method(stride=40)


def test_positions_cover_every_patch_per_image_and_differ_between_images():
    torch.manual_seed(1)
    n, k = 7, 3
    positions = sample_positions(n, k, iterations=6, batch=4)
    assert positions.shape == (6, 4, 3)
    for b in range(4):
        for j in range(6):
            assert len(set(positions[j, b].tolist())) == k  # no patch twice in one draw
        first_pass = positions[: math.ceil(n / k), b].reshape(-1).tolist()
        assert set(first_pass) == set(range(n))
    assert any(not torch.equal(positions[:, 0], positions[:, b]) for b in range(1, 4))


def hand_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor, epsilon: int):
    """Algorithm 1 written out plainly: one encoder call per sampled patch, Z as a Python-level copy."""
    encoder, head = model.encoder, model.head
    iterations, images, _k = positions.shape
    with torch.no_grad():
        Z = fill_z(encoder, x, 32).clone()
    cols = Z.shape[3]
    grads, accumulated = [], None
    full = iterations // epsilon * epsilon
    for j in range(iterations):
        current = Z.clone()
        fresh = []
        for b in range(images):
            for pos in positions[j, b].tolist():
                r, c = divmod(pos, cols)
                z = encoder(x[b : b + 1, :, r * 32 : r * 32 + 32, c * 32 : c * 32 + 32])[0]
                current[b, :, r, c] = z
                fresh.append((b, r, c, z.detach()))
        loss = F.cross_entropy(head(current), y) / (epsilon if j < full else iterations - full)
        params = list(model.parameters())
        g = torch.autograd.grad(loss, params, allow_unused=True)
        g = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(params, g)]
        accumulated = g if accumulated is None else [a + b for a, b in zip(accumulated, g)]
        for b, r, c, z in fresh:
            Z[b, :, r, c] = z
        if (j + 1) % epsilon == 0 or j + 1 == iterations:
            grads.append(dict(zip([n for n, _ in model.named_parameters()], accumulated)))
            accumulated = None
    return grads


@LAYOUTS
@pytest.mark.parametrize("grad_chunk", [0, 1, 3], ids=["one-pass", "chunk1", "chunk3"])
@pytest.mark.parametrize("head", ["cnn", "transformer", "pool"])
def test_gradient_flows_only_through_each_iterations_patches(head: str, grad_chunk: int, channels_last: bool):
    torch.manual_seed(2)
    method = make_method(
        head=head,
        k=2,
        inner_iterations=3,
        epsilon=2,
        head_width=8,
        grad_chunk=grad_chunk,
        channels_last=channels_last,
    )
    method.model.double()
    reference = copy.deepcopy(method.model)
    x, y = torch.rand(2, 3, 64, 96, dtype=torch.float64), torch.tensor([0, 2])
    stepper = RecordingStepper(method.model)
    result = method.train_step(Batch(x, y, []), stepper)
    assert result.optimizer_steps == 2
    assert len(stepper.grads) == 2
    assert method.last_positions is not None
    expected = hand_gradients(reference, x, y, method.last_positions, epsilon=2)
    for got, want in zip(stepper.grads, expected):
        for name, value in want.items():
            torch.testing.assert_close(
                got[name], value, atol=1e-10, rtol=1e-8, msg=lambda m, n=name: f"{n}: {m}"
            )
    assert stepper.grads[0]["encoder.conv.weight"].abs().sum() > 0


@LAYOUTS
@pytest.mark.parametrize("head", ["pool", "cnn"])
def test_one_step_per_batch_is_the_whole_images_gradient(head: str, channels_last: bool):
    """epsilon = zeta inner iterations that cover every patch once, an encoder without BatchNorm and a
    head without dropout: the step's gradient is that of the whole model in one pass (every patch encoded
    with grad, the head on all of Z) at the memory of k patches per image; the encoder's share comes
    scaled by 1/epsilon (Algorithm 1 divides each inner iteration's loss by epsilon and each patch is in
    one iteration), a constant factor Adam does not see."""
    check_step_is_whole_images_gradient(head, CPU, channels_last=channels_last)


def check_step_is_whole_images_gradient(
    head: str, device: torch.device, *, channels_last: bool = False
) -> None:
    """The test above on `device` (tests/test_cuda.py runs it on CUDA)."""
    torch.manual_seed(8)
    # 6 patches per image -> zeta 3
    method = make_method(head=head, k=2, epsilon=3, head_width=8, device=device, channels_last=channels_last)
    method.model.double()
    whole = copy.deepcopy(method.model)
    x = torch.rand(2, 3, 64, 96, dtype=torch.float64, device=device)
    y = torch.tensor([1, 2], device=device)
    stepper = RecordingStepper(method.model)
    assert method.train_step(Batch(x, y, []), stepper).optimizer_steps == 1
    patches = x.unfold(2, 32, 32).unfold(3, 32, 32).permute(0, 2, 3, 1, 4, 5).reshape(-1, 3, 32, 32)
    Z = whole.encoder(patches).view(2, 2, 3, -1).permute(0, 3, 1, 2)
    F.cross_entropy(whole.head(Z), y).backward()
    for name, p in whole.named_parameters():
        assert p.grad is not None
        scale = 1 / 3 if name.startswith("encoder.") else 1.0
        torch.testing.assert_close(stepper.grads[0][name], scale * p.grad, atol=1e-10, rtol=1e-8)


@LAYOUTS
def test_grad_chunk_is_exact_with_frozen_batchnorm_and_warns_with_training_batchnorm(channels_last: bool):
    def step(grad_chunk: int, encoder_bn: str) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        torch.manual_seed(4)
        method = make_method(
            tiny=False,
            k=3,
            epsilon=2,
            head_width=8,
            grad_chunk=grad_chunk,
            encoder_bn=encoder_bn,
            channels_last=channels_last,
        )
        method.model.double()
        stepper = RecordingStepper(method.model)
        torch.manual_seed(5)  # the same patch positions for every run
        method.train_step(
            Batch(torch.rand(2, 3, 64, 96, dtype=torch.float64), torch.tensor([0, 2]), []), stepper
        )
        stats = [b.clone() for b in method.model.encoder.buffers()]
        return stepper.grads[0], stats

    one_pass, stats = step(0, "frozen")
    chunked, chunked_stats = step(2, "frozen")
    for name, value in one_pass.items():
        torch.testing.assert_close(
            chunked[name], value, atol=1e-10, rtol=1e-8, msg=lambda m, n=name: f"{n}: {m}"
        )
    assert any(v.abs().sum() > 0 for n, v in chunked.items() if n.startswith("encoder."))
    assert all(torch.equal(a, b) for a, b in zip(stats, chunked_stats))
    with pytest.warns(InexactGradientWarning, match="grad_chunk"):
        _, trained_stats = step(2, "train")
    # Every chunk of 2 of the 2 x 3 patches is one BatchNorm batch, counted once: the replay adds none.
    _, unchunked_stats = step(0, "train")
    tracked = [int(b) for b in trained_stats if b.dtype == torch.long]
    once = [int(b) for b in unchunked_stats if b.dtype == torch.long]
    assert once
    assert once[0] > 0
    assert tracked == [3 * n for n in once]


@pytest.mark.parametrize(
    ("sampling", "k", "zeta", "epsilon", "steps"),
    [
        (0.125, 0, 0, 8, 1),  # the paper's 1/8 with ζ = 8, ε = 8
        (0.5, 0, 0, 8, 1),  # ε > ζ: the reference never stepped here
        (0.25, 0, 0, 3, 2),  # ζ = 4 not divisible by ε = 3
        (0.125, 0, 0, 1, 8),
        (1.0, 0, 5, 2, 3),
        (0.125, 3, 0, 4, 2),  # k = 3 of 24 patches -> ζ = 8
        (0.125, 5, 0, 2, 3),  # k = 5 -> ζ = ⌈24/5⌉ = 5
        (0.125, 2, 7, 7, 1),
        (0.125, 2, 1, 8, 1),
    ],
)
def test_optimizer_steps_per_batch_are_ceil_zeta_over_epsilon(
    sampling: float, k: int, zeta: int, epsilon: int, steps: int
):
    method = make_method(
        sampling=sampling, k=k, inner_iterations=zeta, epsilon=epsilon, head_width=4, patch_size=16
    )
    iterations = method.params.iterations(24)
    assert steps == math.ceil(iterations / epsilon)
    stepper = RecordingStepper(method.model)
    result = method.train_step(Batch(torch.rand(2, 3, 64, 96), torch.tensor([0, 1]), []), stepper)
    assert result.optimizer_steps == steps == len(stepper.grads)
    assert method.last_positions is not None
    assert method.last_positions.shape[0] == iterations


@pytest.mark.parametrize("head", ["cnn", "transformer"])
@pytest.mark.parametrize("encoder_bn", ["train", "frozen"])
def test_batch_of_one_on_a_2x2_grid_trains(head: str, encoder_bn: str):
    torch.manual_seed(3)
    method = make_method(
        head=head, tiny=False, k=1 if encoder_bn == "frozen" else 2, encoder_bn=encoder_bn, epsilon=1
    )
    stepper = OptimStepper(torch.optim.SGD(method.model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in method.model.parameters()]
    result = method.train_step(Batch(torch.rand(1, 3, 64, 64), torch.tensor([1]), []), stepper)
    assert result.logits.shape == (1, 3)
    assert math.isfinite(result.loss)
    assert result.optimizer_steps == stepper.steps == (4 if encoder_bn == "frozen" else 2)
    changed = [not torch.equal(a, b) for a, b in zip(before, method.model.parameters())]
    assert all(changed[-2:])
    assert any(changed[:10])
    with torch.no_grad():  # still in train mode: the head's output depends on the image at batch 1
        a, b = (method.model.head(torch.randn(1, 6, 2, 2)) for _ in range(2))
    assert (a - b).abs().max() > 1e-4


def test_too_few_values_for_batchnorm_name_the_parameter():
    method = make_method(tiny=False, k=1)
    stepper = OptimStepper(torch.optim.SGD(method.model.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="encoder_bn"):
        method.train_step(Batch(torch.rand(1, 3, 64, 64), torch.tensor([1]), []), stepper)
    head = CNNHead(4, 2).train()
    with pytest.raises(ConfigError, match="head_norm"):
        head(torch.rand(1, 4, 1, 1))
    assert CNNHead(4, 2, norm="group").train()(torch.rand(1, 4, 1, 1)).shape == (1, 2)


def test_vit_backbone_is_built_for_the_patch_size():
    method = PatchGD(
        PatchGDParams(patch_size=32, latent_dim=6, k=2), ModelSpec("test_vit", num_classes=2), CPU
    )
    method.model.train()
    stepper = OptimStepper(torch.optim.SGD(method.model.parameters(), lr=0.1))
    result = method.train_step(Batch(torch.rand(1, 3, 64, 96), torch.tensor([1]), []), stepper)
    assert result.logits.shape == (1, 2)


@pytest.mark.parametrize(
    "backbone", ["resnet50", "mobilenetv2_100", "convnextv2_atto", "deit_tiny_patch16_224"]
)
def test_timm_backbones_give_one_latent_vector_per_patch_and_train(backbone: str):
    torch.manual_seed(5)
    method = PatchGD(
        PatchGDParams(patch_size=32, latent_dim=6, k=2, encoder_bn="frozen", head_width=8),
        ModelSpec(backbone, num_classes=2),
        CPU,
    )
    encoder = method.model.get_submodule("encoder")
    z = fill_z(encoder, torch.rand(1, 3, 64, 96), 32)
    assert z.shape == (1, 6, 2, 3)
    method.model.train()
    stepper = RecordingStepper(method.model)
    result = method.train_step(Batch(torch.rand(1, 3, 64, 96), torch.tensor([1]), []), stepper)
    assert result.logits.shape == (1, 2)
    assert any(g.abs().sum() > 0 for n, g in stepper.grads[0].items() if n.startswith("encoder."))


@pytest.mark.parametrize("head", ["cnn", "transformer"])
def test_inference_uses_every_patch(head: str):
    torch.manual_seed(4)
    method = make_method(head=head, head_width=8)
    method.model.eval()
    image = torch.rand(3, 64, 96)
    base = method.predict(Sample(image, 0, "s"))
    assert base.probs.shape == (3,)
    assert base.probs.sum() == pytest.approx(1.0, abs=1e-6)
    for r in range(2):
        for c in range(3):
            changed = image.clone()
            changed[:, r * 32 : r * 32 + 32, c * 32 : c * 32 + 32] = torch.rand(3, 32, 32)
            moved = method.predict(Sample(changed, 0, "s"))
            assert np.abs(moved.probs - base.probs).max() > 1e-7, (r, c)
            norm_change = np.abs(moved.maps["norm"] - base.maps["norm"]) > 1e-9
            assert norm_change[r, c]
            assert norm_change.sum() == 1


def test_maps_shapes_and_evidence_is_integrated_gradients_from_the_typical_cell():
    torch.manual_seed(5)
    head = TransformerHead(6, 3, width=8).eval()
    Z = torch.randn(6, 2, 3)
    maps = zblock_maps(head, Z, target=1)
    assert maps["norm"].shape == (2, 3)
    assert maps["evidence"].shape == (2, 3)
    assert maps["pca"].shape == (2, 3, 3)
    np.testing.assert_allclose(maps["norm"], Z.norm(dim=0).numpy(), rtol=1e-6)
    assert maps["pca"].min() >= 0.0
    assert maps["pca"].max() <= 1.0
    assert np.allclose(maps["pca"].reshape(6, 3).max(0), 1.0)
    # the truth: the path integral by a fine midpoint rule, from every cell at the channel medians
    baseline = Z.flatten(1).median(dim=1).values[:, None, None].expand_as(Z)
    grads = []
    for a in (torch.arange(2000, dtype=torch.float64) + 0.5) / 2000:
        leaf = (baseline + a * (Z - baseline)).double()[None].requires_grad_(True)
        head.double()(leaf)[0, 1].backward()
        grads.append(leaf.grad[0])
    head.float()
    truth = ((Z - baseline).double() * torch.stack(grads).mean(0)).sum(0).numpy()
    np.testing.assert_allclose(maps["evidence"], truth, atol=0.02 * np.abs(truth).max())
    # completeness: the cells share out the logit's rise from the baseline
    with torch.no_grad():
        rise = float(head(Z[None])[0, 1] - head(baseline[None])[0, 1])
    assert maps["evidence"].sum() == pytest.approx(rise, abs=0.02 * abs(rise) + 1e-4)
    cnn = CNNHead(6, 3, width=8).eval()
    zblock_maps(cnn, Z)
    assert all(p.grad is None for p in cnn.parameters())  # maps leave no parameter gradients behind


def test_evidence_of_a_linear_head_is_each_cells_own_contribution():
    """Mean-pooled linear head: a cell's evidence is exactly w . (z - typical cell) / cells, so a cell
    equal to the typical one has none and an odd cell carries the class's rise alone."""
    torch.manual_seed(3)
    w = torch.randn(2, 4)
    head = lambda Z: Z.mean(dim=(2, 3)) @ w.T  # noqa: E731
    Z = torch.randn(4, 1, 1).expand(4, 3, 5).clone()  # uniform tissue...
    Z[:, 1, 2] += torch.tensor([3.0, -1.0, 0.5, 2.0])  # ...and one odd cell
    evidence = zblock_maps(head, Z, target=0)["evidence"]
    expected = np.zeros((3, 5))
    expected[1, 2] = float(w[0] @ torch.tensor([3.0, -1.0, 0.5, 2.0])) / 15
    np.testing.assert_allclose(evidence, expected, atol=1e-6)


def test_two_class_evidence_is_for_the_positive_class_whatever_the_prediction():
    torch.manual_seed(7)
    method = make_method(classes=2)
    method.model.eval()
    with torch.no_grad():  # bias the head so that the image is called class 0
        last = [m for m in method.model.head.modules() if isinstance(m, nn.Linear)][-1]
        last.bias.copy_(torch.tensor([5.0, -5.0]))
    image = torch.rand(3, 64, 96)
    pred = method.predict(Sample(image, 0, "s"))
    assert pred.probs.argmax() == 0
    Z = fill_z(method.model.encoder, image[None], 32)
    expected = zblock_maps(method.model.head, Z[0], target=1)["evidence"]
    np.testing.assert_allclose(pred.maps["evidence"], expected, rtol=1e-6)
    assert not np.allclose(expected, zblock_maps(method.model.head, Z[0], target=0)["evidence"])


@pytest.mark.parametrize("head", ["cnn", "pool"])
def test_a_few_steps_learn_a_tiny_task(head: str):
    torch.manual_seed(6)
    images = torch.rand(8, 3, 64, 64) * 0.3
    labels = torch.tensor([0, 1] * 4)
    for i in range(1, 8, 2):  # class 1: one bright patch somewhere
        r, c = divmod(i // 2, 2)
        images[i, :, r * 32 : r * 32 + 32, c * 32 : c * 32 + 32] += 0.6
    method = make_method(classes=2, sampling=0.5, epsilon=2, head_width=16, head=head)
    stepper = OptimStepper(torch.optim.Adam(method.model.parameters(), lr=1e-2))
    losses = [method.train_step(Batch(images, labels, []), stepper).loss for _ in range(25)]
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    method.model.eval()
    probs = np.stack([method.predict(Sample(img, 0, "s")).probs for img in images])
    assert (probs.argmax(1) == labels.numpy()).mean() >= 0.75


def test_host_encoder_keeps_large_late_convolutions_in_the_standard_layout() -> None:
    torch.manual_seed(0)
    plain = create_encoder("resnet18", out_dim=16).eval()
    mixed = channels_last_encoder(copy.deepcopy(plain), host=True)
    cl = torch.channels_last
    assert mixed.backbone.conv1.weight.is_contiguous(memory_format=cl)  # stem: channels-last (speed)
    assert mixed.backbone.layer2[1].conv2.weight.is_contiguous(memory_format=cl)  # 590 KB weights
    assert mixed.backbone.layer3[0].downsample[0].weight.is_contiguous()  # from the first > 1 MiB conv on
    assert mixed.backbone.layer4[1].conv2.weight.is_contiguous()
    assert not mixed.backbone.layer4[1].conv2.weight.is_contiguous(memory_format=cl)
    gpu_style = channels_last_encoder(copy.deepcopy(plain), host=False)
    assert gpu_style.backbone.layer4[1].conv2.weight.is_contiguous(memory_format=cl)
    x = torch.rand(3, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(mixed(x.contiguous(memory_format=cl)), plain(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("fill", "images", "k", "expected"), [(256, 2, 2, 8), (256, 2, 32, 128), (4, 2, 32, 4)]
)
def test_training_fill_batch_never_exceeds_two_inner_iterations(
    fill: int, images: int, k: int, expected: int
) -> None:
    assert PatchGDParams(fill_batch_size=fill).training_fill_batch(images, k) == expected


def test_inputs_and_layout_copies_rebuilt_in_backward_give_the_same_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step keeps recipes instead of its sampled patches and its host layout copies (memory); the
    gradients must equal plain autograd's, which keeps the tensors themselves."""
    import contextlib

    import bigslide.methods.encoder_layout as layout
    import bigslide.methods.patchgd as patchgd

    monkeypatch.setattr(layout, "HOST_CHANNELS_LAST_MAX_WEIGHT", 4096)  # a layout change inside test_resnet
    used: list[torch.Size] = []
    make = layout._Rebuild.__call__

    def counted(self: layout._Rebuild) -> torch.Tensor:
        out = make(self)
        used.append(out.shape)
        return out

    monkeypatch.setattr(layout._Rebuild, "__call__", counted)

    def grads(optimised: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(6)
        method = make_method(tiny=False, k=2, epsilon=2, head_width=8, channels_last=True)
        method.model.double()
        stepper = RecordingStepper(method.model)
        with contextlib.ExitStack() as stack:
            if not optimised:
                plain = stack.enter_context(pytest.MonkeyPatch.context())
                plain.setattr(patchgd, "rebuilt_in_backward", lambda *a: contextlib.nullcontext())
                plain.setattr(patchgd, "normalised_in_place", lambda encoder, x: (encoder, x))
            method.train_step(
                Batch(torch.rand(2, 3, 64, 96, dtype=torch.float64), torch.tensor([0, 2]), []), stepper
            )
        return stepper.grads[0]

    plain = grads(False)
    assert not used
    optimised = grads(True)
    assert torch.Size([4, 3, 32, 32]) in used  # the B·k sampled patches, re-gathered
    assert any(len(shape) == 4 and shape[1:] != (3, 32, 32) for shape in used)  # a layout copy, remade
    for name, value in plain.items():
        torch.testing.assert_close(
            optimised[name], value, atol=1e-12, rtol=1e-10, msg=lambda m, n=name: f"{n}: {m}"
        )
    assert any(v.abs().sum() > 0 for n, v in optimised.items() if n.startswith("encoder."))
