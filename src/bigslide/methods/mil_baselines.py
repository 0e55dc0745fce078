"""The two baselines ABMIL-ACC is measured against, through the same method protocol.

"full_bag": encoder and head on the whole bag in one graph and a plain backward — the unoptimised
truth, whose memory grows with the bag. "frozen_abmil": the usual two-stage MIL, a frozen encoder in
eval mode computes features without grad (cached per tile when tiles are not augmented, or read from
the feature store with `data.features`) and only the head trains.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from bigslide.data.transfer import send
from bigslide.methods.base import Batch, Sample, Stepper, StepResult, register
from bigslide.methods.instances import InstanceTerm, with_instances
from bigslide.methods.mil import BagStep, EndToEndParams, MILMethod, MILParams, bn_policy
from bigslide.methods.replay import (
    AutocastFactory,
    BackwardFn,
    encode_chunks,
    is_channels_last,
    move_chunk,
)
from bigslide.nn.mil import Aggregator, LossFn
from bigslide.nn.mil.base import batch_loss

if TYPE_CHECKING:
    from bigslide.memory.targets import Candidate, Settings, Target


def full_bag_backward(
    encoder: nn.Module,
    aggregator: Aggregator,
    bag: torch.Tensor,
    target: torch.Tensor,
    loss_fn: LossFn | None = None,
    *,
    autocast: AutocastFactory | None = None,
    backward: BackwardFn | None = None,
    bn_mode: str = "eval",
    encode_chunk_size: int | None = None,
    sizes: Sequence[int] | None = None,
    instance: InstanceTerm | None = None,
) -> BagStep:
    """Forward the whole bag (or the batch of bags, `sizes` tiles each) with grad, then one backward;
    gradients accumulate in `.grad`. `instance`: the loss on annotated tiles, added to the bag loss.

    `encode_chunk_size` splits the encoder call (still one graph holding every activation); with
    "batch" BatchNorm that changes the statistics, otherwise only the random-number stream.
    """
    autocast = autocast or contextlib.nullcontext
    step = encode_chunk_size or bag.shape[0]
    with bn_policy(encoder, bn_mode, chunked=False), autocast():
        z = torch.cat([encoder(bag[start : start + step]) for start in range(0, bag.shape[0], step)])
        loss, logits, attention = batch_loss(aggregator, z, sizes or [z.shape[0]], target, loss_fn)
        loss = with_instances(loss, instance, aggregator, z)
    (backward or torch.Tensor.backward)(loss)
    return BagStep(loss.detach(), logits.detach(), None if attention is None else attention.detach())


@register
class FullBag(MILMethod[EndToEndParams]):
    name = "full_bag"
    display_name = "Full bag, reference"
    Params = EndToEndParams
    summary = "End-to-end attention MIL with the whole bag in one graph (memory grows with the bag)."
    plan_preference = 1

    @classmethod
    def plan(cls, target: Target, settings: Settings) -> list[Candidate]:
        from bigslide.memory.targets import Candidate
        from bigslide.methods.calibration import calibrate_full_bag

        model = calibrate_full_bag(settings, target.tile, target.bag, name=cls.name)
        peak = model.peak(input_bytes=12 * target.bag * target.tile**2, tiles=target.bag)
        return [Candidate(cls.name, {}, peak, note="whole bag in one graph")]

    def train_step(self, batch: Batch, stepper: Stepper) -> StepResult:
        p = self.params
        model = self.mil_model
        layout = is_channels_last(model.encoder)
        step = full_bag_backward(
            model.encoder,
            model.aggregator,
            move_chunk(batch.x, self.device, self.colour(batch.samples), channels_last=layout),
            send(batch.y, self.device),
            self.loss,
            autocast=stepper.autocast,
            backward=stepper.backward,
            bn_mode=p.bn_mode,
            sizes=batch.sizes,
            instance=self.instances(batch),
        )
        stepper.step()
        return StepResult(loss=step.loss, logits=step.logits.float())


@dataclass
class FrozenParams(MILParams):
    cache_features: bool = field(
        default=True,
        metadata={
            "label": "keep tile features between epochs",
            "help": "reuse each tile's features across epochs; turn off when tiles are augmented",
        },
    )
    cache_mb: int = field(
        default=1024,
        metadata={"label": "feature cache (MB)", "min": 0, "help": "memory limit of the feature cache (MB)"},
    )


class FeatureCache:
    """Least-recently-used features per tile key, bounded in bytes, kept on the CPU."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._rows: OrderedDict[tuple[object, ...], torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: tuple[object, ...]) -> torch.Tensor | None:
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
        return row

    def put(self, key: tuple[object, ...], row: torch.Tensor) -> None:
        size = row.numel() * row.element_size()
        if size > self.max_bytes:
            return
        old = self._rows.pop(key, None)
        if old is not None:
            self.bytes -= old.numel() * old.element_size()
        self._rows[key] = row
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._rows.popitem(last=False)
            self.bytes -= evicted.numel() * evicted.element_size()


@register
class FrozenABMIL(MILMethod[FrozenParams]):
    name = "frozen_abmil"
    display_name = "Frozen encoder + ABMIL"
    Params = FrozenParams
    summary = (
        "Frozen encoder features (cached per tile, or stored per slide), only the attention-MIL head trains."
    )

    def build_model(self) -> nn.Module:
        model = super().build_model()
        self._freeze_encoder(model)
        p = self.params
        self.cache = FeatureCache(p.cache_mb * 2**20)
        return model

    @staticmethod
    def _freeze_encoder(model: nn.Module) -> None:
        encoder = model.get_submodule("encoder")
        encoder.requires_grad_(False)
        encoder.eval()

    def frozen_encoder(self) -> nn.Module:
        return self.mil_model.encoder

    def features(self, sample: Sample | None, bag: torch.Tensor) -> torch.Tensor:
        if sample is not None and sample.features:  # rows of the feature store: nothing to encode
            return bag.to(self.device, torch.float32, non_blocking=True)
        p = self.params
        encoder = self.mil_model.encoder
        encoder.eval()  # the engine's model.train() must not switch the frozen encoder's BN/dropout on
        chunk = max(1, p.inference_chunk_size)
        colour = self.colour([sample]) if sample is not None else None
        if (
            not p.cache_features
            or sample is None
            or sample.coords is None
            or len(sample.coords) != bag.shape[0]
            or (colour is not None and colour.random)  # stain-augmented tiles: features of this draw only
        ):
            return encode_chunks(encoder, bag, chunk, device=self.device, colour=colour)
        keys = sample.tile_keys()
        rows: list[torch.Tensor | None] = [self.cache.get(key) for key in keys]
        missing = [i for i, row in enumerate(rows) if row is None]
        if missing:
            index = torch.as_tensor(missing, device=bag.device)
            subset = None if colour is None else colour[torch.as_tensor(missing)]
            fresh = encode_chunks(
                encoder, bag.index_select(0, index), chunk, device=self.device, colour=subset
            ).cpu()
            for i, row in zip(missing, fresh):
                rows[i] = row.clone()
                self.cache.put(keys[i], rows[i])  # type: ignore[arg-type]
        return torch.stack(rows).to(self.device)  # type: ignore[arg-type]

    def train_step(self, batch: Batch, stepper: Stepper) -> StepResult:
        aggregator = self.mil_model.aggregator
        target = batch.y.to(self.device)
        sizes = batch.sizes or [batch.x.shape[0]]
        bags = batch.x.split(sizes)  # they stay on the host; `features` moves chunks
        samples: list[Sample | None] = list(batch.samples) if len(batch.samples) == len(sizes) else []
        z = torch.cat([self.features(s, bag) for s, bag in zip(samples or [None] * len(sizes), bags)])
        with stepper.autocast():
            loss, logits, _ = batch_loss(aggregator, z, sizes, target, self.loss)
            loss = with_instances(loss, self.instances(batch), aggregator, z)
        stepper.backward(loss)
        stepper.step()
        return StepResult(loss=loss.detach(), logits=logits.detach().float())
