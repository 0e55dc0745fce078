"""Small constructors for Qt inputs (PyQt's typing does not know its property keyword arguments)."""

from __future__ import annotations

from qtpy.QtCore import Qt
from qtpy.QtWidgets import QComboBox, QDoubleSpinBox, QSlider, QSpinBox


def spin_box(minimum: int, maximum: int, value: int, step: int = 1, tip: str = "") -> QSpinBox:
    box = QSpinBox()
    box.setRange(minimum, maximum)
    box.setSingleStep(step)
    box.setValue(value)
    box.setToolTip(tip)
    return box


def float_box(
    minimum: float, maximum: float, value: float, step: float, decimals: int = 2, tip: str = ""
) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setDecimals(decimals)
    box.setRange(minimum, maximum)
    box.setSingleStep(step)
    box.setValue(value)
    box.setToolTip(tip)
    return box


def combo_box(items: list[str] | tuple[str, ...], *, editable: bool = False, tip: str = "") -> QComboBox:
    box = QComboBox()
    box.setEditable(editable)
    box.addItems(list(items))
    box.setToolTip(tip)
    return box


def percent_slider(value: int) -> QSlider:
    slider = QSlider(Qt.Orientation.Horizontal)
    slider.setRange(0, 100)
    slider.setValue(value)
    return slider
