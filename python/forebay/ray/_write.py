"""``forebay.ray.write_parquet``: exactly-once, resumable writes from a Ray Dataset.

```text
 driver                                            Ray cluster
 ──────                                            ───────────
 RsCommitCoordinator: lock, recover interrupted
   commits, check inputs, manifest
 ShardedCheckpointFilter (ids done, in actors)
 arm the dataset's ForebayParquetDatasource ─────► read tasks: skip finished input, drop done
                                                   ids, tag rows with their unit (_lineage)
                                                     │ user steps (map_batches, ...)
                                                     ▼
                                                   stage tasks: data file + id parts under
                                                   _forebay_staging/, one per block
 commit each staged file, one at a time,  ◄──────── staged commit (JSON) + rows per unit
   with the units it finishes (UnitTracker)
 finish: fold records, delete leftovers
```

The commit protocol is forebay-engine's (``commit`` and ``coordinator`` modules): a data
file and its ids become visible together, through one atomic record the driver writes, so a
killed task, driver or cluster leaves either a commit that happened (rolled forward by the
next run) or one that did not (its staged files deleted, its rows written again).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Mapping
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

import forebay

from .._checkpointing import Checkpoint
from .._forebay import RsCommitCoordinator, RsCommitStager
from ._checkpoint import ShardedCheckpointFilter
from ._datasource import ForebayParquetDatasource
from ._lineage import UNIT_COLUMN, CheckpointedRead, LedgerShardOwner, UnitTracker

try:
    import ray
    from ray.data._internal.logical.operators.read_operator import Read
except ImportError as e:  # pragma: no cover - exercised only without Ray
    raise ImportError("forebay.ray needs Ray Data: pip install 'forebay[ray]'") from e

#: Rows per data file (and commit) unless the caller says otherwise.
DEFAULT_MIN_ROWS_PER_FILE = 131_072

_STAGED_SCHEMA = pa.schema([("staged", pa.string()), ("units", pa.string()), ("rows", pa.int64())])


def _forebay_source(ds: ray.data.Dataset) -> ForebayParquetDatasource:
    """The one forebay datasource the dataset reads from."""
    found: list[ForebayParquetDatasource] = []
    seen: set[int] = set()

    def walk(op: Any) -> None:
        if id(op) in seen:
            return
        seen.add(id(op))
        if isinstance(op, Read) and isinstance(op.datasource, ForebayParquetDatasource):
            found.append(op.datasource)
        for parent in op.input_dependencies:
            walk(parent)

    walk(ds._logical_plan.dag)
    if len(found) != 1:
        raise ValueError(
            "forebay.ray.write_parquet with a checkpoint needs a dataset that reads from "
            f"exactly one forebay.ray.read_parquet (this one reads from {len(found)}): it "
            "skips finished input files and row groups in forebay's read tasks"
        )
    return found[0]


def _stage_block(spec: str, table: pa.Table) -> pa.Table:
    """A stage task: one block -> one staged data file (and its ids), described in a row."""
    rows_per_unit: str | None = None
    if UNIT_COLUMN in table.column_names:
        counts = pc.value_counts(table.column(UNIT_COLUMN))
        rows_per_unit = json.dumps(
            dict(
                zip(
                    counts.field("values").to_pylist(),
                    counts.field("counts").to_pylist(),
                    strict=True,
                )
            )
        )
        table = table.drop_columns([UNIT_COLUMN])
    staged = None
    if table.num_rows:
        staged = RsCommitStager(spec).stage(table.combine_chunks().to_batches())
    return pa.table(
        {"staged": [staged], "units": [rows_per_unit], "rows": [table.num_rows]},
        schema=_STAGED_SCHEMA,
    )


def write_parquet(
    ds: ray.data.Dataset,
    path: str | os.PathLike[str],
    *,
    checkpoint: Checkpoint,
    on_changed_input: str = "error",
    compression: str = "zstd",
    min_rows_per_file: int | None = DEFAULT_MIN_ROWS_PER_FILE,
    row_group_rows: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    num_filter_actors: int | None = None,
    ray_remote_args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``ds`` to Parquet files under ``path`` exactly once, resumably.

    ``ds`` must read from :func:`forebay.ray.read_parquet` (any Ray Data steps may follow:
    ``map_batches`` and the like). Killed at any moment (a task, an actor, the driver, the
    cluster) and run again with the same checkpoint, the job skips the input files and row
    groups whose rows are all committed without reading them, drops rows whose id is done
    right after reading (in sharded actors), and writes every row exactly once.

    checkpoint: a :class:`forebay.Checkpoint` (a directory or URI every task can reach; its
        ``id_column`` must survive your steps). A directory of Ray Data's checkpoint files
        counts their ids as done.
    on_changed_input: ``"error"`` (default) or ``"reprocess"`` an input file that changed
        since the checkpoint recorded it.
    compression, row_group_rows: of the data files (default zstd, 131,072 rows).
    min_rows_per_file: rows gathered into each file, and so into each commit (Ray's
        ``batch_size`` of the stage step; default 131,072; None: one file per block, which
        after a step with a small ``batch_size`` means many small files and commits).
    storage_options: object_store options for a URI ``path``.
    num_filter_actors: actors sharing the checkpoint's ids (default
        ``min(num_shards, 4)``).
    ray_remote_args: options of the stage tasks (``num_cpus``, ``memory``, ...).

    Returns ``{"rows", "files", "bytes", "seconds", "paths", "resume"}``; ``resume`` holds
    what recovery found (``commits_recovered``, ``files_done``, ``files_changed``), the ids
    done at the start (``ids_done``), and the input units (row groups) this run recorded
    finished (``units_finished``) or could not (``finished_not_recorded``: the reason).

    Skipping finished row groups relies on each output row keeping its input row's hidden
    ``__forebay_unit`` column, as steps that add columns to the batch they get do. A step
    that drops it (or emits several rows per input row) turns skipping off for the run,
    with a warning; exactly-once still holds through the ids.
    """
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError("checkpoint must be a forebay.Checkpoint")
    if on_changed_input not in ("error", "reprocess"):
        raise ValueError(
            f"on_changed_input must be 'error' or 'reprocess', not {on_changed_input!r}"
        )
    if min_rows_per_file is not None and min_rows_per_file < 1:
        raise ValueError("min_rows_per_file must be at least 1")
    started = time.monotonic()
    source = _forebay_source(ds)
    if source.columns is not None and checkpoint.id_column not in source.columns:
        raise ValueError(
            f"read_parquet(columns={source.columns}) does not read the checkpoint's id "
            f"column {checkpoint.id_column!r}"
        )
    if source.checkpointed is not None:
        raise RuntimeError("this dataset is being written with a checkpoint already")
    if not ray.is_initialized():
        ray.init()
    # The read tasks' filter, so that the checkpoint records what its inputs were finished
    # under (a rerun with another filter must not skip them silently).
    inputs = forebay.read_parquet(
        source.files, storage_options=source.storage_options, filter=source.scan_filter
    )
    coordinator = RsCommitCoordinator(
        inputs._inner,
        checkpoint._args(on_changed_input),
        os.fspath(path),
        {str(k): str(v) for k, v in storage_options.items()} if storage_options else None,
        compression,
        row_group_rows,
    )
    try:
        return _run(
            ds,
            source,
            coordinator,
            checkpoint,
            min_rows_per_file,
            num_filter_actors,
            ray_remote_args,
            started,
        )
    finally:
        coordinator.close()


def _run(
    ds: ray.data.Dataset,
    source: ForebayParquetDatasource,
    coordinator: RsCommitCoordinator,
    checkpoint: Checkpoint,
    min_rows_per_file: int | None,
    num_filter_actors: int | None,
    ray_remote_args: Mapping[str, Any] | None,
    started: float,
) -> dict[str, Any]:
    files = coordinator.files()
    if files != source.files:
        raise RuntimeError(
            "the checkpoint's coordinator listed the input files differently from the "
            f"dataset ({len(files)} vs {len(source.files)} files)"
        )
    id_filter = ShardedCheckpointFilter(
        coordinator.state_uri(),
        checkpoint.id_column,
        num_shards=coordinator.num_shards(),
        num_actors=num_filter_actors,
        storage_options=checkpoint.storage_options,
        wait_for_load=False,  # the actors load while the read tasks start
        first_actor_class=LedgerShardOwner,
    )
    ledger = id_filter.actors[0]
    source.checkpointed = CheckpointedRead(
        checkpoint.id_column,
        json.loads(coordinator.finished_inputs()),
        {uri: i for i, uri in enumerate(files)},
        id_filter,
        ledger,
    )
    tracker = UnitTracker()
    try:
        staged = ds.map_batches(
            functools.partial(_stage_block, coordinator.stager_spec()),
            batch_format="pyarrow",
            batch_size=min_rows_per_file,
            zero_copy_batch=True,
            **dict(ray_remote_args or {}),
        )

        def new_reports() -> list[int]:
            return tracker.reported(*ray.get(ledger.take_new.remote()))

        for batch in staged.iter_batches(batch_size=None, batch_format="pyarrow"):
            block = cast(pa.Table, batch)
            for described, units, rows in zip(
                block.column("staged").to_pylist(),
                block.column("units").to_pylist(),
                block.column("rows").to_pylist(),
                strict=True,
            ):
                if described is None:
                    continue
                candidates = new_reports()
                rows_per_unit = json.loads(units) if units is not None else None
                tracker.committing(rows_per_unit, rows)
                candidates += [int(u) for u in rows_per_unit or {}]
                done_units, done_files = tracker.finished(candidates)
                coordinator.commit(described, done_units, done_files)
        new_reports()
        done_units, done_files = tracker.finished(tracker.all_units())
        coordinator.commit(None, done_units, done_files)
        ids_done = len(id_filter)
        coordinator.finish()
    finally:
        source.checkpointed = None
        id_filter.shutdown()
    committed = coordinator.committed()
    return {
        "rows": sum(rows for _, rows, _ in committed),
        "files": len(committed),
        "bytes": sum(size for _, _, size in committed),
        "seconds": time.monotonic() - started,
        "paths": [p for p, _, _ in committed],
        "resume": {
            **coordinator.report(),
            "ids_done": ids_done,
            "units_finished": len(tracker.recorded),
            "finished_not_recorded": tracker.stopped,
        },
    }
