"""Full-image gradient descent baseline: one plain backward and one optimizer step per batch."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bigslide.memory.stepper import OptimStepper
from bigslide.methods.base import Batch, ModelSpec, Sample
from bigslide.methods.full_image import FullImage, FullImageParams

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_method(backbone: str = "test_resnet", **params: object) -> FullImage:
    method = FullImage(FullImageParams(**params), ModelSpec(backbone, num_classes=3), CPU)  # type: ignore[arg-type]
    method.model.train()
    return method


def test_registered_as_an_image_method():
    from bigslide.methods.base import _REGISTRY

    assert _REGISTRY["full_image"] is FullImage
    assert FullImage.kind == "image"


@pytest.mark.parametrize("channels_last", [True, False])
def test_one_step_applies_the_plain_full_image_gradient(channels_last: bool):
    torch.manual_seed(0)
    method = make_method(channels_last=channels_last)
    reference = copy.deepcopy(method.model)
    x, y = torch.rand(2, 3, 64, 64), torch.tensor([0, 2])
    optimizer = torch.optim.SGD(method.model.parameters(), lr=0.5)
    result = method.train_step(Batch(x, y, []), OptimStepper(optimizer))
    assert result.optimizer_steps == 1
    assert result.logits.shape == (2, 3)
    loss = F.cross_entropy(reference(x), y)
    loss.backward()
    assert result.loss == pytest.approx(float(loss.detach()), rel=1e-5)
    for (name, moved), (_, start) in zip(method.model.named_parameters(), reference.named_parameters()):
        expected = start.detach() - 0.5 * (start.grad if start.grad is not None else 0)
        torch.testing.assert_close(
            moved.detach(), expected, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_a_few_steps_learn_a_tiny_task():
    torch.manual_seed(1)
    images = torch.rand(6, 3, 64, 64) * 0.3
    labels = torch.tensor([0, 1, 2] * 2)
    images[labels == 1, 0] += 0.6
    images[labels == 2, 2] += 0.6
    method = make_method()
    stepper = OptimStepper(torch.optim.Adam(method.model.parameters(), lr=1e-2))
    losses = [method.train_step(Batch(images, labels, []), stepper).loss for _ in range(12)]
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3])


def test_predict_gives_probabilities_for_a_vit_of_a_chosen_size():
    method = make_method("test_vit", img_size=64)
    method.model.eval()
    prediction = method.predict(Sample(torch.rand(3, 64, 64), 0, "s"))
    assert prediction.probs.shape == (3,)
    assert prediction.probs.sum() == pytest.approx(1.0, abs=1e-6)
    assert prediction.maps == {}
    assert prediction.instance_scores is None


def test_eval_batchnorm_trains_the_function_it_predicts_with():
    """bn_mode="eval": a training step computes the loss of the same function `predict` evaluates, and
    leaves the running statistics alone (batch statistics of one image are not the running ones)."""
    torch.manual_seed(2)
    method = make_method(bn_mode="eval")
    running = {k: v.clone() for k, v in method.model.state_dict().items() if "running" in k}
    x, y = torch.rand(1, 3, 64, 64), torch.tensor([1])
    stepper = OptimStepper(torch.optim.SGD(method.model.parameters(), lr=0.0))
    loss = method.train_step(Batch(x, y, []), stepper).loss
    assert all(torch.equal(v, method.model.state_dict()[k]) for k, v in running.items())
    assert method.model.training  # the mode is restored after the step
    method.model.eval()
    probs = method.predict(Sample(x[0], 1, "s")).probs
    assert loss == pytest.approx(-float(np.log(probs[1])), rel=1e-5)
