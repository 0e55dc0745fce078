"""What every bench shares: timing a call, min / median summaries, and targets checked against this
run's measurements.

A bench states a target only through `Targets.check`, with a value it measured in the same invocation;
the verdict line is printed from that comparison, and `exit_code` is non-zero when any target was missed
(unless the user asked only for a report with `--no-targets`).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def add_target_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-targets",
        action="store_true",
        help="only report: exit 0 even when a stated target is missed",
    )


def timed(fn: Callable[[], object]) -> float:
    """Seconds `fn()` takes (wall clock)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def min_median(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        raise ValueError("min_median: no measurements")
    return min(values), statistics.median(values)


@dataclass(frozen=True)
class Verdict:
    what: str
    value: float
    limit: float
    at_most: bool

    @property
    def met(self) -> bool:
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def line(self) -> str:
        op = "<=" if self.at_most else ">="
        return f"target {self.what}: {self.value:.3f} {op} {self.limit:g}: {'met' if self.met else 'MISSED'}"


@dataclass
class Targets:
    """The targets one bench run checked. `enforce` False (`--no-targets`) reports misses without failing."""

    enforce: bool = True
    verdicts: list[Verdict] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Targets:
        return cls(enforce=not getattr(args, "no_targets", False))

    def check(self, what: str, value: float, limit: float, *, at_most: bool = True) -> bool:
        """Compare a value measured in this run with its target; print and remember the verdict."""
        verdict = Verdict(what, float(value), float(limit), at_most)
        if verdict.value != verdict.value:  # NaN: nothing was measured, so nothing was met
            self.fail(f"{what}: no measurement")
            return False
        self.verdicts.append(verdict)
        print(verdict.line(), flush=True)
        return verdict.met

    def fail(self, what: str) -> None:
        """A target that could not be checked (a side failed, ran out of memory): counted as missed."""
        self.unchecked.append(what)
        print(f"target {what}: not measured: MISSED", flush=True)

    @property
    def missed(self) -> int:
        return sum(not v.met for v in self.verdicts) + len(self.unchecked)

    def exit_code(self) -> int:
        total = len(self.verdicts) + len(self.unchecked)
        if total:
            note = "" if self.enforce or not self.missed else " (--no-targets: exit 0)"
            print(f"targets: {total - self.missed} of {total} met{note}", flush=True)
        return 1 if self.enforce and self.missed else 0


def machine_line() -> str:
    """Machine and software a bench ran on, printed at the top of every bench's output."""
    import os

    import torch

    cpu = platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (
        f"machine: {os.cpu_count()} CPU cores ({cpu}), {gpu}; torch {torch.__version__}, "
        f"Python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f}"
    )
