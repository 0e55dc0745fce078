"""Full-image gradient descent: the plain baseline PatchGD is compared with.

A timm encoder reads the whole image and its linear classifier gives the logits; one backward pass and one
optimizer step per batch. Memory grows with the image area, which is what PatchGD avoids.
Forward passes run under `stepper.autocast()` (bf16/fp16 on CUDA).

BatchNorm: `bn_mode` (see `bigslide.methods.batchnorm`); "eval" for batches of one slide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from bigslide.data.sample import to_device
from bigslide.methods.base import (
    Batch,
    Method,
    MethodParams,
    Prediction,
    Sample,
    Stepper,
    StepResult,
    register,
)
from bigslide.methods.batchnorm import IMAGE_BN_MODE_HELP, ImageBnMode, frozen_batchnorm

if TYPE_CHECKING:
    from bigslide.memory.targets import Candidate, Settings, Target

__all__ = ["FullImage", "FullImageParams"]


@dataclass
class FullImageParams(MethodParams):
    img_size: int = field(
        default=0,
        metadata={
            "label": "input side (px, 0 = the backbone's)",
            "min": 0,
            "help": "Input size for fixed-size backbones (ViTs); 0 = the backbone's default.",
        },
    )
    channels_last: bool = field(
        default=True,
        metadata={"label": "channels-last memory", "help": "Feed images in channels-last memory format."},
    )
    bn_mode: ImageBnMode = field(
        default="batch", metadata={"label": "encoder normalisation", "help": IMAGE_BN_MODE_HELP}
    )


@register
class FullImage(Method[FullImageParams]):
    name = "full_image"
    display_name = "Whole image, standard"
    kind = "image"
    takes_uint8 = True
    Params = FullImageParams
    summary = "Standard training: the backbone sees the whole image in one pass."
    memory_params = ("img_size",)
    plan_preference = 0

    @classmethod
    def plan(cls, target: Target, settings: Settings) -> list[Candidate]:
        from bigslide.memory.targets import Candidate
        from bigslide.methods.calibration import calibrate_full_image

        model = calibrate_full_image(settings, target.image, name=cls.name)
        px = target.batch * target.image**2
        peak = model.peak(input_bytes=12 * px, px=px)
        return [Candidate(cls.name, {}, peak, note="whole image in one graph")]

    def build_model(self) -> nn.Module:
        extra: dict[str, object] = {"img_size": self.params.img_size} if self.params.img_size else {}
        model: nn.Module = self.spec.encoder(self.spec.outputs, **extra)
        if self.params.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    def _inputs(self, x: torch.Tensor, samples: list[Sample]) -> torch.Tensor:
        x = to_device(x, self.device, self.colour(samples))
        return x.contiguous(memory_format=torch.channels_last) if self.params.channels_last else x

    def train_step(self, batch: Batch, stepper: Stepper) -> StepResult:
        y = batch.y.to(self.device, non_blocking=True).long()
        with stepper.autocast(), frozen_batchnorm(self.model, self.params.bn_mode == "eval"):
            logits = self.model(self._inputs(batch.x, batch.samples))
            loss = self.loss(logits, y)
        stepper.backward(loss)
        stepper.step()
        return StepResult(loss=loss.detach(), logits=logits.detach().float(), optimizer_steps=1)

    def predict(self, sample: Sample) -> Prediction:
        with torch.no_grad():
            logits = self.model(self._inputs(sample.x[None], [sample]))
        return Prediction(probs=self.outputs(logits)[0].cpu().numpy())
