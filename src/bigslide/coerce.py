"""Typed values from YAML, the command line or a form: one coercion for the run config and every
method's parameters, with errors that name the key (`method.params.chunk_size: expected int, got 'abc'`)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from bigslide.errors import ConfigError


def build_dataclass(cls: type, values: Any, where: str) -> Any:
    """`cls(**values)` with every value coerced to its field's type; unknown keys are an error."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    kwargs = {name: coerce(hints[name], value, f"{where}.{name}") for name, value in values.items()}
    return cls(**kwargs)


def coerce(hint: Any, value: Any, where: str) -> Any:
    """`value` as the type `hint` names, or a `ConfigError` naming `where`."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, where)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(inner[0], value, where)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint is float and isinstance(value, str):
        value = _float_text(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
    if hint in (int, float):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (hint is int and value != int(value))
        ):
            raise ConfigError(f"{where}: expected {hint.__name__}, got {value!r}")
        return hint(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _float_text(text: str) -> float | str:
    """`text` as a finite float when it spells one (e.g. "1e-3"), else unchanged for the type error."""
    number = finite_number(text)
    return text if number is None else number


def finite_number(text: str) -> float | None:
    """The finite float `text` spells ("2", "1e-3", "1.0"), else None ("nan", "inf", words)."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def check_ranges(obj: Any, where: str) -> None:
    """Every field of dataclass `obj` within its `metadata["min"]` / `["max"]` (inclusive) and `["above"]`
    (exclusive), else a `ConfigError`
    naming it. The forms read the same bounds, so a value the GUI refuses is refused everywhere."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        low, high, above = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("above")
        if above is not None and value <= above:
            raise ConfigError(f"{where}.{f.name}: must be > {above}{_hint(f)}, got {value}")
        if low is not None and value < low:
            raise ConfigError(f"{where}.{f.name}: must be >= {low}{_hint(f)}, got {value}")
        if high is not None and value > high:
            raise ConfigError(f"{where}.{f.name}: must be <= {high}{_hint(f)}, got {value}")


def _hint(f: dataclasses.Field[Any]) -> str:
    help_text = f.metadata.get("help", "")
    return f" ({help_text})" if help_text else ""
