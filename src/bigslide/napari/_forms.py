"""Forms built from parameter dataclasses (a method's `Params`, parts of `DataConfig`).

Fields of type int, float, bool, str or Literal[str, ...] become spin boxes, check boxes, line edits
and drop-downs. A field's metadata gives the tooltip (`help`), the bounds a value can be typed within
(`min`, `max`, the same bounds the config checks) and when the field applies (`shown_with`: shown only
while another field of the form has one of the listed values). Adding a parameter to a method adds it
to the GUI with no GUI code.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from typing import Any, Literal

from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLineEdit,
    QSpinBox,
    QWidget,
)

from bigslide.napari._qt import FloatBox

_INT_LIMIT = 2**31 - 1


class DataclassForm(QWidget):
    """Editable widgets for selected fields of a dataclass; `values()` reads them back as a dict."""

    def __init__(self, cls: type, *, include: Iterable[str] | None = None) -> None:
        super().__init__()
        self.cls = cls
        hints = typing.get_type_hints(cls)
        wanted = list(include) if include is not None else None
        fields = [f for f in dataclasses.fields(cls) if wanted is None or f.name in wanted]
        if wanted is not None:
            fields.sort(key=lambda f: wanted.index(f.name))
        self.layout_ = QFormLayout(self)
        self.layout_.setContentsMargins(0, 0, 0, 0)
        self.widgets: dict[str, QWidget] = {}
        self.shown_with: dict[str, dict[str, tuple[str, ...]]] = {}
        for f in fields:
            widget = field_widget(hints[f.name], _default(f), f.metadata)
            if widget is None:
                continue  # a type the form cannot edit keeps its default
            self.widgets[f.name] = widget
            self.layout_.addRow(f.name.replace("_", " "), widget)
            if "shown_with" in f.metadata:
                self.shown_with[f.name] = dict(f.metadata["shown_with"])
        for widget in self.widgets.values():
            if isinstance(widget, QComboBox):
                widget.currentTextChanged.connect(lambda _t: self._update_visibility())
        self._update_visibility()

    def __len__(self) -> int:
        return len(self.widgets)

    def visible_fields(self) -> list[str]:
        return [name for name in self.widgets if self.layout_.isRowVisible(self.widgets[name])]

    def set_shown(self, name: str, shown: bool) -> None:
        """Show or hide one field's row (for fields that apply only to some choices made elsewhere)."""
        if name in self.widgets:
            self.layout_.setRowVisible(self.widgets[name], shown)

    def values(self) -> dict[str, Any]:
        return {name: widget_value(widget) for name, widget in self.widgets.items()}

    def set_values(self, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if name in self.widgets:
                set_widget_value(self.widgets[name], value)

    def _update_visibility(self) -> None:
        current = self.values()
        for name, conditions in self.shown_with.items():
            shown = all(str(current.get(key)) in allowed for key, allowed in conditions.items())
            self.layout_.setRowVisible(self.widgets[name], shown)


def field_widget(hint: Any, default: Any, metadata: Any) -> QWidget | None:
    """One input for a field, bounded by its metadata, or None for a type the form cannot edit."""
    widget: QWidget
    low, high = metadata.get("min"), metadata.get("max")
    if typing.get_origin(hint) is Literal:
        widget = QComboBox()
        widget.addItems([str(c) for c in typing.get_args(hint)])
        widget.setCurrentText(str(default))
    elif hint is bool:
        widget = QCheckBox()
        widget.setChecked(bool(default))
    elif hint is int:
        widget = QSpinBox()
        widget.setRange(
            int(low) if low is not None else -_INT_LIMIT, int(high) if high is not None else _INT_LIMIT
        )
        widget.setValue(int(default))
    elif hint is float:
        widget = FloatBox()
        widget.setRange(float(low) if low is not None else -1e12, float(high) if high is not None else 1e12)
        widget.setSingleStep(_step(float(default)))
        widget.setValue(float(default))
    elif hint is str:
        widget = QLineEdit(str(default))
    else:
        return None
    help_text = metadata.get("help", "")
    bounds = " ".join(
        p for p in (f"≥ {low}" if low is not None else "", f"≤ {high}" if high is not None else "") if p
    )
    widget.setToolTip(f"{help_text} ({bounds})" if bounds else help_text)
    return widget


def widget_value(widget: QWidget) -> Any:
    if isinstance(widget, QComboBox):
        return widget.currentText()
    if isinstance(widget, QCheckBox):
        return widget.isChecked()
    if isinstance(widget, QDoubleSpinBox):
        return float(widget.cleanText()) if widget.cleanText() else widget.value()
    if isinstance(widget, QSpinBox):
        return widget.value()
    assert isinstance(widget, QLineEdit)
    return widget.text()


def set_widget_value(widget: QWidget, value: Any) -> None:
    if isinstance(widget, QComboBox):
        widget.setCurrentText(str(value))
    elif isinstance(widget, QCheckBox):
        widget.setChecked(bool(value))
    elif isinstance(widget, QSpinBox):
        widget.setValue(int(value))
    elif isinstance(widget, QDoubleSpinBox):
        widget.setValue(float(value))
    else:
        assert isinstance(widget, QLineEdit)
        widget.setText(str(value))


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _step(value: float) -> float:
    # a step of about a tenth of the default keeps the arrows useful for 1e-4 as well as for 0.6
    if value == 0:
        return 0.01
    magnitude = 10 ** int(f"{abs(value):e}".split("e")[1])
    return float(magnitude) / 10 if magnitude >= 1e-12 else 1e-12
