"""``forebay.CheckpointFilter``: which ids a previous run already finished.

The index lives in Rust (``forebay-checkpoint``): about 13 bytes per id whatever the id's
length, hash-sharded, loaded and probed in parallel with the GIL released. Null ids are never
"done": ``contains`` answers False for them and ``filter`` keeps their rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from . import _forebay
from ._dataset import Dataset

#: Shard count of a new checkpoint when none is given (a checkpoint's manifest records its own).
DEFAULT_NUM_SHARDS = 16


def _arrays(ids: Any) -> list[Any]:
    """The chunks of ``ids`` as pyarrow Arrays (Array, ChunkedArray, numpy, list...)."""
    if isinstance(ids, pa.ChunkedArray):
        return list(ids.chunks)
    if isinstance(ids, pa.Array):
        return [ids]
    return [pa.array(ids)]


class CheckpointFilter:
    """A set of finished ids, split into hash shards.

    Build one empty (``CheckpointFilter(pa.string())``) or load one from Parquet files with
    :meth:`load`. Probe with :meth:`contains` / :meth:`filter`, record completed rows with
    :meth:`insert`, persist them with :meth:`write`.

    No false negatives; an id never inserted is reported present with probability at most
    ``len(self) / 2**100`` per lookup (the index keeps 100-bit fingerprints, not the ids).

    id_type: the Arrow type of the ids (``pa.string()``, ``"int64"``, ...): strings and binary
        share one family, integers another.
    num_shards: hash shards (a power of two, default 16); a checkpoint written from this
        index keeps ``shard=<k>/`` directories of it.
    id_column: the column that holds the ids in batches and in written files.
    num_threads: threads for bulk probes and loads (default: the number of cores).
    """

    __slots__ = ("_inner",)

    def __init__(
        self,
        id_type: pa.DataType | str,
        *,
        num_shards: int | None = None,
        id_column: str = "id",
        num_threads: int | None = None,
    ):
        arrow_type = pa.type_for_alias(id_type) if isinstance(id_type, str) else id_type
        self._inner = _forebay.RsCheckpointIndex(
            arrow_type, num_shards or DEFAULT_NUM_SHARDS, id_column, num_threads
        )

    @classmethod
    def load(
        cls,
        path: str | Sequence[str],
        id_column: str,
        *,
        num_shards: int | None = None,
        shards: Iterable[int] | None = None,
        storage_options: Mapping[str, str] | None = None,
        num_threads: int | None = None,
    ) -> CheckpointFilter:
        """Load the ids in column ``id_column`` of the Parquet files at ``path``.

        ``path`` is a checkpoint written by :meth:`write` (``shard=<k>/`` directories and a
        manifest), or any file, directory, glob or URI (``s3://...``) of Parquet files with an
        id column, such as the flat directory Ray Data writes: only that column is read.
        ``num_shards`` defaults to the manifest's (else 16). ``shards`` loads only those shards
        (a worker owning part of the id space); probing another shard's id then raises.
        ``storage_options`` are object_store options for ``s3://`` and other URIs (as in
        :func:`forebay.read_parquet`); ``num_threads`` bounds the loading threads (default:
        the number of cores).
        """
        obj = cls.__new__(cls)
        obj._inner = _forebay.RsCheckpointIndex.load(
            str(path),
            id_column,
            num_shards,
            None if shards is None else [int(k) for k in shards],
            storage_options,
            num_threads,
        )
        return obj

    def insert(self, ids: Any) -> int:
        """Add ids (rows completed in this run); nulls are skipped. Returns how many were new.

        Inserted ids are kept until the next :meth:`write` persists them.
        """
        return sum(self._inner.insert(chunk) for chunk in _arrays(ids))

    def contains(self, ids: Any) -> pa.BooleanArray | pa.ChunkedArray:
        """True for each of ``ids`` already in the index (False for nulls). ``ids`` is a
        pyarrow Array, ChunkedArray (then the result is a ChunkedArray), numpy array or list;
        the result is a BooleanArray of the same length."""
        if isinstance(ids, pa.ChunkedArray):
            return pa.chunked_array([self._inner.contains(c) for c in ids.chunks], type=pa.bool_())
        return self._inner.contains(_arrays(ids)[0])

    def filter(self, data: Any) -> Any:
        """``data`` without the rows whose id (column :attr:`id_column`) is in the index.

        ``data`` is a ``pyarrow.RecordBatch`` or ``Table`` (same type back), or a
        :class:`forebay.Dataset`: then an iterator of ``RecordBatch`` in scan order, read and
        filtered on several threads while you consume it. The schema is unchanged; rows with
        a null id are kept. When no row of a batch or table is removed, that input object
        itself is returned (no copy). A Table's batches are filtered in parallel.
        """
        if isinstance(data, Dataset):
            return self._inner.filter_scan(data._inner)
        if isinstance(data, pa.RecordBatch):
            out = self._inner.filter_batch(data)
            return data if out is None else out
        if isinstance(data, pa.Table):
            batches = data.to_batches()
            results = self._inner.filter_batches(batches)
            if all(r is None for r in results):
                return data
            return pa.Table.from_batches(
                [b if r is None else r for b, r in zip(batches, results, strict=True)],
                schema=data.schema,
            )
        raise TypeError(
            f"CheckpointFilter.filter takes a pyarrow.Table or RecordBatch, not {type(data).__name__}"
        )

    def merge(self, other: CheckpointFilter) -> None:
        """Add every id of ``other`` (same shard count and id family)."""
        self._inner.merge(other._inner)

    def write(
        self, path: str, *, storage_options: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Persist the ids inserted since the last write to the checkpoint at ``path``.

        Writes one Parquet file per shard that received ids, ``<path>/shard=<k>/part-*.parquet``,
        each committed atomically (temp file, fsync, rename, directory fsync; a single PUT on
        object stores), plus the manifest on first write. A checkpoint is an append-only set of
        parts: loaded ids are not rewritten. Returns ``{"files": [...], "ids": n}``.
        ``storage_options`` are object_store options for ``s3://`` and other URIs.
        """
        return self._inner.write(path, storage_options)

    def shard_ids(self, ids: Any) -> pa.UInt32Array:
        """The shard of each of ``ids`` (the on-disk ``shard=<k>`` it is written to)."""
        parts = [self._inner.shard_ids(a) for a in _arrays(ids)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return pa.array([], pa.uint32())
        return pa.concat_arrays(parts)

    def __len__(self) -> int:
        return self._inner.__len__()

    def __repr__(self) -> str:
        return (
            f"CheckpointFilter({len(self)} ids, {self.num_shards} shards, "
            f"id_column={self.id_column!r}, id_type={self.id_type})"
        )

    @property
    def memory_bytes(self) -> int:
        """Heap bytes held by the index (including inserted ids not yet written)."""
        return self._inner.memory_bytes()

    @property
    def num_shards(self) -> int:
        return self._inner.num_shards()

    @property
    def loaded_shards(self) -> list[int]:
        return self._inner.loaded_shards()

    @property
    def pending_ids(self) -> int:
        """Ids inserted since the last :meth:`write`."""
        return self._inner.pending_ids()

    @property
    def id_column(self) -> str:
        return self._inner.id_column()

    @property
    def id_type(self) -> pa.DataType:
        return self._inner.id_type()
