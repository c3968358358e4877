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


def optional_seconds(name: str, value: Any) -> float | None:
    """``value`` as a number of seconds above 0 (ints and floats; not bools or strings), or
    None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{name} must be more than 0, not {value}")
    return float(value)


def worker_count(name: str, value: Any) -> int | None:
    """Ray Data's forms of ``concurrency``: ``n`` workers, or an autoscaling range ``(min,
    max)`` / ``(min, max, initial)``. forebay does not autoscale a map stage's workers: a range
    runs its ``max`` from the start (the pool Ray Data would grow to under load)."""
    if value is None or not isinstance(value, (tuple, list)):
        return optional_integer(name, value, minimum=1)
    if len(value) not in (2, 3):
        raise ValueError(
            f"{name} must be an integer or Ray Data's (min, max) or (min, max, initial), "
            f"not {value!r}"
        )
    low, high = (integer(name, v, minimum=1) for v in value[:2])
    if low > high:
        raise ValueError(f"{name}'s range (min, max) has min {low} above max {high}")
    if len(value) == 3 and not low <= integer(name, value[2], minimum=1) <= high:
        raise ValueError(f"{name}'s initial {value[2]} is outside its range ({low}, {high})")
    return high
