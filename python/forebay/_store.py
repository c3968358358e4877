"""``forebay.ObjectStore``: a memory-mapped object store shared by the processes of one user.

Values are copied once into a shared memory arena (``/dev/shm`` by default) and read back
without copying: pyarrow Tables, RecordBatches and Arrays come back with their buffers in
the mapping, numpy arrays as read-only arrays over it, bytes-like values as read-only
``memoryview`` objects, and any other picklable value (a dict of arrays, a dataclass, a
DataFrame) is rebuilt by pickle around read-only views of the arrays inside it (see
``_pickled``). Whatever ``get`` returns keeps the object pinned in memory while it lives. Over the capacity, least recently used unpinned objects move to disk and come back
on ``get``.

    >>> store = forebay.ObjectStore(capacity="1GiB")
    >>> ref = store.put(table)              # ObjectRef: picklable, send it to other processes
    >>> store.get(ref)                      # pyarrow.Table over the mapping
    >>> # in another process: forebay.ObjectStore.attach(ref.store_path).get(ref)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Literal, Self

import pyarrow as pa

from . import _forebay, _pickled
from ._args import integer
from ._forebay import ObjectNotFoundError, StoreError, StoreFullError

# First byte of an object's metadata: the Python type it was put as.
_BYTES = b"b"
_NDARRAY = b"n"
_BATCH = b"B"
_TABLE = b"T"
_ARRAY = b"A"
_CHUNKED = b"C"
_PICKLED = _pickled.PICKLED

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(size: int | str) -> int:
    """``1048576``, ``"512MiB"``, ``"2 GB"`` -> bytes."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(size))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse size {size!r}; use bytes or e.g. '512MiB', '2GiB'")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return n


class ObjectRef:
    """A reference to an object in a store: the store's directory and the object's id.

    Picklable: send it to another process, which calls ``ObjectStore.attach(ref.store_path)``
    (or uses a store it already attached) and then ``get(ref)``. A ref does not keep its
    object alive; ``delete`` does not wait for refs.
    """

    __slots__ = ("_id", "_store_path")

    def __init__(self, id: int, store_path: str):
        self._id = int(id)
        self._store_path = str(store_path)

    @property
    def id(self) -> str:
        """The object id as 32 hex digits."""
        return f"{self._id:032x}"

    @property
    def store_path(self) -> str:
        return self._store_path

    def __reduce__(self) -> tuple[type[ObjectRef], tuple[int, str]]:
        return (ObjectRef, (self._id, self._store_path))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"ObjectRef({self.id}, store={self._store_path!r})"


def _ndarray_meta(dtype: Any, shape: tuple[int, ...], scalar: bool = False) -> bytes:
    """``[descr, shape]``, and ``true`` third for a numpy scalar (stored as a 0-d array)."""
    import numpy as np

    descr = np.lib.format.dtype_to_descr(dtype)
    fields = [descr, list(shape), True] if scalar else [descr, list(shape)]
    return _NDARRAY + json.dumps(fields).encode()


def _tuplify(descr: Any) -> Any:
    # json turns the (name, format[, shape]) tuples of a structured dtype into lists.
    if isinstance(descr, list):
        return [
            tuple(_tuplify(x) for x in field) if isinstance(field, list) else field
            for field in descr
        ]
    return descr


def _ndarray_from(meta: bytes, buf: Any) -> Any:
    import numpy as np

    descr, shape, *scalar = json.loads(meta[1:])
    dtype = np.lib.format.descr_to_dtype(_tuplify(descr))
    count = 1
    for n in shape:
        count *= n
    arr = np.frombuffer(buf, dtype=dtype, count=count).reshape(tuple(shape))
    return arr[()] if scalar else arr  # a scalar comes back as a (copied) numpy scalar


class ObjectWriter:
    """An object being written in place: fill ``writer.view()`` (a writable memoryview),
    release the view, then ``seal()``; or use it as a context manager, which seals on
    success (the ref is then ``writer.ref``) and aborts on error."""

    def __init__(
        self,
        _inner: _forebay.RsObjectWriter,
        _store_path: str,
        _array: tuple[Any, tuple[int, ...]] | None = None,
    ):
        self._inner = _inner
        self._store_path = _store_path
        self._array = _array

    @property
    def size(self) -> int:
        return self._inner.size or 0

    def view(self) -> memoryview:
        """A writable memoryview of the object's bytes; release it before ``seal``."""
        return memoryview(self._inner)

    def array(self) -> Any:
        """A writable numpy array over the object's bytes (of ``create_array``'s shape and
        dtype); let it go (``del``) before ``seal``."""
        if self._array is None:
            raise TypeError("ObjectWriter.array: this object was not made by create_array")
        import numpy as np

        dtype, shape = self._array
        count = 1
        for n in shape:
            count *= n
        return np.frombuffer(memoryview(self._inner), dtype=dtype, count=count).reshape(shape)

    def seal(self) -> ObjectRef:
        return ObjectRef(self._inner.seal(), self._store_path)

    def abort(self) -> None:
        self._inner.abort()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        if exc_type is None:
            self.ref = self.seal()
        else:
            self._inner.abort()
        return False


class ObjectStore:
    """A shared-memory object store.

    path: directory of the store (created 0700; default a new directory in ``/dev/shm``).
        Other processes of the same user attach with ``ObjectStore.attach(path)``.
    capacity: bytes of memory the store may use (``"2GiB"``, ``"512MiB"`` or an int).
    spill_dir: where objects go when the store is full (a directory or a list); default a
        directory under the system temp dir. ``spill=False`` never spills: a full store makes
        ``put`` wait ``put_timeout`` seconds for pins to be released, then raise
        ``StoreFullError``.
    prefault: touch all of the capacity at creation so that first puts run at memcpy speed.

    The creating process owns the store; when it closes it (``close()``, or the object is
    garbage collected) the store is gone for everyone, though views already held stay valid.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        capacity: int | str = "2GiB",
        spill_dir: str | Iterable[str] | None = None,
        spill: bool = True,
        put_timeout: float = 10.0,
        prefault: bool = False,
        _inner: _forebay.RsObjectStore | None = None,
    ):
        if _inner is not None:
            self._inner: _forebay.RsObjectStore | None = _inner
            self._path = _inner.path
            return
        if isinstance(spill_dir, (str, bytes)) or hasattr(spill_dir, "__fspath__"):
            spill_dirs = [str(spill_dir)]
        elif spill_dir is not None:
            spill_dirs = [str(d) for d in spill_dir]
        else:
            spill_dirs = None
        self._inner = _forebay.RsObjectStore(
            None if path is None else str(path),
            parse_size(capacity),
            spill_dirs,
            bool(spill),
            float(put_timeout),
            bool(prefault),
        )
        self._path = self._inner.path

    def _store(self) -> _forebay.RsObjectStore:
        if self._inner is None:
            raise StoreError(f"object store {self._path}: this handle is closed")
        return self._inner

    @classmethod
    def attach(cls, path: str) -> ObjectStore:
        """Attach to the store at ``path`` (its directory, ``ObjectRef.store_path``), created
        by another process of this user. Refuses a store owned by another user or open to
        others."""
        return cls(_inner=_forebay.RsObjectStore.attach(str(path)))

    @property
    def path(self) -> str:
        return self._path

    @property
    def capacity(self) -> int:
        return 0 if self._inner is None else self._inner.capacity

    @property
    def is_owner(self) -> bool:
        return self._inner is not None and self._inner.is_owner

    def _ref(self, id: int) -> ObjectRef:
        return ObjectRef(id, self._path)

    def put(self, value: Any) -> ObjectRef:
        """Copy a value into the store once, as one object.

        pyarrow Tables, RecordBatches, Arrays and ChunkedArrays are stored as Arrow, numpy
        arrays and scalars as their bytes, bytes-like objects as bytes. Any other picklable
        value (a dict of arrays, a list, a dataclass, a pandas DataFrame; functions and
        classes of the script by value) is pickled with protocol 5: the numpy arrays, Arrow
        buffers and memoryviews inside it go into the store beside the pickle stream, and
        ``get`` gives them back as read-only views of the shared memory."""
        inner = self._store()
        if isinstance(value, pa.RecordBatch):
            return self._ref(inner.put_arrow(_BATCH, value.schema, [value]))
        if isinstance(value, pa.Table):
            return self._ref(inner.put_arrow(_TABLE, value.schema, value.to_batches()))
        if isinstance(value, pa.Array):
            batch = pa.RecordBatch.from_arrays([value], names=[""])
            return self._ref(inner.put_arrow(_ARRAY, batch.schema, [batch]))
        if isinstance(value, pa.ChunkedArray):
            table = pa.Table.from_arrays([value], names=[""])
            return self._ref(inner.put_arrow(_CHUNKED, table.schema, table.to_batches()))
        if type(value).__module__ == "numpy":
            import numpy as np

            scalar = isinstance(value, np.generic)
            array = np.asarray(value) if scalar else value
            # (A subclass, np.matrix say, is pickled: its type comes back with it.)
            if type(array) is np.ndarray and not array.dtype.hasobject:
                # (ascontiguousarray would turn a 0-d array into 1-d: keep array's shape.)
                flat = np.ascontiguousarray(array).reshape(-1)
                data = flat.view(np.uint8) if flat.size else b""
                return self._ref(
                    inner.put_buffers(_ndarray_meta(array.dtype, array.shape, scalar), [data])
                )
        if isinstance(value, (bytes, bytearray, memoryview)):
            view = memoryview(value)
            if not view.c_contiguous:
                view = memoryview(view.tobytes())
            return self._ref(inner.put_buffers(_BYTES, [view]))
        meta, parts = _pickled.encode(value)
        return self._ref(inner.put_buffers(meta, parts))

    def create(self, size: int) -> ObjectWriter:
        """Allocate ``size`` bytes to fill in place, then ``seal()`` (no copy at all)."""
        size = integer("size", size, minimum=0)
        return ObjectWriter(self._store().create(size, _BYTES), self._path)

    def create_array(self, shape: int | Iterable[int], dtype: Any = "float64") -> ObjectWriter:
        """Allocate a numpy array of ``shape`` and ``dtype`` to fill in place (no copy at
        all): ``writer.array()`` is the writable array; ``get`` of the sealed ref returns it
        read-only.

            >>> with store.create_array((1024, 768), "float32") as w:
            ...     w.array()[:] = weights      # or fill it row by row
            >>> store.get(w.ref)                # read-only ndarray over the store"""
        import numpy as np

        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        dims = tuple(integer("shape", n, minimum=0) for n in dims)
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise TypeError("ObjectStore.create_array: a dtype holding Python objects")
        count = 1
        for n in dims:
            count *= n
        inner = self._store().create(count * dt.itemsize, _ndarray_meta(dt, dims))
        return ObjectWriter(inner, self._path, (dt, dims))

    def get(self, ref: ObjectRef) -> Any:
        """The value ``ref`` refers to, without copying; it keeps the object pinned in memory
        while it lives (restored from disk first if it was spilled)."""
        _, meta, payload = self._store().get(_id_of(ref))
        kind = meta[:1]
        if isinstance(payload, _forebay.PinnedBuffer):
            if kind == _PICKLED:
                return _pickled.decode(meta, memoryview(payload), ref.id)
            if kind == _NDARRAY:
                return _ndarray_from(meta, payload)
            return memoryview(payload)
        schema, batches = payload
        if kind == _BATCH:
            return batches[0]
        if kind == _ARRAY:
            return batches[0].column(0)
        if kind == _CHUNKED:
            return pa.chunked_array([b.column(0) for b in batches], type=schema.field(0).type)
        return pa.Table.from_batches(batches, schema=schema)

    def delete(self, ref: ObjectRef) -> bool:
        """Delete the object ``ref`` refers to; memory is freed once no view of it is alive.
        Returns whether it existed."""
        return self._store().delete(_id_of(ref))

    def contains(self, ref: ObjectRef) -> bool:
        """Whether the object ``ref`` refers to is in the store (resident or spilled)."""
        return self._store().contains(_id_of(ref))

    __contains__ = contains

    def stats(self) -> dict[str, int]:
        """Counters: ``capacity``, ``bytes_used``, ``objects``, ``resident_objects``,
        ``objects_on_disk``, ``pinned_objects``, ``puts``, ``spilled_objects``,
        ``spilled_bytes``, ``restored_objects``, ``restored_bytes``, ``evictions``,
        ``free_extents``, ``largest_free``."""
        return self._store().stats()

    def close(self) -> None:
        """Close this handle (the owner: shut the store down for everyone)."""
        self._inner = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        role = "owner" if self.is_owner else "attached"
        return f"<forebay.ObjectStore {self.path} ({role}, capacity {self.capacity})>"


def _id_of(ref: object) -> int:
    if isinstance(ref, ObjectRef):
        return ref._id
    raise TypeError(f"expected an ObjectRef, got {type(ref).__name__}")


__all__ = [
    "ObjectNotFoundError",
    "ObjectRef",
    "ObjectStore",
    "ObjectWriter",
    "StoreError",
    "StoreFullError",
    "parse_size",
]
