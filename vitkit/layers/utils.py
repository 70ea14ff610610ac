"""Small helpers shared by the layers."""

from __future__ import annotations

Pair = int | tuple[int, int]


def to_pair(value: Pair) -> tuple[int, int]:
    """``7 -> (7, 7)``; a pair is returned as a tuple."""
    if isinstance(value, int):
        return value, value
    first, second = value
    return int(first), int(second)
