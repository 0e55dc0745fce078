"""What the command line prints while it trains, where its output goes to a log file (not a terminal)."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from bigslide.cli import progress
from bigslide.engine.decision import Decision
from bigslide.engine.events import Event, Loss, Message, Metrics, Progress
from bigslide.engine.run import RunResult


def _run(steps: int) -> Generator[Event, None, RunResult]:
    for step in range(1, steps + 1):
        yield Progress(step=step, total=steps, epoch=0)
        yield Loss(step=step, value=1.0 / step)
        if step == 2:
            yield Message("checkpoint written halfway")
    return RunResult(out_dir=Path("."), checkpoint=None, steps=steps)


def test_a_log_gets_whole_progress_lines_not_a_bar_redrawn_in_place(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)  # a line at every step
    result = progress.run_with_progress(_run(4))
    assert result.steps == 4
    printed = capsys.readouterr()
    assert "\r" not in printed.err + printed.out  # a carriage return makes one endless line of a log
    assert "checkpoint written halfway" in printed.out.splitlines()  # a message is a line of its own
    lines = printed.err.splitlines()
    assert any(line.startswith("2/4 batches (50%), ") and "batch/s" in line for line in lines)
    assert lines[-1].startswith("4/4 batches (100%)")
    assert lines[-1].endswith("loss=0.2500")


def test_a_log_gets_a_line_only_every_so_often_and_one_at_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    progress.run_with_progress(_run(50))  # far quicker than LOG_EVERY_S
    lines = [line for line in capsys.readouterr().err.splitlines() if "batches" in line]
    assert lines == [lines[-1]]
    assert lines[-1].startswith("50/50 batches (100%)")


def test_epochs_are_counted_from_one_as_the_decision_line_counts_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run() -> Generator[Event, None, RunResult]:
        for epoch in range(2):
            yield Metrics(epoch, "train", {"auc": 0.5})
            yield Metrics(epoch, "val", {"auc": 0.75})
        decision = Decision(0.4, "validation", 0.8, 1)  # chosen at the second epoch's validation
        yield Message(f"test split: {decision.describe(['normal', 'tumor'])}")
        yield Metrics(2, "test", {"auc": 1.0})  # scored once, after both epochs
        return RunResult(out_dir=Path("."), checkpoint=None, steps=2)

    progress.run_with_progress(run())
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" auc")[0] for line in lines if "auc=" in line] == [
        "epoch 1 train",
        "epoch 1 val  ",
        "epoch 2 train",
        "epoch 2 val  ",
        "test",
    ]
    assert lines[4].endswith("(balanced accuracy 0.800, epoch 2)")  # the epoch of the line "epoch 2 val"


def test_a_figure_that_cannot_be_computed_is_named_with_its_reason_not_printed_as_nan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run() -> Generator[Event, None, RunResult]:
        yield Metrics(0, "val", {"accuracy": 1.0, "auc": float("nan")})
        return RunResult(out_dir=Path("."), checkpoint=None, steps=1)

    progress.run_with_progress(run())
    line = capsys.readouterr().out.splitlines()[0]
    assert "nan" not in line
    assert line == "epoch 1 val   accuracy=1.000  (auc left out: the validation slides are all of one class)"
