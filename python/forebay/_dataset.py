"""``forebay.read_parquet`` and ``forebay.Dataset``: a lazy Parquet dataset read by Rust."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from . import _forebay
from ._filters import normalize_filter


class Dataset:
    """A lazy Parquet dataset. Nothing is decoded until you iterate.

    Iterating yields ``pyarrow.RecordBatch`` objects in a deterministic order (file, then row
    group). The object implements ``__arrow_c_stream__``, so ``pyarrow.table(ds)``,
    ``polars.from_arrow(ds)`` and DuckDB (``duckdb.sql("select * from ds")``) consume it
    without copying.
    """

    def __init__(self, _inner: _forebay.RsDataset):
        self._inner = _inner

    @property
    def schema(self) -> pa.Schema:
        """Schema of the batches (projection and dictionary columns applied)."""
        return self._inner.schema()

    @property
    def files(self) -> list[str]:
        """The files read, in scan order."""
        return self._inner.files()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self._inner.scan())

    def iter_batches(self) -> Iterator[pa.RecordBatch]:
        """Stream the batches (same as iterating the dataset)."""
        return iter(self)

    def iter_batches_with_provenance(self) -> Iterator[tuple[pa.RecordBatch, dict[str, Any]]]:
        """Stream ``(batch, provenance)`` pairs.

        ``provenance`` has ``file``, ``file_index``, ``row_group``, ``row_group_first_row``,
        ``batch_index`` and ``first_row`` (index within the file of the batch's first row;
        ``None`` when a filter removed rows, since rows are then not consecutive).
        """
        scan = self._inner.scan()
        while True:
            item = scan.next_with_provenance()
            if item is None:
                return
            yield item

    def to_arrow(self) -> pa.Table:
        """Read everything into a ``pyarrow.Table``."""
        return pa.Table.from_batches(list(self), schema=self.schema)

    to_table = to_arrow

    def count_rows(self) -> int:
        """Row count: from file footers alone when there is no filter."""
        return self._inner.count_rows()

    def metrics(self) -> dict[str, int]:
        """I/O and pruning counters accumulated over this dataset's scans.

        Keys: ``data_requests``, ``data_bytes`` (column-chunk reads after coalescing),
        ``footer_requests``, ``footer_bytes``, ``list_requests``, ``head_requests``,
        ``row_groups_total``, ``row_groups_pruned_by_statistics``,
        ``row_groups_pruned_by_page_index``, ``rows_pruned_by_page_index``.
        """
        return self._inner.metrics()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self._inner.__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        files = self.files
        return f"<forebay.Dataset {len(files)} file(s), schema: {', '.join(self.schema.names)}>"


def read_parquet(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    batch_size: int = 65536,
    prefetch: int | None = None,
    num_threads: int | None = None,
    dictionary_columns: Sequence[str] | None = None,
    storage_options: Mapping[str, str] | None = None,
    int96_timestamp_unit: str = "ns",
) -> Dataset:
    """Open Parquet files lazily.

    paths: a file, directory, glob (``data/*.parquet``, ``data/**/*.parquet``) or URI
        (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``, ``memory://``), or a list.
        Directories are read recursively; names starting with ``_`` or ``.`` are skipped.
    columns: column names to read; ``"a.b"`` selects part of a nested column. Only the
        selected column chunks are fetched. Output follows this order.
    filter: pyarrow-style tuples: ``[("x", ">", 5), ("y", "in", [1, 2])]`` (a list is AND, a
        list of lists is OR of ANDs). Operators: ``= == != < <= > >= in not in`` and
        ``("x", "is null")`` / ``("x", "is not null")``. Row groups and pages that cannot
        match are skipped using statistics; the surviving rows are filtered exactly.
    batch_size: rows per batch (filtered batches can be smaller).
    prefetch: row groups in flight at once (bounds memory); default threads + 2.
    num_threads: row groups decoded in parallel; default and maximum the number of cores.
    dictionary_columns: string/binary columns to return as dictionary arrays.
    storage_options: object_store options, e.g. ``{"aws_endpoint": "http://127.0.0.1:9000",
        "aws_allow_http": "true", "aws_region": "us-east-1"}``.
    int96_timestamp_unit: unit of timestamps stored as (deprecated) INT96: ``"ns"`` (the
        default, as pyarrow), ``"us"``, ``"ms"`` or ``"s"``. INT96 can hold dates beyond the
        ±292 years of 64-bit nanoseconds; such values wrap in ``"ns"`` (as in pyarrow), so read
        Spark/Impala files with dates like 9999-12-31 with ``"us"``.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    path_list = [os.fspath(p) for p in items]
    if not path_list:
        raise ValueError("read_parquet: no paths given")
    if isinstance(columns, str):
        raise TypeError("columns must be a list of names, not a single string")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    inner = _forebay.RsDataset(
        path_list,
        list(columns) if columns is not None else None,
        normalize_filter(filter),
        int(batch_size),
        prefetch,
        num_threads,
        list(dictionary_columns) if dictionary_columns is not None else None,
        {str(k): str(v) for k, v in storage_options.items()} if storage_options else None,
        int96_timestamp_unit,
    )
    return Dataset(inner)
