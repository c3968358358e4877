"""``forebay.ray.read_parquet``: forebay's Parquet reader inside Ray Data read tasks."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

import forebay

from .._filters import normalize_filter
from .._read import listing_roots
from ._lineage import TAG_FIELDS, CheckpointedRead

try:
    import ray
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask
except ImportError as e:  # pragma: no cover - exercised only without Ray
    raise ImportError("forebay.ray needs Ray Data: pip install 'forebay[ray]'") from e

KiB = 1 << 10
MiB = 1 << 20
#: Bounds of a read task's share of the input when Ray's requested parallelism sets it.
MIN_TASK_BYTES = 64 * MiB
MAX_TASK_BYTES = 512 * MiB
#: Read tasks per CPU of the cluster that :func:`read_parquet` plans by default: enough for
#: every CPU to stay busy while a slow task finishes, and for a run to make progress it can
#: commit long before its end.
TASKS_PER_CPU = 2
#: The smallest share of input a default task gets (smaller inputs make fewer tasks).
MIN_DEFAULT_TASK_BYTES = 64 * KiB
#: The smallest byte range a file is cut into (a smaller one would mostly hold no row
#: group start, and cost its task a footer read for nothing).
MIN_PIECE_BYTES = 64 * KiB


@dataclass(frozen=True)
class Piece:
    """A read task's share of one file: the row groups whose first byte lies in
    ``[start, end)``, piece ``part`` of the ``parts`` the file is cut into."""

    file: int
    start: int
    end: int
    part: int = 0
    parts: int = 1

    @property
    def whole(self) -> bool:
        return self.parts == 1


def plan_tasks(sizes: Sequence[int], task_bytes: int) -> list[list[Piece]]:
    """Read tasks of about ``task_bytes`` of input each, in scan order: consecutive small
    files share a task; a file larger than ``task_bytes`` is cut into byte ranges of at
    least ``MIN_PIECE_BYTES``, one task each (a row group goes to the range holding its first byte, so the pieces of a file
    read each row group once; a range holding no row group start reads nothing)."""
    tasks: list[list[Piece]] = []
    current: list[Piece] = []
    held = 0
    for i, size in enumerate(sizes):
        parts = max(1, min(-(-size // task_bytes), size // MIN_PIECE_BYTES))
        if parts > 1:
            if current:
                tasks.append(current)
                current, held = [], 0
            step = -(-size // parts)
            tasks.extend(
                [Piece(i, p * step, min(size, (p + 1) * step), p, parts)] for p in range(parts)
            )
            continue
        if current and held + size > task_bytes:
            tasks.append(current)
            current, held = [], 0
        current.append(Piece(i, 0, size))
        held += size
    if current:
        tasks.append(current)
    return tasks


def default_task_bytes(total_bytes: int, cpus: int) -> int:
    """The share of input per task :func:`read_parquet` plans by default: the input over
    ``TASKS_PER_CPU`` tasks per CPU, within 64 KiB - 512 MiB."""
    share = total_bytes // (TASKS_PER_CPU * max(cpus, 1))
    return max(MIN_DEFAULT_TASK_BYTES, min(MAX_TASK_BYTES, share))


def cluster_cpus() -> int:
    """CPUs of the Ray cluster (started here when none is running)."""
    if not ray.is_initialized():
        ray.init()
    return int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]


def _read_task(
    files: list[str],
    ranges: dict[str, tuple[int, int]],
    schema: pa.Schema,
    columns: list[str] | None,
    filter: Any,
    storage_options: dict[str, str] | None,
    batch_size: int,
    num_threads: int,
    partitions: dict[str, Any],
    checkpointed: CheckpointedRead | None = None,
) -> Iterator[pa.Table]:
    """What one read task runs on its worker: forebay's reader over its files (of a file
    cut into pieces, the row groups starting in its byte range)."""
    dataset = forebay.read_parquet(
        files,
        columns=columns,
        filter=filter,
        storage_options=storage_options,
        batch_size=batch_size,
        num_threads=num_threads,
        **partitions,
    )._inner
    if checkpointed is not None:
        blocks = checkpointed.read(dataset, ranges)
    else:
        if ranges:
            dataset = dataset.with_byte_ranges(ranges)
        blocks = (pa.Table.from_batches([b]) for b in dataset.scan() if b.num_rows)
    empty = True
    for block in blocks:
        empty = False
        yield block
    if empty:
        # A task whose range holds no row group (or only done rows) still says its schema:
        # Ray Data would otherwise count a block without columns.
        yield schema.empty_table()


def _no_rows(schema: pa.Schema) -> Iterator[pa.Table]:
    yield schema.empty_table()


class ForebayParquetDatasource(Datasource):
    """A Ray Data datasource reading Parquet through forebay.

    The driver lists the files and reads one footer (for the schema); each read task gets
    consecutive files adding up to about ``task_bytes`` (or a byte range of a larger file:
    the row groups starting in it) and reads their footers and only the selected column
    chunks, skipping row groups the filter rules out. Blocks are ``pyarrow.Table`` s of up
    to ``batch_size`` rows.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        columns: Sequence[str] | None = None,
        filter: Any = None,
        storage_options: Mapping[str, str] | None = None,
        batch_size: int = 65536,
        task_bytes: int | None = None,
        num_threads_per_task: int = 1,
        partitioning: str | None = "hive",
    ):
        super().__init__()  # type: ignore[no-untyped-call]
        if task_bytes is not None and task_bytes < 1:
            raise ValueError("task_bytes must be at least 1")
        if num_threads_per_task < 1:
            raise ValueError("num_threads_per_task must be at least 1")
        normalize_filter(filter)  # a bad filter fails here, on the driver
        self._options = dict(storage_options) if storage_options else None
        listed = forebay.read_parquet(
            paths,
            columns=columns,
            filter=filter,
            storage_options=self._options,
            batch_size=batch_size,
            partitioning=partitioning,
        )
        # Read tasks get lists of files: they take partition values from the directories
        # below the ones listed here, typed as here (a task's files alone might infer other
        # types), and files the filter's terms on partition keys rule out are not planned.
        self._partitions: dict[str, Any] = {"partitioning": None}
        partition_schema = listed._inner.partition_schema()
        if partition_schema is not None:
            given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
            self._partitions = {
                "partitioning": "hive",
                "hive_schema": partition_schema,
                "partition_base": listing_roots([os.fspath(p) for p in given]),
            }
        pruned = set(listed._inner.files_pruned_by_partition())
        sizes = listed._inner.file_sizes()
        self._files = [f for i, f in enumerate(listed.files) if i not in pruned]
        self._sizes = [s for i, s in enumerate(sizes) if i not in pruned]
        self._schema = listed.schema
        self._columns = list(columns) if columns is not None else None
        self._filter = filter
        self._batch_size = batch_size
        self._task_bytes = task_bytes
        self._threads = num_threads_per_task
        self._estimated_rows: int | None = None
        #: Set by forebay.ray.write_parquet for the run it drives (see ``_lineage``).
        self.checkpointed: CheckpointedRead | None = None

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def files(self) -> list[str]:
        """The listed input files, in scan order."""
        return list(self._files)

    @property
    def columns(self) -> list[str] | None:
        return self._columns

    @property
    def partition_options(self) -> dict[str, Any]:
        """How a read of some of :attr:`files` takes their hive partition columns
        (``read_parquet``'s ``partitioning``, ``hive_schema`` and ``partition_base``)."""
        return dict(self._partitions)

    @property
    def storage_options(self) -> dict[str, str] | None:
        return self._options

    @property
    def scan_filter(self) -> Any:
        """The ``filter`` the read tasks apply (as given to :func:`read_parquet`)."""
        return self._filter

    def get_name(self) -> str:
        return "ForebayParquet"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(self._sizes)

    def estimated_rows(self) -> int:
        """Rows of the input, estimated from the first file's rows per byte (its footer)
        without reading every footer."""
        if self._estimated_rows is None:
            rows = 0
            if self._files and self._sizes[0]:
                first = forebay.read_parquet(
                    self._files[0], storage_options=self._options, partitioning=None
                )
                rows = int(first.count_rows() * sum(self._sizes) / self._sizes[0])
            self._estimated_rows = rows
        return self._estimated_rows

    def estimated_row_bytes(self) -> int:
        """Bytes a row takes in memory, estimated from the file sizes (Parquet compresses:
        counted 2x) and :meth:`estimated_rows`."""
        rows = self.estimated_rows()
        return max(1, 2 * sum(self._sizes) // rows) if rows else 1

    def task_bytes(self, parallelism: int) -> int:
        """The input bytes a read task gets: the caller's ``task_bytes``, else the total
        over Ray's requested parallelism, kept within 64-512 MiB (a task per tiny file
        would spend its time starting up)."""
        if self._task_bytes is not None:
            return self._task_bytes
        total = sum(self._sizes)
        share = total // max(parallelism, 1)
        return max(MIN_TASK_BYTES, min(MAX_TASK_BYTES, share))

    def with_task_bytes(self, task_bytes: int) -> ForebayParquetDatasource:
        """The same source with a fixed share of input per read task."""
        if task_bytes < 1:
            raise ValueError("task_bytes must be at least 1")
        other = copy.copy(self)
        other._task_bytes = task_bytes
        return other

    def tasks(self, parallelism: int) -> list[list[Piece]]:
        """The read tasks' shares of the input (see :func:`plan_tasks`)."""
        return plan_tasks(self._sizes, self.task_bytes(parallelism))

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        if not self._files:
            # The filter's terms on partition keys ruled out every file: one task saying the
            # schema (Ray Data has none for a dataset of no blocks).
            metadata = BlockMetadata(num_rows=0, size_bytes=0, input_files=(), exec_stats=None)
            read = functools.partial(_no_rows, self._schema)
            return [ReadTask(read, metadata, schema=self._schema)]
        tasks = []
        for pieces in self.tasks(parallelism):
            files = [self._files[p.file] for p in pieces]
            ranges = {self._files[p.file]: (p.start, p.end) for p in pieces if not p.whole}
            metadata = BlockMetadata(
                num_rows=None,
                size_bytes=sum(p.end - p.start for p in pieces),
                input_files=tuple(files),
                exec_stats=None,
            )
            schema = self._schema
            if self.checkpointed is not None:
                for tag in TAG_FIELDS:
                    schema = schema.append(tag)
            read = functools.partial(
                _read_task,
                files,
                ranges,
                schema,
                self._columns,
                self._filter,
                self._options,
                self._batch_size,
                self._threads,
                self._partitions,
                self.checkpointed.for_pieces(pieces, self._files) if self.checkpointed else None,
            )
            tasks.append(
                ReadTask(read, metadata, schema=schema, per_task_row_limit=per_task_row_limit)
            )
        return tasks


def read_parquet(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    storage_options: Mapping[str, str] | None = None,
    batch_size: int = 65536,
    task_bytes: int | None = None,
    num_threads_per_task: int = 1,
    override_num_blocks: int | None = None,
    ray_remote_args: Mapping[str, Any] | None = None,
    partitioning: str | None = "hive",
) -> ray.data.Dataset:
    """Read Parquet into a ``ray.data.Dataset`` with forebay's reader in the read tasks.

    paths, columns, filter, storage_options, batch_size, partitioning: as
        :func:`forebay.read_parquet` (only the selected column chunks are fetched; row groups
        and pages the filter rules out are skipped, and files its terms on hive partition
        keys rule out are not planned).
    task_bytes: input bytes per read task: consecutive files are grouped up to it, and a
        larger file is cut into byte ranges (a task reads the row groups starting in its
        range). Default: the input over two tasks per CPU of the cluster, within 64 KiB -
        512 MiB, so that small inputs run in parallel too.
    num_threads_per_task: decoding threads of each read task (match the task's CPUs).
    override_num_blocks: the parallelism Ray asks the datasource for; default the number of
        read tasks (a larger one would make Ray split every block into small pieces).
    ray_remote_args: options of the read tasks (``num_cpus``, ``memory``, ...).
    """
    source = ForebayParquetDatasource(
        paths,
        columns=columns,
        filter=filter,
        storage_options=storage_options,
        batch_size=batch_size,
        task_bytes=task_bytes,
        num_threads_per_task=num_threads_per_task,
        partitioning=partitioning,
    )
    if task_bytes is None:
        total = source.estimate_inmemory_data_size() or 0
        source = source.with_task_bytes(default_task_bytes(total, cluster_cpus()))
    if override_num_blocks is None:
        # Ray splits each block into pieces when it gets fewer tasks than it asked for.
        override_num_blocks = len(source.get_read_tasks(1))
    dataset: ray.data.Dataset = ray.data.read_datasource(
        source,
        override_num_blocks=override_num_blocks,
        ray_remote_args=dict(ray_remote_args) if ray_remote_args else None,
    )
    return dataset
