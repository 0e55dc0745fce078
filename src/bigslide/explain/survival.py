"""Kaplan-Meier curves of predicted risk groups with the log-rank test (scikit-survival), as a PNG."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class RiskGroups:
    """Slides (or cases) split at the median predicted risk, with the log-rank p-value between them."""

    high: np.ndarray  # (n,) bool: at or above the median risk
    p_value: float
    curves: dict[str, tuple[np.ndarray, np.ndarray]]  # group -> (times, survival probability)


def risk_groups(time: np.ndarray, event: np.ndarray, risk: np.ndarray) -> RiskGroups:
    from sksurv.compare import compare_survival
    from sksurv.nonparametric import kaplan_meier_estimator
    from sksurv.util import Surv

    time, observed, risk = np.asarray(time, float), np.asarray(event) > 0.5, np.asarray(risk, float)
    high = risk >= np.median(risk)
    p_value = float("nan")
    if high.any() and (~high).any() and observed.any():
        p_value = float(compare_survival(Surv.from_arrays(observed, time), high.astype(int))[1])
    curves = {}
    for name, members in (("low risk", ~high), ("high risk", high)):
        if members.any():
            times, survival = kaplan_meier_estimator(observed[members], time[members])
            curves[name] = (np.asarray(times), np.asarray(survival))
    return RiskGroups(high, p_value, curves)


def km_plot(groups: RiskGroups, path: str | Path, *, title: str = "", unit: str = "") -> Path:
    """The two groups' Kaplan-Meier curves (steps) with the log-rank p-value in the legend."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5, 3.6), dpi=120)
    axes = figure.subplots()
    colours = {"low risk": "#2b83ba", "high risk": "#d7191c"}
    for name, (times, survival) in groups.curves.items():
        n = int((groups.high if name == "high risk" else ~groups.high).sum())
        t = np.concatenate([[0.0], times])
        s = np.concatenate([[1.0], survival])
        axes.step(t, s, where="post", color=colours[name], label=f"{name} (n={n})")
    axes.set_ylim(0, 1.02)
    axes.set_xlabel(f"time{f' ({unit})' if unit else ''}")
    axes.set_ylabel("survival probability")
    p = "n/a" if np.isnan(groups.p_value) else f"{groups.p_value:.3g}"
    axes.set_title(title or f"predicted risk groups (median split), log-rank p = {p}", fontsize=9)
    axes.legend(loc="lower left", fontsize=8)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    figure.savefig(partial, format="png")
    partial.replace(path)  # a reader never sees half a plot
    return path
