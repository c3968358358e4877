"""``forebay.ray.read_parquet``: forebay's Parquet reader inside Ray Data read tasks."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

import forebay

from .._filters import normalize_filter
from ._lineage import UNIT_COLUMN, CheckpointedRead

try:
    import ray
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask
except ImportError as e:  # pragma: no cover - exercised only without Ray
    raise ImportError("forebay.ray needs Ray Data: pip install 'forebay[ray]'") from e

MiB = 1 << 20
#: Bounds of a read task's share of the input when Ray's requested parallelism sets it.
MIN_TASK_BYTES = 64 * MiB
MAX_TASK_BYTES = 512 * MiB


def group_files(sizes: Sequence[int], task_bytes: int) -> list[list[int]]:
    """Indexes of consecutive files, grouped so that each group holds about ``task_bytes``
    (a file larger than that is a group of its own). Scan order is kept."""
    groups: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i, size in enumerate(sizes):
        if current and held + size > task_bytes:
            groups.append(current)
            current, held = [], 0
        current.append(i)
        held += size
    if current:
        groups.append(current)
    return groups


def _read_task(
    files: list[str],
    columns: list[str] | None,
    filter: Any,
    storage_options: dict[str, str] | None,
    batch_size: int,
    num_threads: int,
    checkpointed: CheckpointedRead | None = None,
) -> Iterator[pa.Table]:
    """What one read task runs on its worker: forebay's reader over its files."""
    dataset = forebay.read_parquet(
        files,
        columns=columns,
        filter=filter,
        storage_options=storage_options,
        batch_size=batch_size,
        num_threads=num_threads,
    )
    if checkpointed is not None:
        yield from checkpointed.read(dataset._inner, files)
        return
    for batch in dataset:
        if batch.num_rows:
            yield pa.Table.from_batches([batch])


class ForebayParquetDatasource(Datasource):
    """A Ray Data datasource reading Parquet through forebay.

    The driver lists the files and reads one footer (for the schema); each read task gets
    consecutive files adding up to about ``task_bytes`` and reads their footers and only
    the selected column chunks, skipping row groups the filter rules out. Blocks are
    ``pyarrow.Table`` s of up to ``batch_size`` rows.
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
        )
        self._files = listed.files
        self._sizes = listed._inner.file_sizes()
        self._schema = listed.schema
        self._columns = list(columns) if columns is not None else None
        self._filter = filter
        self._batch_size = batch_size
        self._task_bytes = task_bytes
        self._threads = num_threads_per_task
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

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        tasks = []
        for group in group_files(self._sizes, self.task_bytes(parallelism)):
            files = [self._files[i] for i in group]
            metadata = BlockMetadata(
                num_rows=None,
                size_bytes=sum(self._sizes[i] for i in group),
                input_files=tuple(files),
                exec_stats=None,
            )
            read = functools.partial(
                _read_task,
                files,
                self._columns,
                self._filter,
                self._options,
                self._batch_size,
                self._threads,
                self.checkpointed.for_files(files) if self.checkpointed else None,
            )
            schema = self._schema
            if self.checkpointed is not None:
                schema = schema.append(pa.field(UNIT_COLUMN, pa.int64(), nullable=False))
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
) -> ray.data.Dataset:
    """Read Parquet into a ``ray.data.Dataset`` with forebay's reader in the read tasks.

    paths, columns, filter, storage_options, batch_size: as :func:`forebay.read_parquet`
        (only the selected column chunks are fetched; row groups and pages the filter rules
        out are skipped).
    task_bytes: input bytes per read task (consecutive files grouped up to it); default the
        total over twice the cluster's CPUs, within 64-512 MiB.
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
    )
    if task_bytes is None:
        if not ray.is_initialized():
            ray.init()
        cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
        source = source.with_task_bytes(source.task_bytes(2 * max(cpus, 1)))
    if override_num_blocks is None:
        # Ray splits each block into pieces when it gets fewer tasks than it asked for.
        override_num_blocks = len(source.get_read_tasks(1))
    dataset: ray.data.Dataset = ray.data.read_datasource(
        source,
        override_num_blocks=override_num_blocks,
        ray_remote_args=dict(ray_remote_args) if ray_remote_args else None,
    )
    return dataset
