"""torchrun with gloo on CPU: 2 ranks end with identical parameters equal to one process with the same
global batch (one process accumulating 2 bags per optimizer step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bigslide.engine import TrainConfig, run_to_end, train
from bigslide.engine.checkpoint import seed_everything
from bigslide.engine.setup import build_method
from bigslide.synthetic.slides import make_slide_set

RANK_SCRIPT = """
import os, sys, torch
from bigslide.engine import TrainConfig, train, run_to_end
result = run_to_end(train(TrainConfig.from_yaml(sys.argv[1])))
torch.save(result.method.model.state_dict(), os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.pt"))
"""


@pytest.fixture(scope="module")
def slide_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slide_set(tmp_path_factory.mktemp("ddp-slides"), n_slides=8, size=(512, 512), seed=4)


def config_for(csv: Path, out: Path, *, accumulate: int, max_steps: int) -> TrainConfig:
    config = TrainConfig()
    config.data.csv = str(csv)
    config.data.tile_size = 32
    config.data.bag_size = 6
    config.data.augment = False
    config.method.name = "full_bag"
    config.optim.epochs = 1
    config.optim.max_steps = max_steps
    config.optim.accumulate = accumulate
    config.optim.optimizer = (
        "sgd"  # Adam would blow float rounding noise in zero gradients up to lr-sized steps
    )
    config.optim.lr = 1e-2
    config.run.out_dir = str(out)
    config.run.device = "cpu"
    config.run.deterministic = True
    return config


@pytest.mark.slow
def test_two_gloo_ranks_match_each_other_and_a_single_process(slide_csv: Path, tmp_path: Path) -> None:
    # 2 ranks x 2 batches (one bag each, step per bag) == 1 process x 4 batches, stepping every 2 bags
    ddp = config_for(slide_csv, tmp_path / "ddp", accumulate=1, max_steps=2)
    cfg = ddp.to_yaml(tmp_path / "ddp.yaml")
    (tmp_path / "ddp").mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*cmd, str(script), str(cfg), str(tmp_path / "ddp")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rank0 = torch.load(tmp_path / "ddp" / "rank0.pt")
    rank1 = torch.load(tmp_path / "ddp" / "rank1.pt")

    single = config_for(slide_csv, tmp_path / "single", accumulate=2, max_steps=4)
    reference = run_to_end(train(single)).method.model.state_dict()  # type: ignore[union-attr]

    params = [k for k in reference if "running" not in k and "num_batches" not in k]
    assert params
    for key in params:
        assert torch.equal(rank0[key], rank1[key]), key
        # float32 sums in another order: agreement to 1e-5 relative
        torch.testing.assert_close(rank0[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)
    seed_everything(single.run.seed)
    initial = build_method(single, ["normal", "tumor"], torch.device("cpu")).model.state_dict()
    assert sum(not torch.equal(initial[k], rank0[k]) for k in params) > len(params) // 2, "nothing trained"
