"""What a failed call's exception says about calling again: the row's own fault, the
server's or network's passing trouble, or neither known; and how long the server asked to
be left alone.

    exception ──► classify ──► ROW        an HTTP 4xx about the request (400, 401, 404, 422,
                                          ...), or ``forebay.RowError``: never retried; a
                                          batch is halved to find its rows, a row is set
                                          aside at once
                           ──► TRANSIENT  HTTP 408, 409, 425, 429 and 5xx; connection resets,
                                          timeouts; ``forebay.TransientError``: retried after
                                          max(backoff with jitter, the server's wait), never
                                          halved (halves would only add load to a server
                                          that is rate-limiting)
                           ──► UNKNOWN    anything else (a bug, a bad value): retried, then
                                          halved to find the rows

The status and headers are read as the HTTP clients users call put them on their
exceptions: ``status_code`` (openai), ``status`` and ``headers`` (aiohttp, urllib),
``response.status_code`` and ``response.headers`` (httpx, requests, openai). A server's
``x-should-retry`` header overrides the status. The wait is ``retry-after-ms``, then
``retry-after`` (seconds or an HTTP date), then on a 429 the ``x-ratelimit-reset-*`` of an
exhausted limit (``"1s"``, ``"6m0s"``, ``"20ms"``, as OpenAI-compatible servers send them).
"""

from __future__ import annotations

import email.utils
import enum
import random
import re
import time
from collections.abc import Mapping


class TransientError(Exception):
    """Raise it from a ``map_batches`` function to say the call may succeed if made again
    (the server is busy, a quota resets): it is retried (``max_retries``,
    ``retry_deadline``) after at least ``retry_after`` seconds when given, and a batch is
    never halved for it."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RowError(Exception):
    """Raise it from a ``map_batches`` function to say the rows themselves are at fault
    (a prompt too long, a document that cannot be parsed): never retried; with
    ``on_error="skip"`` or ``"dead_letter"`` a batch is halved to find the rows."""


class Failure(enum.Enum):
    ROW = "row"
    TRANSIENT = "transient"
    UNKNOWN = "unknown"


#: HTTP statuses that say "try again later" (the request may be right).
_TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})
#: Exception class names (anywhere in the class's MRO) of HTTP clients' network failures
#: that are not ``ConnectionError`` / ``TimeoutError`` subclasses: openai, httpx, aiohttp,
#: requests, http.client. Matched by name so that none of them needs importing.
_NETWORK_ERRORS = frozenset(
    {
        "APIConnectionError",
        "APITimeoutError",
        "TransportError",
        "TimeoutException",
        "ClientConnectionError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "RemoteDisconnected",
        "IncompleteRead",
        "ChunkedEncodingError",
        "ReadTimeout",
        "ConnectTimeout",
    }
)


def status_of(error: BaseException) -> int | None:
    """The HTTP status an exception carries, if any."""
    for holder in (error, getattr(error, "response", None)):
        if holder is None:
            continue
        for name in ("status_code", "status"):
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
                return value
    return None


def headers_of(error: BaseException) -> Mapping[str, str] | None:
    """The HTTP response headers an exception carries, if any (case-insensitive mappings
    in every client named in the module docs)."""
    for holder in (getattr(error, "response", None), error):
        headers = getattr(holder, "headers", None) if holder is not None else None
        if headers is not None and hasattr(headers, "get"):
            return headers  # type: ignore[no-any-return]
    return None


def classify(error: BaseException) -> Failure:
    """See the module docs."""
    if isinstance(error, TransientError):
        return Failure.TRANSIENT
    if isinstance(error, RowError):
        return Failure.ROW
    status = status_of(error)
    if status is not None:
        should_retry = _header(headers_of(error), "x-should-retry")
        if should_retry in ("true", "false"):
            return Failure.TRANSIENT if should_retry == "true" else Failure.ROW
        if status in _TRANSIENT_STATUSES or status >= 500:
            return Failure.TRANSIENT
        if 400 <= status < 500:
            return Failure.ROW
        return Failure.UNKNOWN
    if isinstance(error, ConnectionError | TimeoutError):
        return Failure.TRANSIENT
    if any(cls.__name__ in _NETWORK_ERRORS for cls in type(error).__mro__):
        return Failure.TRANSIENT
    return Failure.UNKNOWN


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if headers is None:
        return None
    try:
        value = headers.get(name)
    except Exception:  # noqa: BLE001 - a header mapping that refuses: no header
        return None
    return value.strip().lower() if isinstance(value, str) else None


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration(text: str) -> float | None:
    """Seconds in a duration as OpenAI-compatible servers write their rate-limit resets:
    ``"1s"``, ``"6m0s"``, ``"1h2m3.5s"``, ``"20ms"``, or a bare number of seconds."""
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def server_wait(error: BaseException, now: float | None = None) -> float | None:
    """Seconds the server asked the client to wait before calling again, if it said (see
    the module docs); ``now``: the wall clock, for an HTTP-date ``Retry-After``."""
    given = getattr(error, "retry_after", None)
    if isinstance(given, int | float) and not isinstance(given, bool) and given >= 0:
        return float(given)
    headers = headers_of(error)
    if headers is None:
        return None
    value = _header(headers, "retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = _header(headers, "retry-after")
    if value is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(0.0, when.timestamp() - (time.time() if now is None else now))
    if status_of(error) == 429:
        resets = []
        for limit in ("requests", "tokens"):
            remaining = _header(headers, f"x-ratelimit-remaining-{limit}")
            reset = _header(headers, f"x-ratelimit-reset-{limit}")
            if reset is None or remaining not in (None, "0"):
                continue
            seconds = parse_duration(reset)
            if seconds is not None:
                resets.append(seconds)
        if resets:
            return max(resets)
    return None


#: Backoff of the n-th retry without a server's wait: 0.1 s doubling up to this, with
#: "equal jitter" (half fixed, half random) so that calls failing together come back apart.
BACKOFF_CAP = 10.0


def backoff(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (0: the first retry)."""
    ceiling = min(BACKOFF_CAP, 0.1 * 2.0 ** min(attempt, 32))
    return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


def describe(error: BaseException) -> str:
    """An error's message and its notes (the earlier attempts of a retried call): what a
    dead letter records."""
    notes = getattr(error, "__notes__", None) or []
    return "\n".join([str(error), *(str(n) for n in notes)])


def note_attempts(error: BaseException, earlier: list[BaseException]) -> None:
    """Add to ``error`` (a call's last failure) a note naming the failures of its earlier
    attempts, so that a dead letter or a traceback shows every attempt, not only the last."""
    if not earlier:
        return
    lines = [f"attempt {i}: {type(e).__qualname__}: {e}" for i, e in enumerate(earlier, 1)]
    note = f"earlier attempts of this call ({len(earlier)}):\n" + "\n".join(lines)
    if note not in (getattr(error, "__notes__", None) or []):
        error.add_note(note)
