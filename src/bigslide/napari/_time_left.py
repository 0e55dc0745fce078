"""How long a run has left, in words, from the times its steps arrived."""

from __future__ import annotations

WINDOW = 20
"""Recent steps the rate is taken over: a run's first steps (building the model, starting the decode
workers) and its validations are slower than the rest."""


class TimeLeft:
    """Feed it each step as it arrives; it says the time to the last step at the recent pace."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float]] = []

    def update(self, step: int, total: int, now: float) -> str:
        """'about 3 min left', or '' until two steps have come (and once the last one has)."""
        self.marks = [*self.marks[-(WINDOW - 1) :], (step, now)]
        (first, start), (last, end) = self.marks[0], self.marks[-1]
        if last <= first or step >= total:
            return ""
        return f"about {duration_words((end - start) / (last - first) * (total - step))} left"


def duration_words(seconds: float) -> str:
    """12 s, 4 min, 1 h 20 min."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"
