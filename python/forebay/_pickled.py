"""Any picklable Python value as one store object: pickle protocol 5, buffers out of band.

``pickle.dumps(value, protocol=5, buffer_callback=...)`` hands every large contiguous buffer
of the value (numpy arrays, pyarrow buffers, ``PickleBuffer``s and memoryviews) to the
callback instead of copying it into the pickle stream. The object's data is then the stream
followed by those buffers, each at a 64-byte boundary::

    data:  [ pickle stream ][pad][ buffer 0 ][pad][ buffer 1 ] ...
    meta:  b"P" | stream length (u64) | buffer count (u32) | each buffer's length (u64)

Reading it back is ``pickle.loads(stream, buffers=[views of the shared pages])``: numpy and
pyarrow rebuild their arrays over the views without copying (so they are read-only), and
the views keep the object pinned while any array made from them lives. Only the Python
objects around the buffers are rebuilt, at about the cost of ``pickle.loads``.

The stream is written by the C pickler when it can be; a value that refers to the user's
script (``__main__``) or that the C pickler refuses (lambdas, local classes, memoryviews) is
written by cloudpickle, which ships such functions and classes by value.
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any

#: First byte of the metadata of a pickled object.
PICKLED = b"P"

#: Buffers smaller than this stay inside the pickle stream: rebuilding a view costs more
#: than copying a few bytes.
OUT_OF_BAND_MIN = 4096

_ALIGN = 64
_HEADER = struct.Struct("<QI")
_ZEROS = bytes(_ALIGN)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _MemoryviewsOutOfBand:
    """Mixin for a pickler: a memoryview (which pickle refuses) travels as a PickleBuffer
    and comes back as a read-only memoryview over the store."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is memoryview:
            if not obj.c_contiguous:
                obj = memoryview(obj.tobytes())
            return memoryview, (pickle.PickleBuffer(obj),)
        parent = super()
        if hasattr(parent, "reducer_override"):
            return parent.reducer_override(obj)  # cloudpickle's functions and classes
        return NotImplemented


def _cloudpickle_dumps(value: Any, buffer_callback: Any) -> bytes:
    import cloudpickle

    class Pickler(_MemoryviewsOutOfBand, cloudpickle.Pickler):  # type: ignore[misc]
        pass

    out = io.BytesIO()
    Pickler(out, protocol=5, buffer_callback=buffer_callback).dump(value)
    return out.getvalue()


def encode(value: Any) -> tuple[bytes, list[Any]]:
    """``(meta, parts)``: the object's metadata and the pieces of its data in order (the
    stream, padding and the out-of-band buffers as contiguous byte views, uncopied)."""
    buffers: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: the pickler copies it into the stream
            return True
        if raw.nbytes < OUT_OF_BAND_MIN:
            return True
        buffers.append(raw)
        return False

    try:
        stream = pickle.dumps(value, protocol=5, buffer_callback=out_of_band)
        by_reference_to_main = b"__main__" in stream
    except Exception:  # noqa: BLE001 - the C pickler refused: cloudpickle may not
        by_reference_to_main = True
    if by_reference_to_main:
        # The script's functions and classes are not importable in another process: ship
        # them by value. (A string "__main__" in the data only costs the slower pickler.)
        buffers.clear()
        try:
            stream = _cloudpickle_dumps(value, out_of_band)
        except Exception as e:  # noqa: BLE001 - say what could not be stored and why
            raise TypeError(
                f"ObjectStore.put: cannot store a {type(value).__name__}: it cannot be "
                f"pickled ({type(e).__name__}: {e})"
            ) from None
    meta = [PICKLED, _HEADER.pack(len(stream), len(buffers))]
    meta.extend(struct.pack("<Q", b.nbytes) for b in buffers)
    parts: list[Any] = [stream]
    end = len(stream)
    for b in buffers:
        pad = _aligned(end) - end
        if pad:
            parts.append(_ZEROS[:pad])
        parts.append(b)
        end += pad + b.nbytes
    return b"".join(meta), parts


def decode(meta: bytes, data: memoryview, object_id: str) -> Any:
    """The value of a pickled object whose bytes are ``data`` (a read-only view of the
    store): the buffers are views of ``data``, not copies."""
    stream_len, count = _HEADER.unpack_from(meta, 1)
    lengths = struct.unpack_from(f"<{count}Q", meta, 1 + _HEADER.size)
    buffers = []
    end = stream_len
    for n in lengths:
        start = _aligned(end)
        buffers.append(data[start : start + n])
        end = start + n
    try:
        return pickle.loads(data[:stream_len], buffers=buffers)
    except (AttributeError, ImportError) as e:
        from ._forebay import StoreError

        raise StoreError(
            f"object {object_id}: its value cannot be rebuilt in this process: {e}. A class "
            f"must be importable where the value is read (classes of the script that put it "
            f"travel by value)"
        ) from e
