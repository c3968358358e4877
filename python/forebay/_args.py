"""Checks of the numbers users pass: a clear ``TypeError``/``ValueError`` naming the argument,
instead of a comparison error deep inside (``'<' not supported``) or an ``OverflowError`` at
the Rust boundary."""

from __future__ import annotations

import operator
from typing import Any


def integer(name: str, value: Any, *, minimum: int) -> int:
    """``value`` as an ``int`` (numpy integers too; not bools, floats or strings), at least
    ``minimum``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} {value!r}")
    number = operator.index(value)
    if number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {number}")
    return number


def optional_integer(name: str, value: Any, *, minimum: int) -> int | None:
    return None if value is None else integer(name, value, minimum=minimum)
