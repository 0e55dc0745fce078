"""Counts in words, as every part of the product prints them."""

from __future__ import annotations


def counted(n: int, noun: str) -> str:
    """'1 slide', '2 slides': a count with its noun in the right number."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
