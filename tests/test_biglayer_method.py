"""The Big-Layer methods train end to end on tiny bags and images and predict in the protocol's shapes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from bigslide.memory.stepper import OptimStepper
from bigslide.methods.base import Batch, ModelSpec, Sample
from bigslide.methods.biglayer import BigLayerImage, BigLayerImageParams, BigLayerMIL, BigLayerMILParams
from bigslide.methods.replay import is_channels_last
from bigslide.nn.backbones import create_encoder
from bigslide.nn.big import BigConv2d, track_device_memory

CPU = torch.device("cpu")


def bag_batch(n: int, label: int, side: int = 32) -> Batch:
    torch.manual_seed(label + n)
    x = torch.rand(n, 3, side, side)
    coords = np.stack([np.arange(n) * side, np.zeros(n)], axis=1).astype(np.int64)
    sample = Sample(x=x, y=label, slide=f"slide{label}", coords=coords, tile_size_level0=side)
    return Batch(x=x, y=torch.tensor([label]), samples=[sample])


def snapshot(method: BigLayerMIL | BigLayerImage) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in method.model.named_parameters()}


# The exactness tests run with the encoder (and its host activations) in the standard and in channels-last
# memory (`run.channels_last`).
LAYOUTS = pytest.mark.parametrize("channels_last", ["off", "on"], ids=["nchw", "channels_last"])


@LAYOUTS
def test_biglayer_mil_loss_is_the_native_whole_bag_loss_and_training_moves_it(channels_last: str) -> None:
    torch.manual_seed(0)
    params = BigLayerMILParams(stages=1, budget_mb=2.0, aggregator="abmil", bn_mode="batch")
    spec = ModelSpec(backbone="resnet18", num_classes=3, channels_last=channels_last)
    method = BigLayerMIL(params, spec, CPU)
    assert isinstance(method.model.encoder.backbone.layer1[0].conv1, BigConv2d)
    assert is_channels_last(method.model) == (channels_last == "on")
    # The same weights as a plain encoder: BatchNorm over the whole bag makes the losses equal.
    native = create_encoder("resnet18")
    native.load_state_dict(method.model.encoder.state_dict())
    aggregator = copy.deepcopy(method.model.aggregator)
    batch = bag_batch(6, 2)
    native_loss = torch.nn.functional.cross_entropy(aggregator(native(batch.x))[0], batch.y)

    before = snapshot(method)
    stepper = OptimStepper(torch.optim.Adam(method.trainable_parameters(), lr=1e-3))
    with track_device_memory() as meter:
        first = method.train_step(batch, stepper)
    assert first.loss == pytest.approx(float(native_loss.detach()), rel=1e-5)
    assert meter.max_partition_bytes <= 2 * 2**20
    assert meter.partitions > 2 * 11  # the 2 MiB budget split some of the 11 big layers
    losses = [first.loss] + [method.train_step(batch, stepper).loss for _ in range(3)]
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]  # four steps on one bag fit it
    assert first.logits.shape == (1, 3)
    assert stepper.steps == 4
    after = snapshot(method)
    for name in (
        "encoder.backbone.conv1.weight",
        "encoder.backbone.layer1.0.bn1.weight",
        "encoder.backbone.fc",
    ):
        if name in before:
            assert not torch.equal(before[name], after[name]), name

    method.model.eval()
    sample = bag_batch(5, 1).samples[0]
    prediction = method.predict(sample)
    assert prediction.probs.shape == (3,)
    assert prediction.probs.sum() == pytest.approx(1.0, abs=1e-5)
    assert prediction.instance_scores is not None
    assert prediction.instance_scores.shape == (5,)


@pytest.mark.parametrize("bn_mode", ["batch", "eval"])
def test_biglayer_mil_predicts_with_the_function_it_trains(bn_mode: str) -> None:
    """Prediction normalises a bag with the statistics a training step uses: the bag's own ("batch"; a
    bag is one slide, with running statistics the learning bench's test slides ranked inversely) or the
    running ones ("eval"), and leaves the running statistics and the modes as they were."""
    torch.manual_seed(2)
    params = BigLayerMILParams(stages=1, budget_mb=4.0, aggregator="abmil", bn_mode=bn_mode)  # type: ignore[arg-type]
    method = BigLayerMIL(params, ModelSpec(backbone="test_resnet", num_classes=2), CPU)
    stepper = OptimStepper(torch.optim.SGD(method.trainable_parameters(), lr=0.05))
    for label in (0, 1, 0):
        method.train_step(bag_batch(6, label), stepper)
    method.model.eval()
    running = {k: v.clone() for k, v in method.model.state_dict().items() if "running" in k}
    bag = bag_batch(5, 1).samples[0].x + 0.5  # brighter than any training bag
    probs = method.predict(Sample(x=bag, y=1, slide="s", coords=np.zeros((5, 2)), tile_size_level0=32)).probs
    after = {k: v for k, v in method.model.state_dict().items() if "running" in k}
    assert all(torch.equal(running[k], after[k]) for k in running)  # prediction left them alone
    assert not any(m.training for m in method.model.modules())  # and the eval mode too

    # A training step on that bag (learning rate 0) computes the loss of the predicted probabilities.
    method.model.train()
    frozen = OptimStepper(torch.optim.SGD(method.trainable_parameters(), lr=0.0))
    loss = method.train_step(Batch(x=bag, y=torch.tensor([1]), samples=[]), frozen).loss
    assert loss == pytest.approx(-float(np.log(probs[1])), rel=1e-4)


@pytest.mark.parametrize("bn_mode", ["eval", "frozen"])
def test_biglayer_mil_attention_ranks_the_one_differing_tile_first(bn_mode: str) -> None:
    """Trained on bags of 8 noise tiles where positives hold one tile with a dark blob, the model finds
    the blob tile in a bag of 32 and ranks it first. With whole-bag statistics ("batch") it ranked that
    tile last on every seed tried: it read the bag's composition through the normalisation instead."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)

    def bag(n: int, lesion: int | None) -> torch.Tensor:
        x = 0.5 + 0.15 * torch.rand(n, 3, 16, 16, generator=gen)
        if lesion is not None:
            x[lesion, :, 4:12, 4:12] = 0.1
        return x

    params = BigLayerMILParams(stages=1, budget_mb=4.0, bn_mode=bn_mode)  # type: ignore[arg-type]
    method = BigLayerMIL(params, ModelSpec(backbone="test_resnet", num_classes=2), CPU)
    method.model.train()
    stepper = OptimStepper(torch.optim.Adam(method.trainable_parameters(), lr=2e-3))
    for step in range(30):
        label = step % 2
        lesion = int(torch.randint(8, (1,), generator=gen)) if label else None
        method.train_step(Batch(x=bag(8, lesion), y=torch.tensor([label]), samples=[]), stepper)
    method.model.eval()
    for lesion in (3, 17, 30):
        sample = Sample(x=bag(32, lesion), y=1, slide="s", coords=np.zeros((32, 2)), tile_size_level0=16)
        positive = method.predict(sample)
        negative = method.predict(Sample(x=bag(32, None), y=0, slide="s"))
        assert positive.instance_scores is not None
        assert int(np.argmax(positive.instance_scores)) == lesion
        assert positive.probs[1] > 0.9 > negative.probs[1]


@pytest.mark.parametrize("aggregator", ["abmil_gated", "transmil", "dtfd"])
def test_biglayer_mil_runs_every_aggregator(aggregator: str) -> None:
    torch.manual_seed(1)
    params = BigLayerMILParams(stages=0, budget_mb=4.0, aggregator=aggregator)
    method = BigLayerMIL(params, ModelSpec(backbone="resnet18", num_classes=2), CPU)
    before = snapshot(method)
    stepper = OptimStepper(torch.optim.SGD(method.trainable_parameters(), lr=0.1))
    result = method.train_step(bag_batch(4, 1), stepper)
    assert np.isfinite(result.loss)
    changed = [k for k, v in snapshot(method).items() if not torch.equal(v, before[k])]
    assert "encoder.backbone.conv1.weight" in changed
    method.model.eval()
    prediction = method.predict(bag_batch(7, 0).samples[0])
    assert prediction.instance_scores is not None
    assert prediction.instance_scores.shape == (7,)


def test_biglayer_image_trains_on_whole_images() -> None:
    torch.manual_seed(2)
    params = BigLayerImageParams(stages=2, budget_mb=4.0)
    method = BigLayerImage(params, ModelSpec(backbone="resnet18", num_classes=2), CPU)
    x = torch.rand(2, 3, 48, 48)
    samples = [Sample(x=x[i], y=i, slide=f"s{i}") for i in range(2)]
    batch = Batch(x=x, y=torch.tensor([0, 1]), samples=samples)
    before = snapshot(method)
    stepper = OptimStepper(torch.optim.Adam(method.trainable_parameters(), lr=1e-3))
    losses = [method.train_step(batch, stepper).loss for _ in range(3)]
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]
    after = snapshot(method)
    assert not torch.equal(before["encoder.backbone.conv1.weight"], after["encoder.backbone.conv1.weight"])
    assert not torch.equal(before["head.weight"], after["head.weight"])
    method.model.eval()
    prediction = method.predict(samples[0])
    assert prediction.probs.shape == (2,)
    assert prediction.probs.sum() == pytest.approx(1.0, abs=1e-5)


@LAYOUTS
def test_biglayer_image_eval_batchnorm_trains_the_function_it_predicts_with(channels_last: str) -> None:
    """bn_mode="eval" (full_image's): a training step on one image computes the loss of the function
    `predict` evaluates and leaves the running statistics alone; "batch" normalises that image by its
    own statistics, another function."""
    torch.manual_seed(3)
    params = BigLayerImageParams(stages=1, budget_mb=4.0, bn_mode="eval")
    spec = ModelSpec(backbone="test_resnet", num_classes=2, channels_last=channels_last)
    method = BigLayerImage(params, spec, CPU)
    for name, value in method.model.state_dict().items():
        if "running_mean" in name:  # away from their initial zeros, as after training
            value.uniform_(-0.2, 0.2)
    running = {k: v.clone() for k, v in method.model.state_dict().items() if "running" in k}
    x, y = torch.rand(1, 3, 48, 48), torch.tensor([1])
    stepper = OptimStepper(torch.optim.SGD(method.trainable_parameters(), lr=0.0))
    method.model.train()
    loss = method.train_step(Batch(x=x, y=y, samples=[]), stepper).loss
    assert method.model.training  # the mode is restored after the step
    assert all(torch.equal(v, method.model.state_dict()[k]) for k, v in running.items())
    method.model.eval()
    predicted = -float(np.log(method.predict(Sample(x=x[0], y=1, slide="s")).probs[1]))
    assert loss == pytest.approx(predicted, rel=1e-5)

    method.params.bn_mode = "batch"
    method.model.train()
    assert method.train_step(Batch(x=x, y=y, samples=[]), stepper).loss != pytest.approx(predicted, rel=1e-3)
