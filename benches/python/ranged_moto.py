"""moto's S3 server, answering a ranged GET by reading only the range: a benchmark rig whose
server costs what S3's would, in proportion to the bytes asked for.

    python benches/python/ranged_moto.py -H 127.0.0.1 -p PORT      (moto.server's arguments)

Why: moto 5.2 answers ``GET`` with ``Range: bytes=a-b`` by reading the whole object out of its
buffer (``FakeKey.value``), copying it, and slicing. On lineitem SF1 (29 MB files) that is
~5.6 ms of the server's CPU per request, on the same 2 cores as the reader under test, so a
reader that asks for exactly the bytes it needs (more, smaller requests) pays for it in the
rig and not on S3, where the server's work is on other machines. Here a single byte range
(``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) is read from the object's buffer at its offset;
everything else (whole-object GETs, multi-range, HEAD, PUT, LIST) is moto's own code.

The patch is the rig, not forebay: ``remote.py --server ranged`` runs every engine against
it in the same run, as it runs every engine against stock moto by default.
"""

from __future__ import annotations

import threading
from typing import Any

import moto.s3.models as s3_models
import moto.s3.responses as s3_responses
import moto.server

_in_ranged_get = threading.local()


class _ObjectRanges:
    """An object's bytes as moto's range handler uses them (``len`` and one slice), read
    from the key's buffer only for the slice asked for."""

    def __init__(self, key: Any) -> None:
        self._key = key
        self._size = key.size

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __getitem__(self, part: slice) -> bytes:
        start, stop, step = part.indices(self._size)
        assert step == 1, "moto slices ranges with step 1"
        with self._key.lock:
            self._key._value_buffer.seek(start)
            return self._key._value_buffer.read(max(0, stop - start))

    def whole(self) -> bytes:
        return self[0 : self._size]


_moto_value = s3_models.FakeKey.value


def _value(key: Any) -> Any:
    if getattr(_in_ranged_get, "on", False):
        return _ObjectRanges(key)
    return _moto_value.fget(key)  # type: ignore[attr-defined]


s3_models.FakeKey.value = property(_value, _moto_value.fset)  # type: ignore[method-assign, assignment]

_moto_get_object = s3_responses.S3Response.get_object
_moto_handle_range = s3_responses.S3Response._handle_range_header


def _get_object(self: Any) -> Any:
    spec = self.headers.get("range") or ""
    _in_ranged_get.on = spec.startswith("bytes=") and "," not in spec
    try:
        status, headers, body = _moto_get_object(self)
    finally:
        _in_ranged_get.on = False
    if isinstance(body, _ObjectRanges) and status != 200:  # 206 of partNumber: whole
        body = body.whole()
    return status, headers, body


def _handle_range_header(self: Any, request: Any, headers: Any, content: Any) -> Any:
    status, headers, body = _moto_handle_range(self, request, headers, content)
    if isinstance(body, _ObjectRanges):  # answered as a whole-object GET
        body = body.whole()
    return status, headers, body


s3_responses.S3Response.get_object = _get_object  # type: ignore[method-assign]
s3_responses.S3Response._handle_range_header = _handle_range_header  # type: ignore[method-assign]

if __name__ == "__main__":
    moto.server.main()
