"""A small live line plot (training loss and metrics) drawn with QPainter: cheap to redraw per step."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from qtpy.QtCore import QPointF, QRectF, Qt
from qtpy.QtGui import QColor, QLinearGradient, QPainter, QPainterPath, QPaintEvent, QPen
from qtpy.QtWidgets import QSizePolicy, QWidget

PALETTE = ("#4cc9f0", "#f72585", "#ffd60a", "#80ed99", "#b388eb", "#ff9f1c")


IDLE = "no data yet — press Start"


LEGEND_ROW = 15
"""Pixels per line of the legend and notes, drawn below the axes so they never cover a line."""


class LinePlot(QWidget):
    """Named series of (x, y) points on one pair of axes, with a legend and notes below them; `add_point`
    repaints. Without points it shows `placeholder`: what the plot is waiting for. `whole_x`: the x axis
    counts whole units (epochs), its ticks at whole numbers."""

    def __init__(self, title: str = "", parent: QWidget | None = None, *, whole_x: bool = False) -> None:
        super().__init__(parent)
        self.title = title
        self.placeholder = IDLE
        self.whole_x = whole_x
        self.series: dict[str, list[tuple[float, float]]] = {}
        self.notes: dict[str, str] = {}  # why a series has no point, by series name
        self.setMinimumHeight(150)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)

    def add_point(self, name: str, x: float, y: float) -> None:
        if math.isfinite(x) and math.isfinite(y):
            self.series.setdefault(name, []).append((float(x), float(y)))
            self.update()

    def note(self, name: str, why: str) -> None:
        """Say, below the plot, why series `name` has no point (once per series)."""
        self.notes[name] = why
        self.update()

    def last_x(self) -> float | None:
        xs = [x for values in self.series.values() for x, _y in values]
        return max(xs) if xs else None

    def clear(self, placeholder: str = IDLE) -> None:
        self.series.clear()
        self.notes.clear()
        self.placeholder = placeholder
        self.update()

    def legend_lines(self) -> list[tuple[str, QColor]]:
        """The legend and notes, a line each, in the colour they are drawn."""
        lines = [(name, QColor(PALETTE[i % len(PALETTE)])) for i, name in enumerate(self.series)]
        note = QColor("#a0a3aa")
        return lines + [
            (f"{name}: {why}", note) for name, why in self.notes.items() if name not in self.series
        ]

    def set_placeholder(self, text: str) -> None:
        self.placeholder = text
        self.update()

    def paintEvent(self, event: QPaintEvent | None) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.fillRect(self.rect(), QColor("#262930"))
        legend = self.legend_lines()
        area = QRectF(self.rect()).adjusted(44, 22, -10, -22 - LEGEND_ROW * len(legend))
        self.setMinimumHeight(150 + LEGEND_ROW * len(legend))
        text = QColor("#d1d2d4")
        painter.setPen(text)
        painter.drawText(QRectF(0, 2, self.width(), 18), Qt.AlignmentFlag.AlignHCenter, self.title)
        for index, (line, colour) in enumerate(legend):
            painter.setPen(colour)
            row = QRectF(area.left(), area.bottom() + 20 + LEGEND_ROW * index, area.width(), LEGEND_ROW)
            painter.drawText(row, Qt.AlignmentFlag.AlignLeft, line)
        painter.setPen(text)
        points = [p for values in self.series.values() for p in values]
        if not points:
            painter.drawText(area, Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, self.placeholder)
            painter.end()
            return
        x_lo, x_hi = _span(p[0] for p in points)
        if self.whole_x and x_hi - x_lo < 1:  # one epoch: centred between its neighbours
            x_lo, x_hi = x_lo - 1, x_hi + 1
        y_ticks = nice_ticks(*_span(p[1] for p in points))
        y_lo, y_hi = y_ticks[0], y_ticks[-1]
        painter.setPen(QPen(QColor("#5a5d66"), 1))
        painter.drawRect(area)
        labels = tick_labels(y_ticks)
        for value, label in zip(y_ticks, labels):
            y = area.bottom() - (value - y_lo) / (y_hi - y_lo) * area.height()
            painter.setPen(QPen(QColor("#3a3d46"), 1))
            painter.drawLine(QPointF(area.left(), y), QPointF(area.right(), y))
            painter.setPen(text)
            painter.drawText(QRectF(0, y - 8, 40, 16), Qt.AlignmentFlag.AlignRight, label)
        x_ticks = whole_ticks(x_lo, x_hi) if self.whole_x else [x_lo, x_hi]
        for value in x_ticks:
            x = area.left() + (value - x_lo) / (x_hi - x_lo) * area.width()
            painter.drawText(
                QRectF(x - 20, area.bottom() + 2, 40, 16), Qt.AlignmentFlag.AlignHCenter, f"{value:g}"
            )

        def to_screen(x: float, y: float) -> QPointF:
            return QPointF(
                area.left() + (x - x_lo) / (x_hi - x_lo) * area.width(),
                area.bottom() - (y - y_lo) / (y_hi - y_lo) * area.height(),
            )

        for index, values in enumerate(self.series.values()):
            colour = QColor(PALETTE[index % len(PALETTE)])
            painter.setPen(QPen(colour, 2))
            if len(values) == 1:
                painter.drawEllipse(to_screen(*values[0]), 3, 3)
            else:
                path = QPainterPath(to_screen(*values[0]))
                for x, y in values[1:]:
                    path.lineTo(to_screen(x, y))
                painter.drawPath(path)
        painter.end()


def whole_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Whole numbers from lo to hi, at most about `count` of them (every k-th)."""
    first, last = math.ceil(lo), math.floor(hi)
    step = max(1, math.ceil((last - first + 1) / count))
    return [float(v) for v in range(first, last + 1, step)]


def nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart)."""
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = [first]
    while ticks[-1] < hi - 1e-12 * step:
        ticks.append(ticks[-1] + step)
    return ticks


def tick_labels(ticks: list[float]) -> list[str]:
    """Labels with just enough digits that neighbouring ticks read differently."""
    for digits in range(10):
        labels = [f"{t:.{digits}f}" for t in ticks]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{t:g}" for t in ticks]


def end_labels(low: float, high: float) -> tuple[str, str]:
    """A colour bar's end values, short (three significant digits) yet different from each other."""
    for digits in range(3, 10):
        labels = f"{low:.{digits}g}", f"{high:.{digits}g}"
        if labels[0] != labels[1]:
            return labels
    return f"{low:g}", f"{high:g}"


def _span(values: object) -> tuple[float, float]:
    items = list(values)  # type: ignore[call-overload]
    lo, hi = min(items), max(items)
    if hi - lo < 1e-12:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    return lo, hi


class ColourBar(QWidget):
    """The chosen heatmap's colour scale: a gradient with its end values and what they mean."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.colours: list[QColor] = []
        self.low_text = self.high_text = self.caption = ""
        self.setMinimumHeight(46)
        self.setToolTip("Colour scale of the chosen heatmap")

    def show_layer(self, layer: Any) -> None:
        """Take the colours and limits of a napari heatmap layer; RGB maps have no scale."""
        from bigslide.napari._layers import legend_text

        self.caption = legend_text(layer)
        if layer.rgb:
            self.colours = []
        else:
            rgba = layer.colormap.map(np.linspace(0, 1, 32))
            self.colours = [QColor.fromRgbF(*(float(v) for v in c)) for c in rgba]
            low, high = layer.contrast_limits
            self.low_text, self.high_text = end_labels(float(low), float(high))
        self.update()

    def paintEvent(self, event: QPaintEvent | None) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        text = QColor("#d1d2d4")
        painter.setPen(text)
        # the end labels get the room they need (a raw score reads 0.00041), the gradient the rest
        metrics = painter.fontMetrics()
        left = max(metrics.horizontalAdvance(self.low_text), 12) + 8
        right = max(metrics.horizontalAdvance(self.high_text), 12) + 8
        bar = QRectF(left, 4, max(self.width() - left - right, 10), 14)
        if self.colours:
            gradient = QLinearGradient(bar.left(), 0, bar.right(), 0)
            for i, colour in enumerate(self.colours):
                gradient.setColorAt(i / (len(self.colours) - 1), colour)
            painter.fillRect(bar, gradient)
            align_right, align_left = Qt.AlignmentFlag.AlignRight, Qt.AlignmentFlag.AlignLeft
            painter.drawText(QRectF(0, 2, left - 4, 18), align_right, self.low_text)
            painter.drawText(QRectF(bar.right() + 4, 2, right, 18), align_left, self.high_text)
        painter.drawText(
            QRectF(0, 22, self.width(), 22),
            Qt.AlignmentFlag.AlignHCenter | Qt.TextFlag.TextWordWrap,
            self.caption,
        )
        painter.end()
