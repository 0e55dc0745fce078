"""torchrun with gloo on CPU: 2 ranks end with identical parameters equal to one process with the same
global batch (one process accumulating 2 bags per optimizer step)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from bigslide.engine import TrainConfig, run_to_end, train
from bigslide.engine.checkpoint import seed_everything
from bigslide.engine.setup import build_method
from bigslide.synthetic.slide_set import make_slide_set

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


FAULT_SCRIPT = """
import os, sys, time
from pathlib import Path
from bigslide.errors import TrainingError
from bigslide.methods.mil_baselines import FullBag

if os.environ["RANK"] == "1":
    original, calls = FullBag.train_step, []

    def faulty(self, batch, stepper):
        calls.append(1)
        if len(calls) == 2:
            Path(sys.argv[2]).write_text(str(time.time()))
            if sys.argv[3] == "raise":
                raise TrainingError("injected fault")
            time.sleep(3600)  # a rank that hangs instead of failing
        return original(self, batch, stepper)

    FullBag.train_step = faulty
from bigslide.cli.main import main
sys.exit(main(["train", sys.argv[1], "--quiet"]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_a_failing_rank_ends_every_rank_with_one_line(slide_csv: Path, tmp_path: Path, fault: str) -> None:
    config = config_for(slide_csv, tmp_path / "run", accumulate=1, max_steps=4)
    config.run.dist_timeout = 10.0
    cfg = config.to_yaml(tmp_path / "ddp.yaml")
    script = tmp_path / "faulty.py"
    script.write_text(FAULT_SCRIPT)
    marker = tmp_path / "fault-time"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*cmd, str(script), str(cfg), str(marker), fault], capture_output=True, text=True, timeout=600
    )
    ended = time.time()
    assert marker.is_file(), done.stderr[-3000:]
    assert done.returncode != 0
    assert ended - float(marker.read_text()) < 60
    ours = [line for line in done.stderr.splitlines() if line.startswith("bigslide: error:")]
    if fault == "raise":
        assert "bigslide: error: rank 1: injected fault" in ours
    assert any(line.startswith("bigslide: error: rank 0: stopped while averaging gradients") for line in ours)
    assert "[rank0]: Traceback" not in done.stderr  # rank 0 says it in one line


def _average_on_two_ranks(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from bigslide.engine.distributed import DistContext

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        params = [torch.nn.Parameter(torch.ones(3)) for _ in range(3)]
        params[0].grad = torch.full((3,), float(rank + 1))  # on both ranks
        params[1].grad = torch.full((3,), 4.0) if rank == 0 else None  # on rank 0 only
        # params[2] has no gradient anywhere: it is not in this step's graph
        DistContext(rank=rank, world=2).average_gradients(params)
        torch.save([p.grad for p in params], f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_parameters_without_gradients_stay_untouched_across_ranks(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_average_on_two_ranks, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        first, some, none = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(first, torch.full((3,), 1.5))
        assert torch.equal(some, torch.full((3,), 2.0))  # DDP's average: the missing rank counts zero
        assert none is None  # as in one process: weight decay and momentum leave it alone


@pytest.mark.slow
def test_ranks_validate_and_score_their_shares_and_rank_0_reports_what_one_process_does(
    slide_csv: Path, tmp_path: Path
) -> None:
    """Each rank predicts its share of the validation and test slides; rank 0 gathers them and computes the
    metrics and the decision threshold: metrics.json equal to one process's on the same weights, with 2 and
    with 3 ranks."""
    # 3 ranks: one has no validation slide
    records = _metrics_of_runs(slide_csv, tmp_path, {"single": 1, "ddp": 2, "ddp3": 3}, max_steps=2)
    single = records["single"]
    assert {"accuracy", "auc", "chosen_threshold"} <= set(single[0]["val"])
    for name in ("ddp", "ddp3"):
        ddp = records[name]
        assert [r["epoch"] for r in single if "val" in r] == [r["epoch"] for r in ddp if "val" in r] == [0]
        assert ddp[0]["val"] == single[0]["val"], name  # the two validation slides, on two of the ranks
        assert ddp[-1]["test"] == single[-1]["test"], name


@pytest.mark.slow
def test_training_metrics_of_two_ranks_count_each_training_slide_once(
    slide_csv: Path, tmp_path: Path
) -> None:
    """metrics.json's train figures were rank 0's share alone, padding included: with three training slides,
    two of them (one also trained on rank 1). They are now every rank's, each slide once: one process's."""
    import csv

    with slide_csv.open() as f:
        rows = list(csv.DictReader(f))
    train_rows = [r for r in rows if r["split"] == "train"]
    if len(train_rows) % 2 == 0:  # an odd count: the shares are padded
        rows.remove(train_rows[0])
    table = slide_csv.parent / "odd.csv"
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    records = _metrics_of_runs(table, tmp_path, {"single": 1, "ddp": 2}, max_steps=100)
    assert records["ddp"][0]["train"] == records["single"][0]["train"]


def _metrics_of_runs(
    table: Path, tmp_path: Path, runs: dict[str, int], max_steps: int
) -> dict[str, list[dict[str, Any]]]:
    """metrics.json of `bigslide train` on `table` for each run name, on its number of ranks (torchrun
    beyond one), at a learning rate that moves no weight visibly: every run scores the same model."""
    import json
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as torchrun gives each rank: the same sums everywhere
    records = {}
    for name, ranks in runs.items():
        config = config_for(table, tmp_path / name, accumulate=1, max_steps=max_steps)
        config.optim.lr = 1e-12
        config.run.tensorboard = False
        cfg = config.to_yaml(tmp_path / f"{name}.yaml")
        prefix = [sys.executable]
        if ranks > 1:
            prefix += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
        done = subprocess.run(
            [*prefix, "-m", "bigslide", "train", str(cfg), "--quiet"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        records[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    return records
