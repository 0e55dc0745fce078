"""A method from an installed package (entry-point group `bigslide.methods`) is listed, trained and
predicted from the CLI like a built-in one: nothing in bigslide names it."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bigslide.synthetic.slide_set import make_slide_set

PACKAGE = '''
"""An outside package's method: mean colour of each tile through a small MLP, averaged over the bag."""
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from bigslide.methods import Method, MethodParams, Prediction, StepResult


@dataclass
class OutsideParams(MethodParams):
    width: int = field(default=8, metadata={"min": 1, "help": "hidden units"})


class OutsideMean(Method):
    name = "outside_mean"
    kind = "bag"
    Params = OutsideParams
    summary = "A method from an installed package."
    takes_uint8 = False

    def build_model(self):
        width = self.params.width
        return nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, self.spec.num_classes))

    def _tiles(self, x):
        return self.model(x.to(self.device).mean(dim=(2, 3)))

    def train_step(self, batch, stepper):
        with stepper.autocast():
            logits = self._tiles(batch.x).mean(dim=0, keepdim=True)
            loss = F.cross_entropy(logits.float(), batch.y)
        stepper.backward(loss)
        stepper.step()
        return StepResult(loss=float(loss.detach()), logits=logits.detach().float())

    def predict(self, sample):
        with torch.no_grad():
            tiles = self._tiles(sample.x)
        probs = torch.softmax(tiles.mean(dim=0), dim=-1).cpu().numpy()
        return Prediction(probs=probs, instance_scores=tiles[:, -1].cpu().numpy())
'''


def install(site: Path) -> None:
    """What `pip install` leaves in site-packages: the module and its dist-info with the entry point."""
    (site / "bigslide_outside.py").write_text(textwrap.dedent(PACKAGE))
    info = site / "bigslide_outside-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bigslide-outside\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[bigslide.methods]\noutside_mean = bigslide_outside:OutsideMean\n"
    )
    (info / "RECORD").write_text("")


def bigslide(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "bigslide", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
def test_an_installed_packages_method_trains_and_predicts_from_the_cli(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install(site)
    listed = bigslide(site, "methods")
    assert listed.returncode == 0, listed.stderr
    assert "outside_mean" in listed.stdout

    table = make_slide_set(tmp_path / "slides", n_slides=4, size=(512, 512), seed=2)
    trained = bigslide(
        site, "train", "--method", "outside_mean", "--set", f"data.csv={table}", "--set", "data.tile_size=32",
        "--set", "data.bag_size=8", "--set", "method.params.width=4", "--max-steps", "2",
        "--device", "cpu", "--out", str(tmp_path / "run"), "--quiet",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    assert checkpoint.is_file()

    predicted = bigslide(
        site, "predict", "--slides", str(table), "--checkpoint", str(checkpoint),
        "--out", str(tmp_path / "predictions"), "--device", "cpu", "--no-heatmaps",
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    with (tmp_path / "predictions" / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    for row in rows:
        probs = [float(v) for k, v in row.items() if k.startswith("p_")]
        assert sum(probs) == pytest.approx(1.0, abs=1e-4), row

    # without the package, its checkpoint is refused naming the method, not with a traceback
    bare = subprocess.run(
        [sys.executable, "-m", "bigslide", "predict", "--slides", str(table), "--checkpoint", str(checkpoint),
         "--out", str(tmp_path / "bare"), "--device", "cpu"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bare.returncode != 0
    assert "unknown method 'outside_mean'" in bare.stderr
    assert "Traceback" not in bare.stderr
