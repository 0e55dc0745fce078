"""Bench verdicts: every stated target is checked on a measured value, and a miss makes the command fail."""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path

import pytest

from bigslide.bench import acc, biglayer, biglayer_capacity, cohort, patchgd_report, plan_check
from bigslide.bench.targets import Targets, add_target_argument, min_median
from bigslide.cli.main import main as cli_main

MB = 2**20
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("checks", "enforce", "code"),
    [
        ([(0.8, 0.9, True)], True, 0),  # at most 0.9: met
        ([(0.95, 0.9, True)], True, 1),  # missed
        ([(3.0, 2.5, False)], True, 0),  # at least 2.5: met
        ([(2.0, 2.5, False), (0.1, 0.9, True)], True, 1),  # one of two missed
        ([(0.95, 0.9, True)], False, 0),  # --no-targets: reported, exit 0
        ([(math.nan, 0.9, True)], True, 1),  # nothing measured is not a pass
    ],
)
def test_targets_exit_code(
    checks: list[tuple[float, float, bool]], enforce: bool, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    targets = Targets(enforce=enforce)
    for value, limit, at_most in checks:
        targets.check("ratio", value, limit, at_most=at_most)
    assert targets.exit_code() == code
    out = capsys.readouterr().out
    assert ("MISSED" in out) == any(v != v or (v > lim if at_most else v < lim) for v, lim, at_most in checks)


def test_no_targets_flag_reaches_targets() -> None:
    parser = argparse.ArgumentParser()
    add_target_argument(parser)
    assert Targets.from_args(parser.parse_args([])).enforce
    assert not Targets.from_args(parser.parse_args(["--no-targets"])).enforce
    assert min_median([3.0, 1.0, 2.0]) == (1.0, 2.0)


def test_plan_check_exits_non_zero_on_a_missed_or_unmeasured_check() -> None:
    assert plan_check.verdicts({"full_image": 0.05, "patchgd": 0.12}, Targets()) == 0
    assert plan_check.verdicts({"full_image": 0.05, "patchgd": 0.20}, Targets()) == 1
    assert plan_check.verdicts({"full_image": math.nan}, Targets()) == 1  # out of memory while measuring
    assert plan_check.verdicts({"patchgd": 0.20}, Targets(enforce=False)) == 0
    assert plan_check.relative_error(115, 100) == pytest.approx(0.15)


def test_capacity_target_uses_the_deepest_configuration() -> None:
    assert biglayer_capacity.check_capacity({"native": 2048, "big3": 8192}, "big3", Targets()) == 0
    assert biglayer_capacity.check_capacity({"native": 2048, "big3": 5376}, "big3", Targets()) == 1
    assert biglayer_capacity.check_capacity({"native": 0, "big3": 1024}, "big3", Targets()) == 1


def _acc_memory(full: float, acc_small: float, acc_big: float, bag_mb: tuple[float, float]) -> dict:
    def entry(value: float, bag: float) -> dict:
        return {"bag_bytes": bag * MB, "host": [value * MB], "cuda": [value * MB]}

    return {
        "full_bag": {200: entry(full, bag_mb[0])},
        "abmil_acc": {200: entry(acc_small, bag_mb[0]), 2000: entry(acc_big, bag_mb[1])},
    }


@pytest.mark.parametrize(
    ("times", "memory", "cuda", "code"),
    [
        ((1.2, 1.0), (300, 100, 110, (10, 100)), False, 0),  # host: 200 / 90 MB above the bag: flat
        ((1.5, 1.0), (300, 100, 110, (10, 100)), False, 1),  # ACC too slow
        ((1.2, 1.0), (200, 100, 110, (10, 100)), False, 1),  # saves only 2x
        ((1.2, 1.0), (300, 100, 250, (10, 100)), False, 1),  # grows beyond its bag
        ((1.2, 1.0), (300, 100, 130, (10, 100)), True, 1),  # CUDA: the bag counts, 1.3x is not flat
        ((1.2, 1.0), (300, 100, 115, (10, 100)), True, 0),
    ],
)
def test_acc_targets(
    times: tuple[float, float], memory: tuple, cuda: bool, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    timing = {"abmil_acc": [times[0]] * 3, "full_bag": [times[1]] * 3}
    assert acc.check_targets(timing, _acc_memory(*memory), 200, 2000, cuda, Targets()) == code
    assert acc.check_targets(timing, _acc_memory(*memory), 200, 2000, cuda, Targets(enforce=False)) == 0
    assert "target full-bag / ACC step memory" in capsys.readouterr().out


def test_acc_memory_ratio_is_a_target_only_on_bags_of_eight_chunks_or_more(
    capsys: pytest.CaptureFixture[str],
) -> None:
    timing = {"abmil_acc": [1.2] * 3, "full_bag": [1.0] * 3}
    memory = _acc_memory(200, 100, 110, (10, 100))  # 2x: below the 2.5 target
    assert acc.check_targets(timing, memory, 200, 2000, False, Targets(), chunk=25) == 1
    assert "target full-bag / ACC step memory at bag 200 (host, bag counted): 2.000 >= 2.5: MISSED" in (
        capsys.readouterr().out
    )
    assert acc.check_targets(timing, memory, 200, 2000, False, Targets(), chunk=50) == 0  # 4 chunks
    out = capsys.readouterr().out
    assert "target full-bag" not in out
    assert "full-bag / ACC step memory at bag 200 (host, bag counted): 2.000; the >= 2.5 target" in out


def _reference_results(ours: tuple[float, float], loop: tuple[float, float]) -> dict:
    def side(seconds: float, mb: float) -> dict:
        return {"times": [seconds, seconds * 1.1], "memory": [mb * MB], "steps": 1, "k": 2, "zeta": 8}

    return {"bigslide PatchGD": side(*ours), "upstream loop": side(*loop)}


@pytest.mark.parametrize(
    ("size", "ours", "loop", "code"),
    [
        (512, (0.8, 100), (1.0, 110), 0),
        (512, (0.95, 100), (1.0, 110), 1),  # time ratio above 0.9
        (512, (0.8, 120), (1.0, 110), 1),  # more memory than the upstream loop
        (2048, (0.95, 300), (1.0, 310), 0),  # time is a target at 512² only
        (2048, (0.8, 320), (1.0, 310), 1),
    ],
)
def test_patchgd_reference_targets(
    size: int, ours: tuple[float, float], loop: tuple[float, float], code: int
) -> None:
    args = argparse.Namespace(backbone="resnet18", device="cpu", amp="none", rounds=2)
    targets = Targets()
    patchgd_report.print_reference(args, size, _reference_results(ours, loop), targets)
    assert targets.exit_code() == code
    failed = Targets()
    patchgd_report.print_reference(
        args, size, {**_reference_results(ours, loop), "upstream loop": {"error": "x"}}, failed
    )
    assert failed.exit_code() == 1  # a side that failed is not a met target


def test_patchgd_size_table_checks_memory_at_2048() -> None:
    args = argparse.Namespace(
        device="cpu",
        amp="none",
        threads=0,
        patch=128,
        epsilon=8,
        fill_batch_size=32,
        backbone="resnet18",
        batch=1,
        rounds=2,
    )

    def row(mb: float) -> dict:
        return {"times": [1.0], "memory": [mb * MB], "k": 32, "zeta": 8}

    for gd_mb, patchgd_mb, code in ((1800, 150, 0), (1800, 300, 1)):
        targets = Targets()
        rows = [(1024, {"full-image GD": row(480), "PatchGD, x": row(400)})]  # no target below 2048²
        rows.append((2048, {"full-image GD": row(gd_mb), "PatchGD, x": row(patchgd_mb)}))
        patchgd_report.print_sizes(args, rows, targets)
        assert targets.exit_code() == code
        assert len(targets.verdicts) == 1


def test_biglayer_bench_checks_time_and_the_meters_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "bench", "biglayer", "--model", "resnet10t", "--sides", "64,96", "--stages", "1", "--repeats", "1",
        "--warmup", "0", "--budget-mb", "1", "--out-dir", str(tmp_path),
    ]  # fmt: skip
    monkeypatch.setattr(biglayer, "TIME_TARGET", 100.0)
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "target big1 largest partition on the device / budget" in out
    assert "MISSED" not in out
    monkeypatch.setattr(biglayer, "TIME_TARGET", 0.0)  # no big layer runs in no time
    assert cli_main(argv) == 1
    assert cli_main([*argv, "--no-targets"]) == 0


def cohort_run(from_train: float, rss_end_mb: float = 1100, open_main: int = 40) -> dict:
    return {
        "from_train": from_train,
        "open_main": open_main,
        "main_rss": 1200 * MB,
        "main_rss_end": rss_end_mb * MB,
    }


@pytest.mark.parametrize(
    ("cached_s", "large_rss_mb", "failed", "missed"),
    [
        (1.0, 1103, 0, []),
        (3.0, 1103, 0, ["cached / cold"]),  # the cache saves less than three quarters of the start
        (1.0, 1200, 0, ["growth per 1,000 slides"]),  # 100 MB more for 1,000 more slides
        (1.0, 1103, 1, ["failed under ulimit"]),
    ],
)
def test_cohort_targets(
    cached_s: float, large_rss_mb: float, failed: int, missed: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    results = {
        1000: {"cold": [cohort_run(5.0)], "cached": [cohort_run(0.5)], "epoch": [cohort_run(0.5, 1100)]},
        2000: {
            "cold": [cohort_run(8.0), cohort_run(10.0)],
            "cached": [cohort_run(cached_s), cohort_run(cached_s)],
            "epoch": [cohort_run(cached_s, large_rss_mb)],
        },
    }
    targets = Targets()
    cohort._check(targets, results, [1000, 2000], failed, 1024)
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.endswith("MISSED")] == [
        line for line in out.splitlines() if line.endswith("MISSED") and any(m in line for m in missed)
    ]
    assert targets.missed == len(missed)
    assert f"({large_rss_mb - 1100:+.1f} MB per 1,000 slides)" in out


def test_benchmark_pages_are_rendered_from_saved_bench_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("gen_benchmarks", ROOT / "docs" / "gen_benchmarks.py")
    assert spec is not None
    assert spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    monkeypatch.setattr(gen, "OUTPUT", tmp_path)
    (tmp_path / "acc.txt").write_text(
        "$ bigslide bench acc --bag 100\ndate: 2026-11-23 15:54 UTC\n"
        "machine: 2 CPU cores (x86_64), no GPU; torch 2.14.1, Python 3.11.7, load average 3.0\n"
        "target ACC / full-bag step time (median): 1.500 <= 1.35: MISSED\nexit status: 1\n"
    )
    page = (
        "intro\n<!-- bench-summary -->\nold\n<!-- end bench-summary -->\n"
        "<!-- bench-output acc -->\n| old | 0.94 s |\n<!-- end bench-output -->\n"
        "<!-- bench-output grid -->\n1.15 s\n<!-- end bench-output -->\n"
    )
    out = gen.render(page)
    assert "0.94" not in out
    assert "1.15 s" not in out
    assert "`bigslide bench acc --bag 100`, 2026-11-23 15:54 UTC, exit status: 1" in out
    assert "1.500 <= 1.35: MISSED" in out
    assert "No saved run of `bigslide bench grid`" in out
    assert "| acc | 2 CPU cores (x86_64), no GPU; torch 2.14.1, Python 3.11.7 |" in out
    assert gen.render(out) == out
