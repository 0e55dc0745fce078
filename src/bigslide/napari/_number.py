"""A number typed as text and kept exactly as typed, or refused beside the field with its reason.

Qt's spin boxes change what a person types without a word: their validator drops the characters it does
not expect (`1e-5` becomes `15`, clamped to the maximum) and their range clamps the rest (`-0.001` becomes
the minimum). A `NumberField` is a line edit instead: the text stays as typed, a number that is not allowed
is named under the field in one line, and the panel refuses to start while any field holds a refusal.
"""

from __future__ import annotations

import math

from qtpy.QtCore import Qt, Signal
from qtpy.QtGui import QKeyEvent
from qtpy.QtWidgets import QLabel, QLineEdit, QVBoxLayout, QWidget

Number = int | float | None
REFUSED_STYLE = "QLineEdit { border: 1px solid #ff5555; }"
MESSAGE_STYLE = "color: #ff7b7b;"


def parse_number(
    text: str,
    kind: type,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    blank: str | None = None,
) -> tuple[Number, str | None]:
    """(value, None) for a text that spells an allowed number, else (None, why not, in a few words).

    `kind` is int or float; `above` is an exclusive lower bound (a learning rate > 0), `minimum` and
    `maximum` inclusive ones. With `blank` set, an empty text means None (e.g. "from file")."""
    text = text.strip()
    if not text:
        return (None, None) if blank is not None else (None, "type a number")
    if "," in text:
        digits = text.replace(",", "")
        if text.count(",") == 1 and "." not in text and not _thousands(text):
            return None, f"use a point as the decimal mark: {text.replace(',', '.')}"
        return None, f"type the number without separators: {digits}"
    try:
        number = float(text)
    except ValueError:
        return None, f"'{text}' is not a number"
    if not math.isfinite(number):
        return None, f"'{text}' is not a finite number"
    if kind is int:
        if not number.is_integer():
            return None, f"a whole number is needed, not {text}"
        value: Number = int(number)
    else:
        value = number
    if above is not None and number <= above:
        return None, f"must be greater than {above:g}"
    if minimum is not None and number < minimum:
        return None, f"must be at least {minimum:g}"
    if maximum is not None and number > maximum:
        return None, f"must be at most {maximum:g}"
    return value, None


def _thousands(text: str) -> bool:
    """Whether a comma reads as a thousands separator (1,000 or 12,500), not a decimal mark (0,5)."""
    head, _, tail = text.lstrip("+-").partition(",")
    return len(tail) == 3 and head.isdigit() and head != "0"


def number_text(value: Number) -> str:
    """How a number set from code is shown: Python's shortest exact spelling, without a trailing `.0`."""
    if value is None:
        return ""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


class _Edit(QLineEdit):
    """The line edit of a `NumberField`: Up and Down step the number, as in a spin box."""

    def __init__(self, field: NumberField) -> None:
        super().__init__()
        self.field = field

    def keyPressEvent(self, event: QKeyEvent | None) -> None:  # noqa: N802 - Qt override
        if event is not None and event.key() in (Qt.Key.Key_Up, Qt.Key.Key_Down):
            self.field.step(1 if event.key() == Qt.Key.Key_Up else -1)
            return
        super().keyPressEvent(event)


class NumberField(QWidget):
    """An int or float input that keeps its text as typed; an unallowed number is refused beside it.

    `value()` is the last allowed number (the one a run would use); `problem()` says why the text now in
    the field is refused, or None. `valueChanged` fires with each newly allowed number."""

    valueChanged = Signal(object)  # noqa: N815 - the spin boxes' name, kept for callers
    problemChanged = Signal(object)  # noqa: N815 - as Qt names its signals
    """The refusal changed: its text, or None once the field holds an allowed number again."""

    def __init__(
        self,
        kind: type,
        value: Number,
        *,
        name: str = "",
        minimum: float | None = None,
        maximum: float | None = None,
        above: float | None = None,
        step: float | None = None,
        blank: str | None = None,
        tip: str = "",
    ) -> None:
        super().__init__()
        if kind not in (int, float):
            raise TypeError(f"a NumberField holds an int or a float, not {kind}")
        self.kind, self.name, self.blank = kind, name, blank
        self.minimum, self.maximum, self.above = minimum, maximum, above
        self.single_step = step if step is not None else (1 if kind is int else _step(value))
        self.edit = _Edit(self)
        self.edit.setToolTip(tip)
        if blank is not None:
            self.edit.setPlaceholderText(blank)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setStyleSheet(MESSAGE_STYLE)
        self.message.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(1)
        layout.addWidget(self.edit)
        layout.addWidget(self.message)
        self._value: Number = None
        self._problem: str | None = None
        self.setValue(value)
        self.edit.textChanged.connect(self._on_text)

    # -- what the field holds -------------------------------------------------------------------------
    def value(self) -> Number:
        return self._value

    def text(self) -> str:
        return self.edit.text()

    def problem(self) -> str | None:
        return self._problem

    def refusal(self) -> str | None:
        """The refusal as a sentence naming the field and what was typed, for a message elsewhere."""
        if self._problem is None:
            return None
        return f"{self.name or 'a field'}: {self._problem} (typed '{self.edit.text().strip()}')"

    def setValue(self, value: Number) -> None:  # noqa: N802 - the spin boxes' name, kept for callers
        """Show `value` (from code, not typed); a value the field would refuse is a ValueError."""
        text = number_text(value) if value is not None else ""
        parsed, problem = self._parse(text)
        if problem is not None:
            raise ValueError(f"{self.name or 'number'}: {problem}, got {value!r}")
        if text != self.edit.text():
            self.edit.setText(text)  # _on_text accepts it
        self._accept(parsed)

    def parse(self, text: str) -> tuple[Number, str | None]:
        return self._parse(text)

    def step(self, direction: int) -> None:
        """One step up (1) or down (-1) from the current number, unless that would leave the bounds."""
        if self._problem is not None or self._value is None:
            return
        stepped = self._value + direction * self.single_step
        if self.kind is float:
            stepped = float(f"{stepped:.12g}")  # 0.1 + 0.2 shows as 0.3
        if self._parse(number_text(stepped))[1] is None:
            self.edit.setText(number_text(stepped))

    # -- typing -------------------------------------------------------------------------------------------
    def _parse(self, text: str) -> tuple[Number, str | None]:
        return parse_number(
            text, self.kind, minimum=self.minimum, maximum=self.maximum, above=self.above, blank=self.blank
        )

    def _on_text(self, text: str) -> None:
        value, problem = self._parse(text)
        self._set_problem(problem)
        if problem is None:
            self._accept(value)

    def _accept(self, value: Number) -> None:
        self._set_problem(None)
        if value != self._value or type(value) is not type(self._value):
            self._value = value
            self.valueChanged.emit(value)

    def _set_problem(self, problem: str | None) -> None:
        if problem == self._problem:
            return
        self._problem = problem
        self.message.setText(problem or "")
        self.message.setVisible(problem is not None)
        self.edit.setStyleSheet(REFUSED_STYLE if problem else "")
        self.problemChanged.emit(problem)


def _step(value: Number) -> float:
    # a step of about a tenth of the value keeps the arrow keys useful for 1e-4 as well as for 0.6
    if not value:
        return 0.01
    magnitude = 10.0 ** math.floor(math.log10(abs(value)))
    return magnitude / 10
