"""Forms built from parameter dataclasses (a method's `Params`, parts of `DataConfig`).

Fields of type int, float (optionally `| None`), bool, str or Literal[str, ...] become number fields,
check boxes, line edits and drop-downs. A field's metadata gives its label (`label`, else its name in
words), the tooltip (`help`), the bounds a typed number must keep (`min`, `max`, `above`: the same bounds
the config checks; a number outside them is refused beside the field, never clamped), what an empty
optional number means (`blank`), how a choice reads (`choices`: value -> words) and when the field applies
(`shown_with`: shown only while another field of the form has one of the listed values). Adding a
parameter to a method adds it to the GUI with no GUI code.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from typing import Any, Literal

from qtpy.QtCore import Qt
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QLineEdit,
    QWidget,
)

from bigslide.napari._number import NumberField


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
        # a long label goes above its field rather than widening the panel past its dock
        self.layout_.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.widgets: dict[str, QWidget] = {}
        self.shown_with: dict[str, dict[str, tuple[str, ...]]] = {}
        for f in fields:
            widget = field_widget(hints[f.name], _default(f), f.metadata, field_label(f))
            if widget is None:
                continue  # a type the form cannot edit keeps its default
            self.widgets[f.name] = widget
            self.layout_.addRow(field_label(f), widget)
            if "shown_with" in f.metadata:
                self.shown_with[f.name] = dict(f.metadata["shown_with"])
        for widget in self.widgets.values():
            if isinstance(widget, QComboBox):
                widget.currentIndexChanged.connect(lambda _i: self._update_visibility())
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

    def problems(self) -> list[str]:
        """Refusals of the numbers typed into the fields now shown (a hidden field is not used)."""
        shown = set(self.visible_fields())
        return [
            text
            for name, widget in self.widgets.items()
            if name in shown and isinstance(widget, NumberField) and (text := widget.refusal())
        ]

    def set_values(self, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if name in self.widgets:
                set_widget_value(self.widgets[name], value)

    def _update_visibility(self) -> None:
        current = self.values()
        for name, conditions in self.shown_with.items():
            shown = all(str(current.get(key)) in allowed for key, allowed in conditions.items())
            self.layout_.setRowVisible(self.widgets[name], shown)


def field_label(field: dataclasses.Field[Any]) -> str:
    """The words a form shows for a field: its `label` metadata, else its name with spaces."""
    return str(field.metadata.get("label") or field.name.replace("_", " "))


def field_widget(hint: Any, default: Any, metadata: Any, label: str = "") -> QWidget | None:
    """One input for a field, bounded by its metadata, or None for a type the form cannot edit."""
    widget: QWidget
    low, high, above = metadata.get("min"), metadata.get("max"), metadata.get("above")
    number, optional = _number_type(hint)
    if typing.get_origin(hint) is Literal:
        widget = QComboBox()
        words = dict(metadata.get("choices", {}))
        for index, choice in enumerate(typing.get_args(hint)):
            widget.addItem(str(words.get(choice, choice)), choice)  # shown in words, stored as the value
            widget.setItemData(index, str(choice), Qt.ItemDataRole.ToolTipRole)
        widget.setCurrentIndex(max(widget.findData(default), 0))
    elif hint is bool:
        widget = QCheckBox()
        widget.setChecked(bool(default))
    elif number is not None:
        blank = str(metadata.get("blank", "automatic")) if optional else None
        widget = NumberField(number, default, name=label, minimum=low, maximum=high, above=above, blank=blank)
    elif hint is str:
        widget = QLineEdit(str(default))
    else:
        return None
    help_text = metadata.get("help", "")
    bounds = " ".join(
        p
        for p in (
            f"> {above}" if above is not None else "",
            f"≥ {low}" if low is not None else "",
            f"≤ {high}" if high is not None else "",
        )
        if p
    )
    tip = f"{help_text} ({bounds})" if bounds else help_text
    (widget.edit if isinstance(widget, NumberField) else widget).setToolTip(tip)
    return widget


def _number_type(hint: Any) -> tuple[type | None, bool]:
    """(int or float, whether None is allowed) for a number field's type hint, else (None, False)."""
    if hint in (int, float):
        return hint, False
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:
        inner = next(a for a in args if a is not type(None))
        if inner in (int, float):
            return inner, True
    return None, False


def widget_value(widget: QWidget) -> Any:
    if isinstance(widget, QComboBox):
        return widget.currentData()
    if isinstance(widget, QCheckBox):
        return widget.isChecked()
    if isinstance(widget, NumberField):
        return widget.value()
    assert isinstance(widget, QLineEdit)
    return widget.text()


def set_widget_value(widget: QWidget, value: Any) -> None:
    if isinstance(widget, QComboBox):
        index = widget.findData(value)
        if index < 0:
            raise ValueError(f"{value!r} is not one of the choices")
        widget.setCurrentIndex(index)
    elif isinstance(widget, QCheckBox):
        widget.setChecked(bool(value))
    elif isinstance(widget, NumberField):
        widget.setValue(value)
    else:
        assert isinstance(widget, QLineEdit)
        widget.setText(str(value))


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None
