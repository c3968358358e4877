"""Normalise pyarrow-style filter tuples into the form the Rust side reads.

Input: ``("x", ">", 5)``, a list of such tuples (AND), or a list of lists (OR of ANDs).
Output: a list (OR) of lists (AND) of ``(column, op, value)`` where ``value`` is a tagged
tuple such as ``("int", 5)``, a list of tagged tuples (for ``in``), or ``None``.
"""

from __future__ import annotations

import datetime as _dt
import decimal as _decimal
import sys
from typing import Any

from ._forebay import InvalidFilterError

_COMPARE_OPS = {"=", "==", "!=", "<>", "<", "<=", ">", ">="}
_NULL_OPS = {"is null", "is_null", "is not null", "is_not_null", "not null"}
_EPOCH = _dt.datetime(1970, 1, 1)
_EPOCH_UTC = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def _tag(column: str, value: Any) -> tuple[Any, ...]:
    if hasattr(value, "as_py") and callable(value.as_py):  # pyarrow scalar
        value = value.as_py()
    elif type(value).__module__ == "numpy" and hasattr(value, "item"):  # numpy scalar
        value = value.item()
    if value is None:
        return ("null",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise InvalidFilterError(
                f"invalid filter on column '{column}': {value} does not fit in 64 bits"
            )
        return ("int", value)
    if isinstance(value, float):
        return ("float", value)
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(value))
    if isinstance(value, _decimal.Decimal):
        return ("decimal", format(value, "f"))
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            delta = value - _EPOCH
            tz = None
        else:
            delta = value - _EPOCH_UTC
            tz = "UTC"
        micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
        return ("timestamp", micros, tz)
    if isinstance(value, _dt.date):
        return ("date", (value - _dt.date(1970, 1, 1)).days)
    raise InvalidFilterError(
        f"invalid filter on column '{column}': unsupported value type {type(value).__name__} ({value!r})"
    )


def _term(term: Any) -> tuple[Any, ...]:
    if not isinstance(term, (tuple, list)) or len(term) not in (2, 3):
        raise InvalidFilterError(f"invalid filter term {term!r}: expected (column, op, value)")
    column, op = term[0], term[1]
    if not isinstance(column, str):
        raise InvalidFilterError(f"invalid filter term {term!r}: the column must be a string")
    if not isinstance(op, str):
        raise InvalidFilterError(f"invalid filter term {term!r}: the operator must be a string")
    op_norm = " ".join(op.lower().replace("_", " ").split())
    if op_norm in {"is null", "is not null", "not null"}:
        return (column, "is not null" if "not" in op_norm else "is null", None)
    if len(term) != 3:
        raise InvalidFilterError(f"invalid filter term {term!r}: operator {op!r} needs a value")
    value = term[2]
    if op_norm in ("is", "is not") and value is None:
        return (column, "is null" if op_norm == "is" else "is not null", None)
    if op_norm in ("in", "not in"):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise InvalidFilterError(
                f"invalid filter on column '{column}': '{op}' needs a list of values, got {value!r}"
            )
        values = list(value.to_pylist() if hasattr(value, "to_pylist") else value)
        return (column, op_norm, [_tag(column, v) for v in values])
    if op not in _COMPARE_OPS:
        raise InvalidFilterError(f"invalid filter on column '{column}': unknown operator {op!r}")
    return (column, op, _tag(column, value))


def _is_term(obj: Any) -> bool:
    return isinstance(obj, tuple) or (
        isinstance(obj, list)
        and len(obj) in (2, 3)
        and isinstance(obj[0], str)
        and isinstance(obj[1], str)
    )


def normalize_filter(filter: Any) -> list[list[tuple[Any, ...]]] | None:
    """Return the OR-of-ANDs form, or None for no filter."""
    if filter is None:
        return None
    if _is_term(filter):
        return [[_term(filter)]]
    # A user holding a pyarrow expression has imported pyarrow.compute (forebay does not).
    compute = sys.modules.get("pyarrow.compute")
    if compute is not None and isinstance(filter, compute.Expression):
        raise InvalidFilterError(
            f"invalid filter {filter}: a pyarrow expression (Ray Data's and pyarrow.dataset's "
            "filter) is not accepted; write it as tuples, as pyarrow.parquet.read_table's "
            "filters: [('x', '>', 5), ('y', 'in', [1, 2])] is x > 5 and y in (1, 2), and a "
            "list of such lists is their OR"
        )
    if not isinstance(filter, list) or not filter:
        raise InvalidFilterError(
            f"invalid filter {filter!r}: expected a tuple, a list of tuples or a list of lists"
        )
    if all(_is_term(t) for t in filter):
        return [[_term(t) for t in filter]]
    if all(isinstance(c, list) and c and all(_is_term(t) for t in c) for c in filter):
        return [[_term(t) for t in conj] for conj in filter]
    raise InvalidFilterError(
        f"invalid filter {filter!r}: mix of terms and groups; use a list of tuples (AND) or a list of lists (OR of ANDs)"
    )
