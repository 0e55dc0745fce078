"""Forms built from parameter dataclasses (a method's `Params`, parts of `DataConfig`).

Fields of type int, float, bool, str or Literal[str, ...] become spin boxes, check boxes, line edits
and drop-downs; the field's `metadata["help"]` becomes the tooltip, so adding a parameter to a method
adds it to the GUI with no GUI code.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from typing import Any, Literal

from magicgui import widgets

_LARGE = 10**9


class DataclassForm(widgets.Container):
    """Editable widgets for selected fields of a dataclass; `values()` reads them back as a dict."""

    def __init__(self, cls: type, *, include: Iterable[str] | None = None, defaults: Any = None) -> None:
        super().__init__(labels=True)
        self.cls = cls
        hints = typing.get_type_hints(cls)
        wanted = list(include) if include is not None else None
        fields = [f for f in dataclasses.fields(cls) if wanted is None or f.name in wanted]
        if wanted is not None:
            fields.sort(key=lambda f: wanted.index(f.name))
        for field in fields:
            default = getattr(defaults, field.name) if defaults is not None else _default(field)
            widget = field_widget(field.name, hints[field.name], default, field.metadata.get("help", ""))
            if widget is not None:
                self.append(widget)

    def values(self) -> dict[str, Any]:
        return {w.name: w.value for w in self}

    def set_values(self, values: dict[str, Any]) -> None:
        for w in self:
            if w.name in values:
                w.value = values[w.name]


def field_widget(name: str, hint: Any, default: Any, help_text: str = "") -> widgets.bases.ValueWidget | None:
    """One widget for a field, or None for a type the form cannot edit (it keeps its default)."""
    label = name.replace("_", " ")
    common: dict[str, Any] = {"name": name, "label": label, "tooltip": help_text or None}
    if typing.get_origin(hint) is Literal:
        choices = [str(c) for c in typing.get_args(hint)]
        return widgets.ComboBox(value=str(default), choices=choices, **common)
    if hint is bool:
        return widgets.CheckBox(value=bool(default), **common)
    if hint is int:
        return widgets.SpinBox(value=int(default), min=-_LARGE, max=_LARGE, **common)
    if hint is float:
        step = _step(float(default))
        return widgets.FloatSpinBox(value=float(default), min=-1e12, max=1e12, step=step, **common)
    if hint is str:
        return widgets.LineEdit(value=str(default), **common)
    return None


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
