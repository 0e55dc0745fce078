"""`losses.csv` in the run folder: one `step,epoch,loss` row per batch, flushed as it is written.

Other programs (a plot, a test, `tail -f`) can follow a run through it. On resume the file is cut back to
the checkpoint's step, so it always holds exactly the losses of the model the run continues from.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TextIO

HEADER = ("step", "epoch", "loss")


class LossLog:
    """Appends one row per step to `path`; `truncate_after(step)` drops the rows of later steps."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: TextIO | None = None

    def start(self, *, resume_step: int | None) -> None:
        """Open for appending; a fresh run (`resume_step` None) starts an empty file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None or not self.path.is_file():
            self.path.write_text(",".join(HEADER) + "\n")
        else:
            self.truncate_after(resume_step)
        self._file = self.path.open("a", newline="")

    def truncate_after(self, step: int) -> None:
        """Keep the header and the rows of steps <= `step` (a killed run may have logged more)."""
        with self.path.open(newline="") as f:
            rows = list(csv.reader(f))
        kept = [row for row in rows[1:] if len(row) == 3 and _is_step(row[0]) and int(row[0]) <= step]
        with self.path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(HEADER)
            writer.writerows(kept)

    def write(self, step: int, epoch: int, loss: float) -> None:
        if self._file is None:
            return
        self._file.write(f"{step},{epoch},{loss!r}\n")
        self._file.flush()  # in the OS's hands now: a killed process loses no row

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_losses(path: str | Path) -> list[tuple[int, int, float]]:
    """The (step, epoch, loss) rows of a `losses.csv`."""
    with Path(path).open(newline="") as f:
        rows = list(csv.reader(f))
    return [(int(s), int(e), float(v)) for s, e, v in rows[1:] if _is_step(s)]


def _is_step(value: str) -> bool:
    return value.isdigit()
