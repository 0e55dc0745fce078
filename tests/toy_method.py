"""A method written the way a user would add one: its own params, model, step and prediction, registered
from outside the package. The tests use it to show that the engine, the CLI, the planner and the napari
Train panel need nothing else to run it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from bigslide.data.sample import Batch, Sample
from bigslide.methods import base
from bigslide.methods.base import Method, MethodParams, Prediction, Stepper, StepResult


@dataclass
class ToyParams(MethodParams):
    width: int = field(default=8, metadata={"help": "hidden units"})
    pooling: str = field(default="mean", metadata={"help": "how tile scores become a bag score"})


class ToyTileMean(Method):
    name = "toy_tile_mean"
    kind = "bag"
    Params = ToyParams
    summary = "Mean colour of each tile through a small MLP, averaged over the bag."
    memory_params = ("width",)
    map_titles: ClassVar[dict[str, str]] = {"attention": "tile score"}

    params: ToyParams

    def build_model(self) -> nn.Module:
        width = self.params.width
        return nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, self.spec.num_classes))

    def _tile_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.to(self.device).mean(dim=(2, 3)))

    def train_step(self, batch: Batch, stepper: Stepper) -> StepResult:
        with stepper.autocast():
            logits = self._tile_logits(batch.x).mean(dim=0, keepdim=True)
            loss = F.cross_entropy(logits.float(), batch.y)
        stepper.backward(loss)
        stepper.step()
        return StepResult(loss=float(loss.detach()), logits=logits.detach().float())

    def predict(self, sample: Sample) -> Prediction:
        with torch.no_grad():
            tiles = self._tile_logits(sample.x)
        probs = torch.softmax(tiles.mean(dim=0), dim=-1).cpu().numpy()
        return Prediction(probs=probs, instance_scores=tiles[:, -1].cpu().numpy().astype(np.float32))


@pytest.fixture
def toy_method() -> Iterator[type[Method]]:
    base.register(ToyTileMean)
    try:
        yield ToyTileMean
    finally:
        del base._REGISTRY[ToyTileMean.name]
