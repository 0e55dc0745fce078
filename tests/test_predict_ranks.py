"""`bigslide predict` under torchrun (gloo on CPU): the slides to do are shared across the ranks, a case's
slides on one rank, and rank 0 writes the same `predictions.csv` one process writes; a rerun with another
number of ranks predicts only what is missing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bigslide.cli.predict import rank_share
from bigslide.data.table import SlideTable
from bigslide.synthetic.slide_set import make_slide_set
from tests.test_predict_cohort import make_checkpoint


def _predict(ranks: int, argv: list[str]) -> subprocess.CompletedProcess[str]:
    # one thread per process, as torchrun gives each rank: the same sums in the same order everywhere
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    prefix = [sys.executable, "-m", "bigslide"]
    if ranks > 1:
        prefix = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
        ]
        prefix += ["-m", "bigslide"]
    command = [*prefix, "predict", "--device", "cpu", "--quiet", "--workers", "1", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def test_cases_stay_on_one_rank_and_every_slide_to_do_is_dealt_once(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("slide,label,case\n" + "".join(f"s{i}.svs,a,c{i // 2}\n" for i in range(7)))
    table = SlideTable.from_csv(csv, labels_required=False, check_files=False)
    todo = [0, 1, 2, 4, 5, 6]  # row 3 done; its case-mate (2) still to do
    shares = [rank_share(table, todo, r, 3) for r in range(3)]
    assert sorted(row for share in shares for row in share) == todo
    for share in shares:
        cases = {table.entries[row].case for row in share}
        assert all(
            table.entries[row].case not in cases for other in shares if other is not share for row in other
        )
    assert rank_share(table, todo, 0, 1) == todo


@pytest.mark.slow
def test_two_and_three_ranks_write_what_one_process_writes_and_resume_what_is_missing(tmp_path: Path) -> None:
    cohort = make_slide_set(tmp_path / "slides", n_slides=5, size=(512, 512), seed=8)
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    outs = {n: tmp_path / f"ranks{n}" for n in (1, 2, 3)}
    for n, out in outs.items():
        done = _predict(n, ["--slides", str(cohort), "--checkpoint", str(ckpt), "--out", str(out)])
        assert done.returncode == 0, done.stderr[-3000:]
    one = (outs[1] / "predictions.csv").read_text()
    assert one.count("\n") == 6  # header and 5 slides
    for n in (2, 3):
        assert (outs[n] / "predictions.csv").read_text() == one, n  # order and values
        assert (outs[n] / "tissue_check.csv").read_text() == (outs[1] / "tissue_check.csv").read_text()
    said = _predict(2, ["--slides", str(cohort), "--checkpoint", str(ckpt), "--out", str(outs[3])]).stdout
    assert said.count("0 slides predicted") == 2  # both ranks: nothing left to do

    # a run stopped part way (two slides' rows gone): 2 ranks predict those two only
    rows = sorted((outs[3] / "slides").glob("*.json"))
    for row in rows[1:3]:
        row.unlink()
    done = _predict(2, ["--slides", str(cohort), "--checkpoint", str(ckpt), "--out", str(outs[3])])
    assert done.returncode == 0, done.stderr[-3000:]
    # the ranks' lines reach torchrun's stdout interleaved, not always a line each
    predicted = [int(n) for n in re.findall(r"rank \d+: (\d+) slides? predicted", done.stdout)]
    assert sorted(predicted) == [1, 1], done.stdout
    assert (outs[3] / "predictions.csv").read_text() == one


@pytest.mark.slow
def test_the_predict_bench_times_the_command_under_torchrun(tmp_path: Path) -> None:
    """`bench predict --ranks 1,2` runs the predict command as one process and as two ranks, both through to
    their CSV, and reports each against one rank."""
    command = [sys.executable, "-m", "bigslide", "bench", "predict", "--slides", "2", "--width", "1024"]
    command += ["--height", "1024", "--workers", "1", "--repeats", "1", "--no-targets"]
    command += ["--ranks", "1,2", "--rank-slides", "2"]
    done = subprocess.run(
        [*command, "--cache", str(tmp_path)], capture_output=True, text=True, timeout=600, env=os.environ
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "x 1 worker" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| 1 rank x 1 worker", "| 2 ranks x 1 worker"], (
        done.stdout
    )
    assert "failed" not in done.stdout
    assert "target predict, 2 ranks >= 0.8 x 2 x 1 rank" in done.stdout
    # prediction is held to the slower of its reading and its model, reading to the workers' decode floor
    assert "target predict, 1 worker >= 0.8 x min(reading, 1 worker; model alone)" in done.stdout
    assert "target reading, 1 worker >= 0.8 x 1 x decode floor" in done.stdout
    # what a worker does beyond the floor, timed apart, bounds what reading can reach
    assert "| tile grids alone (1 process, cold) |" in done.stdout
    assert "| decode and place the squares (1 process, grids given) |" in done.stdout
    work = re.search(
        r"decoding ([\d.]+) s \(the floor\), placing the squares in memory \+(-?[\d.]+) s, the tile grids "
        r"([\d.]+) s: reading can reach at most ([\d.]+) x the floor per worker",
        done.stdout,
    )
    assert work, done.stdout
    decode, place, grids, most = (float(v) for v in work.groups())
    assert grids > 0
    assert decode > 0
    assert most == pytest.approx(decode / (decode + place + grids), rel=0.1, abs=0.01)


DYING_RANK = """
import os, sys
from bigslide.cli import slide_rows
from bigslide.errors import DataError

if os.environ["RANK"] == "1":
    original = slide_rows.write_slide_outputs

    def write_then_end(*args, **kwargs):
        written = original(*args, **kwargs)
        if sys.argv[1] == "raise":
            raise DataError("injected fault after one slide")
        os._exit(9)  # killed: no message, no clean-up

    slide_rows.write_slide_outputs = write_then_end
from bigslide.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["raise", "killed"])
def test_a_rank_that_fails_or_dies_ends_the_run_and_a_rerun_predicts_only_the_rest(
    tmp_path: Path, fault: str
) -> None:
    cohort = make_slide_set(tmp_path / "slides", n_slides=6, size=(512, 512), seed=8)
    ckpt = make_checkpoint(tmp_path, "abmil_acc")
    clean, out = tmp_path / "clean", tmp_path / "out"
    argv = ["--slides", str(cohort), "--checkpoint", str(ckpt)]
    assert _predict(1, [*argv, "--out", str(clean)]).returncode == 0
    script = tmp_path / "dying.py"
    script.write_text(DYING_RANK)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [str(script), fault, "predict", "--device", "cpu", "--quiet", "--workers", "1", *argv]
    done = subprocess.run(
        [*command, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode != 0
    assert not (out / "predictions.csv").exists()  # no table from part of the cohort
    ours = [line for line in done.stderr.splitlines() if line.startswith("bigslide:")]
    if fault == "raise":
        assert "bigslide: error: rank 1: injected fault after one slide" in ours, done.stderr[-3000:]
    assert "[rank0]: Traceback" not in done.stderr
    written = sorted((out / "slides").glob("*.json"))
    assert 1 <= len(written) < 6  # rank 1 wrote one slide; rank 0 was stopped or finished its own
    for row in written:  # every slide written is whole
        json.loads(row.read_text())
    rerun = _predict(1, [*argv, "--out", str(out)])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (
        f"{6 - len(written)} slides predicted" in rerun.stdout
        or f"{6 - len(written)} slide predicted" in rerun.stdout
    ), rerun.stdout
    assert (out / "predictions.csv").read_text() == (clean / "predictions.csv").read_text()
