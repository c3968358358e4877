"""``forebay.read_parquet``: Parquet files (paths, directories, globs, URIs) opened lazily as a
:class:`forebay.Dataset` (footers are read when the dataset is first used)."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from . import _forebay
from ._args import integer, optional_integer
from ._dataset import Dataset
from ._filters import normalize_filter


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
    file_extensions: Sequence[str] | None = ("parquet", "parq", "pq"),
    schema: Any = None,
    fetch_ahead: int | None = None,
    coalesce_gap: int | None = None,
    partitioning: str | None = "hive",
    hive_schema: pa.Schema | None = None,
    partition_base: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
) -> Dataset:
    """Open Parquet files lazily.

    paths: a file, directory, glob (``data/*.parquet``, ``data/**/*.parquet``) or URI
        (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``, ``memory://``), or a list.
        Directories are read recursively; names starting with ``_`` or ``.`` are skipped, and
        so are names without one of ``file_extensions``.
    columns: column names to read; ``"a.b"`` selects part of a nested column. Only the
        selected column chunks are fetched. Output follows this order.
    filter: pyarrow-style tuples: ``[("x", ">", 5), ("y", "in", [1, 2])]`` (a list is AND, a
        list of lists is OR of ANDs). Operators: ``= == != < <= > >= in not in`` and
        ``("x", "is null")`` / ``("x", "is not null")``. Row groups and pages that cannot
        match are skipped using statistics; the surviving rows are filtered exactly.
    batch_size: rows per batch (filtered batches can be smaller, and so are the first row
        group's, at most 8,192 rows each: the first batch arrives sooner).
    prefetch: row groups in flight at once (bounds memory); default threads + 2.
    fetch_ahead: on an object store, the most row groups whose column chunks are requested
        ahead of their decoding, beyond ``prefetch`` (0: none; default: as many of the
        first file's row groups as 256 MiB of their selected chunks holds, 32 to 256). Each
        request waits a round trip before its first byte, so more in flight keep a slow
        link busy; how many are is measured (at first as many as the cores decode in a
        round trip, at least 8; deeper whenever decoding waits for data). A
        pipeline scans with fewer when their bytes would not fit a quarter of its memory
        cap. Not for row groups whose pages a page index pruned (their decoder reads only
        the pages it needs).
    coalesce_gap: on an object store, fetch column chunks at most this many bytes apart in
        one request, gap included (fewer requests, more bytes). Default: only the selected
        bytes, plus gaps that add at most 1/8 to them (or 256 KiB a row group, when little
        is selected) and cost less than a round trip at
        the measured link (requests are many, but in parallel); a store that bills or
        limits requests more than bytes may want ``1 << 20``.
    num_threads: row groups decoded in parallel; default and maximum the number of cores.
    dictionary_columns: string/binary columns to return as dictionary arrays.
    storage_options: object_store options, e.g. ``{"aws_endpoint": "http://127.0.0.1:9000",
        "aws_allow_http": "true", "aws_region": "us-east-1"}``; values are taken as their
        strings (``True`` works as ``"true"``). They win over the environment (``AWS_*``,
        ``GOOGLE_*``, ``AZURE_*``). pyarrow's and fsspec's S3 names work too (``key``,
        ``secret``, ``endpoint_override`` with ``scheme``, ``region_name``, ``anon``,
        ``client_kwargs``). A key the URI's store does not know is an error naming the
        closest valid key, never silently ignored.
    int96_timestamp_unit: unit of timestamps stored as (deprecated) INT96: ``"ns"`` (the
        default, as pyarrow), ``"us"``, ``"ms"`` or ``"s"``. INT96 can hold dates beyond the
        ±292 years of 64-bit nanoseconds; such values wrap in ``"ns"`` (as in pyarrow), so read
        Spark/Impala files with dates like 9999-12-31 with ``"us"``.
    file_extensions: which files of a directory are read (as Ray's ``file_extensions``):
        names ending in one of these (default ``parquet``, ``parq``, ``pq``), so that a stray
        ``README`` or ``.csv`` beside the data is not read as Parquet; ``None`` reads every
        file. Files and globs named explicitly are read whatever their name.
    schema: for files whose columns differ (a table that gained, dropped or widened columns
        over time). ``None`` (the default): every file must have the first file's columns
        and types. A ``pyarrow.Schema``: every file is read as it. ``"union"``: the union of
        the files' columns, by name in order of first appearance (every footer is read when
        the dataset opens). A column a file lacks comes out as nulls (the field must be
        nullable); a type that differs is widened only where no value changes: integers to
        wider integers that hold them, small integers and float32 to float64, string and
        binary to their large or view layouts, date32 to date64, timestamps to a finer unit
        of the same zone, decimals to more precision. Anything else raises
        ``forebay.SchemaMismatchError`` naming the file, the column and both types.
        ``columns`` pick among the schema's columns; a filter's columns must be in every file.
    partitioning: ``"hive"`` (the default, as pyarrow, polars, DuckDB and Ray Data): files
        listed under ``key=value`` directories of a directory or glob given
        (``table/year=2024/region=eu/part-0.parquet``) get a column per key holding its
        value, after their own columns (``columns`` may place them). A key's column is int64
        when every value is an integer, else string; values are percent-decoded (``%3A``
        is ``:``) and ``__HIVE_DEFAULT_PARTITION__`` is null. A ``filter``'s terms on keys
        are decided per file before it is read: files they rule out are never opened
        (``metrics()["files_pruned_by_partition"]``). Every file must sit under the same
        keys; a file with a column of a key's name is an error. Files named one by one
        have no partition values. ``None``: directories give no columns.
    hive_schema: a ``pyarrow.Schema`` of partition keys' types (as polars' ``hive_schema``):
        the keys it names are parsed as those types (``pa.date32()``, ``pa.int32()``, ...;
        a value that does not parse is a ``SchemaMismatchError`` naming the file), the
        others inferred; a key it names that no directory gives is an error.
    partition_base: a directory (or a list) above files named one by one: they take
        partition values from the directories between it and them, as if it had been
        listed (pyarrow's ``partition_base_dir``).
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    path_list = [os.fspath(p) for p in items]
    if not path_list:
        raise ValueError("read_parquet: no paths given")
    if isinstance(columns, str):
        raise TypeError("columns must be a list of names, not a single string")
    if columns is not None and len(columns) == 0:
        raise ValueError(
            "columns=[] selects no column; name at least one column (or pass None for all; "
            "count_rows() counts rows without reading any)"
        )
    if columns is not None and len(set(columns)) < len(columns):
        twice = next(c for i, c in enumerate(columns) if c in columns[:i])
        raise ValueError(
            f"columns names {twice!r} twice; a column is read once (name each at most once)"
        )
    batch_size = integer("batch_size", batch_size, minimum=1)
    prefetch = optional_integer("prefetch", prefetch, minimum=1)
    num_threads = optional_integer("num_threads", num_threads, minimum=1)
    fetch_ahead = optional_integer("fetch_ahead", fetch_ahead, minimum=0)
    coalesce_gap = optional_integer("coalesce_gap", coalesce_gap, minimum=0)
    union = isinstance(schema, str) and schema == "union"
    if partitioning not in ("hive", None):
        raise ValueError(
            f"partitioning must be 'hive' or None, not {partitioning!r} (other schemes, such as "
            "directories without key=, are not read as columns)"
        )
    if hive_schema is not None and not isinstance(hive_schema, pa.Schema):
        raise TypeError(f"hive_schema must be a pyarrow.Schema, not {type(hive_schema).__name__}")
    if partitioning is None and (hive_schema is not None or partition_base is not None):
        raise ValueError("hive_schema and partition_base need partitioning='hive'")
    bases = None
    if partition_base is not None:
        given = (
            [partition_base] if isinstance(partition_base, (str, os.PathLike)) else partition_base
        )
        bases = [os.fspath(b) for b in given]
    if schema is not None and not union and not isinstance(schema, pa.Schema):
        raise TypeError(
            f"schema must be a pyarrow.Schema, 'union' or None, not {type(schema).__name__}"
        )
    inner = _forebay.RsDataset(
        path_list,
        list(columns) if columns is not None else None,
        normalize_filter(filter),
        int(batch_size),
        prefetch,
        num_threads,
        list(dictionary_columns) if dictionary_columns is not None else None,
        storage_options,
        int96_timestamp_unit,
        None if file_extensions is None else _extensions(file_extensions),
        None if union else schema,
        union,
        fetch_ahead,
        coalesce_gap,
        partitioning == "hive",
        hive_schema,
        bases,
    )
    dataset = Dataset(inner)
    dataset._read_args = functools.partial(
        read_parquet,
        path_list,
        columns=columns,
        filter=filter,
        batch_size=batch_size,
        prefetch=prefetch,
        num_threads=num_threads,
        dictionary_columns=dictionary_columns,
        storage_options=storage_options,
        int96_timestamp_unit=int96_timestamp_unit,
        file_extensions=file_extensions,
        schema=schema,
        fetch_ahead=fetch_ahead,
        coalesce_gap=coalesce_gap,
        partitioning=partitioning,
        hive_schema=hive_schema,
        partition_base=partition_base,
    )
    return dataset


def _extensions(file_extensions: Sequence[str]) -> list[str]:
    if isinstance(file_extensions, str):
        raise TypeError("file_extensions must be a list of endings, not a single string")
    return [str(e) for e in file_extensions]


def listing_roots(given: list[str]) -> list[str]:
    """The directories ``read_parquet`` lists for paths ``given``: a directory itself, a
    glob's literal prefix (local paths absolute), each ending in ``/``. A file's hive
    partition directories are those between its root and it."""
    roots = []
    for path in given:
        if "://" not in path:
            path = os.path.abspath(path)
        glob_at = min((i for i in map(path.find, "*?[") if i >= 0), default=-1)
        if glob_at >= 0:
            path = path[:glob_at].rsplit("/", 1)[0]
        roots.append(path.rstrip("/") + "/")
    return roots
