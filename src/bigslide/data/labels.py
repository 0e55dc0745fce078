"""Class labels as a slide table spells them: one class spelt one way, and classes in a reading order."""

from __future__ import annotations

from bigslide.coerce import finite_number
from bigslide.errors import DataError


def check_label_spelling(where: dict[str, list[int]] | dict[str, list[str]], prefix: str, noun: str) -> None:
    """Labels that differ only in upper/lower case, spaces or how a number is written (`tumor`, `Tumor `;
    `1`, `1.0`) would be two classes: a `DataError` naming each spelling and where it is (`where`: label ->
    rows or slides)."""
    spellings: dict[str, list[str]] = {}
    for label in where:
        number = finite_number(label)
        key = repr(number) if number is not None else " ".join(label.split()).casefold()
        spellings.setdefault(key, []).append(label)
    for same in spellings.values():
        if len(same) > 1:
            told = "; ".join(f"{label!r} at {noun}(s) {', '.join(map(str, where[label]))}" for label in same)
            raise DataError(
                f"{prefix}labels {told} differ only in upper/lower case, spaces or how a number is written, "
                "which would make them different classes: spell each class one way"
            )


def class_order(label: str) -> tuple[int, float, str]:
    """Classes in order: numbers (grades, scores) by value, so that 10 comes after 2 and an ordinal
    metric reads them in their order; then text, alphabetically."""
    number = finite_number(label)
    return (0, number, label) if number is not None else (1, 0.0, label)
