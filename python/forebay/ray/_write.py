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
                                                   _forebay_staging*/, one per block
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
import hashlib
import json
import os
import time
from collections.abc import Mapping
from typing import Any, Literal, cast

import numpy as np
import pyarrow as pa

import forebay

from .._checkpoint_config import Checkpoint
from .._forebay import RsCommitCoordinator, RsCommitStager
from ._checkpoint import (
    ACTOR_NAMESPACE,
    ShardedCheckpointFilter,
    default_num_actors,
    forebay_cause,
    stop_named_actors,
)
from ._datasource import ForebayParquetDatasource, cluster_cpus
from ._lineage import (
    ROW_COLUMN,
    UNIT_COLUMN,
    CheckpointedRead,
    LedgerShardOwner,
    UnitLedger,
    UnitTracker,
    split_unit,
)

try:
    import ray
    from ray.data._internal.logical.operators.read_operator import Read
except ImportError as e:  # pragma: no cover - exercised only without Ray
    raise ImportError("forebay.ray needs Ray Data: pip install 'forebay[ray]'") from e

#: Rows per data file (and commit) of a large input unless the caller says otherwise.
DEFAULT_MIN_ROWS_PER_FILE = 131_072
#: Bounds of the blocks of a checkpointed write's execution.
MIN_BLOCK_BYTES = 64 << 10
MAX_BLOCK_BYTES = 128 << 20

_STAGED_SCHEMA = pa.schema(
    [
        ("staged", pa.string()),
        ("units", pa.string()),
        ("consumed", pa.string()),
        ("rows", pa.int64()),
        ("repeated", pa.list_(pa.int64())),
    ]
)


def _forebay_source(ds: ray.data.Dataset) -> ForebayParquetDatasource:
    """The one forebay datasource the dataset reads from."""
    found: list[ForebayParquetDatasource] = []
    reads: list[Any] = []  # Ray Data's own reads
    seen: set[int] = set()

    def walk(op: Any) -> None:
        if id(op) in seen:
            return
        seen.add(id(op))
        if isinstance(op, Read) and isinstance(op.datasource, ForebayParquetDatasource):
            found.append(op.datasource)
        elif isinstance(op, Read) or "Read" in type(op).__name__:
            reads.append(op)
        for parent in op.input_dependencies:
            walk(parent)

    walk(ds._logical_plan.dag)
    # Ray's own Parquet reader: a Read of its ParquetDatasource, or ReadFiles ops named
    # "ReadFilesParquet..." (Ray Data's file datasources, v2).
    others = [f"{type(getattr(op, 'datasource', None)).__name__} {op.name}" for op in reads]
    if not found and any("Parquet" in name for name in others):
        raise ValueError(
            "forebay.ray.write_parquet with a checkpoint needs a dataset read by "
            "forebay.ray.read_parquet, and this one reads with ray.data.read_parquet: replace "
            "ray.data.read_parquet(paths, columns=..., filter=...) by "
            "forebay.ray.read_parquet(paths, columns=..., filter=...) (same paths and "
            "columns; its read tasks skip finished input and done ids); or keep Ray's reader "
            "and write with Ray's own at-least-once checkpointing "
            "(DataContext.checkpoint_config = forebay.ray.checkpoint_config(...))"
        )
    if len(found) != 1:
        raise ValueError(
            "forebay.ray.write_parquet with a checkpoint needs a dataset that reads from "
            f"exactly one forebay.ray.read_parquet (this one reads from {len(found)}): it "
            "skips finished input files and row groups in forebay's read tasks"
        )
    return found[0]


def _stage_block(
    spec: str,
    output_options: dict[str, str],
    checkpoint_options: dict[str, str],
    table: pa.Table,
) -> pa.Table:
    """A stage task: one block -> one staged data file (and its ids), described in a row:
    the rows it holds per input unit, their positions, and the units some of whose rows
    share a position (rows a step multiplied). The spec names the output and the
    checkpoint; the options that open their stores come apart (the spec holds none)."""
    tags = [name for name in (UNIT_COLUMN, ROW_COLUMN) if name in table.column_names]
    rows_per_unit = consumed = None
    repeated: list[int] = []
    if len(tags) == 2:
        held = positions_held(
            table.column(UNIT_COLUMN).to_numpy(), table.column(ROW_COLUMN).to_numpy()
        )
        rows_per_unit = json.dumps({unit: rows for unit, (rows, _) in held.items()})
        consumed = json.dumps({unit: ranges for unit, (_, ranges) in held.items()})
        repeated = [
            unit for unit, (rows, ranges) in held.items() if rows > sum(e - s for s, e in ranges)
        ]
    table = table.drop_columns(tags)
    staged = None
    if table.num_rows:
        # The stager names a missing id column in its error.
        stager = RsCommitStager(spec, output_options, checkpoint_options)
        staged = stager.stage(table.combine_chunks().to_batches())
    return pa.table(
        {
            "staged": [staged],
            "units": [rows_per_unit],
            "consumed": [consumed],
            "rows": [table.num_rows],
            "repeated": [repeated],
        },
        schema=_STAGED_SCHEMA,
    )


def positions_held(
    units: np.ndarray, positions: np.ndarray
) -> dict[int, tuple[int, list[tuple[int, int]]]]:
    """Per unit of the rows' tags: how many rows, and the positions they hold as sorted,
    disjoint ranges ``(start, end)``."""
    order = np.lexsort((positions, units))
    units, positions = units[order], positions[order]
    bounds = np.flatnonzero(np.diff(units)) + 1
    held: dict[int, tuple[int, list[tuple[int, int]]]] = {}
    for first, end in zip(np.r_[0, bounds], np.r_[bounds, len(units)], strict=True):
        if first == end:
            continue
        run = positions[first:end]
        gaps = np.flatnonzero(np.diff(run) > 1) + 1
        starts = run[np.r_[0, gaps]]
        ends = run[np.r_[gaps - 1, len(run) - 1]] + 1
        held[int(units[first])] = (
            int(end - first),
            list(zip(starts.tolist(), ends.tolist(), strict=True)),
        )
    return held


def write_parquet(
    ds: ray.data.Dataset,
    path: str | os.PathLike[str],
    *,
    checkpoint: Checkpoint,
    on_changed_input: str = "error",
    compression: str = "zstd",
    min_rows_per_file: int | Literal["auto"] | None = "auto",
    row_group_rows: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    num_filter_actors: int | None = None,
    num_cpus_per_filter_actor: float = 0.0,
    ray_remote_args: Mapping[str, Any] | None = None,
    mode: str | None = None,
) -> dict[str, Any]:
    """Write ``ds`` to Parquet files under ``path`` exactly once, resumably.

    ``ds`` must read from :func:`forebay.ray.read_parquet` (any Ray Data steps may follow:
    ``map_batches``, ``filter`` and the like). Killed at any moment (a task, an actor, the
    driver, the cluster) and run again with the same checkpoint, the job skips the input
    files and row groups that are finished without reading them, drops the rows earlier
    commits hold right after reading them, and writes the output of every input row exactly
    once, ids repeated or not: what an uninterrupted run writes.

    How: each row read carries two hidden columns, ``__forebay_unit`` (its input file and
    row group) and ``__forebay_row`` (its position among the rows the scan emits there), and
    each commit records the positions of its rows; a resume drops those positions, and
    loads no id. Steps that add columns or drop rows (filters) are exact. A step that emits
    several rows per input row keeping the tags (an explode) has them written once each when
    they reach the write in one block, but a kill between two commits holding rows of the
    same input row loses the later ones on resume (the position is done). Such steps are
    seen (a unit's rows repeat a position or outnumber the rows read): a
    :class:`RowCountWarning` says so, and ``min_rows_per_file=None`` keeps each block's
    rows in one commit.

    checkpoint: a :class:`forebay.Checkpoint` (a directory or URI every task can reach; its
        ``id_column`` must survive your steps: the commits write the ids too, in Ray Data's
        layout; ``id_column=None`` writes none, for data without ids). A checkpoint whose progress is known only by id is probed by id, in shard
        actors: one holding Ray Data's checkpoint files (their ids count as done), one
        written by an older forebay, or one some of whose commits held rows without the
        tags (a step dropped them). Then a row whose id an earlier run wrote is not
        written, even if it is another row with the same id (an uninterrupted run writes
        both).
    on_changed_input: ``"error"`` (default) or ``"reprocess"`` an input file that changed
        since the checkpoint recorded it.
    compression, row_group_rows: of the data files (default zstd, 131,072 rows).
    min_rows_per_file: rows gathered into each file, and so into each commit (Ray's
        ``batch_size`` of the stage step). ``"auto"`` (default): about a tenth of the input
        over the cluster's CPUs (at least 4 counted), within 1,024-131,072 rows, so that a small job commits as it
        goes (a kill keeps most of the work done) and a large one writes files of 131,072
        rows. None: one file per block, which after a step with a small ``batch_size`` means
        many small files and commits.
    storage_options: object_store options for a URI ``path``.
    mode: ``None`` (default): new files beside existing ones, but an output holding files
        committed under another checkpoint (another job's, or this path's before its
        directory was deleted) is refused while this checkpoint has committed nothing
        there; ``"append"``: add to such an output deliberately.
    num_filter_actors: actors sharing the checkpoint's ids when the resume drops done rows
        by id (default: one per two CPUs of the cluster, 1-4; at most the checkpoint's
        shards). A resume by position starts one actor, for the read tasks' reports.
    num_cpus_per_filter_actor: CPUs each filter actor reserves (default 0: they mostly
        wait, and a reservation would take CPUs from the read and stage tasks).
    ray_remote_args: options of the stage tasks (``num_cpus``, ``memory``, ...).

    Returns ``{"rows", "files", "bytes", "seconds", "paths", "resume"}``; ``resume`` holds
    what recovery found (``commits_recovered``, ``files_done``, ``files_changed``), the ids
    done at the start (``ids_done``), whether done rows were dropped by position
    (``by_position``, else by id) and how many (``rows_skipped_by_position``), the input
    units (row groups) this run recorded
    finished (``units_finished``), why they could be recorded only when the run ended
    (``finished_late``: None when each was recorded as soon as its rows were committed),
    and the rows read that steps dropped (``rows_dropped_by_steps``).

    A resumed run skips a unit when every row read from it was committed or dropped by a
    step: it relies on each output row keeping its input row's hidden tag columns, as steps
    that add columns to the batch they get do.

    Raises ValueError naming the resources when the cluster cannot run the job (filter
    actors' and tasks' CPUs), and the first forebay error of a Ray task as itself (a step
    that dropped the id column: ``forebay.WriteError``).
    """
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError("checkpoint must be a forebay.Checkpoint")
    if on_changed_input not in ("error", "reprocess"):
        raise ValueError(
            f"on_changed_input must be 'error' or 'reprocess', not {on_changed_input!r}"
        )
    if min_rows_per_file != "auto" and min_rows_per_file is not None:
        if isinstance(min_rows_per_file, bool) or not isinstance(min_rows_per_file, int):
            raise TypeError(
                f"min_rows_per_file must be an int, None or 'auto', not {min_rows_per_file!r}"
            )
        if min_rows_per_file < 1:
            raise ValueError("min_rows_per_file must be at least 1")
    started = time.monotonic()
    source = _forebay_source(ds)
    id_column = checkpoint.id_column
    if id_column is not None and source.columns is not None and id_column not in source.columns:
        raise ValueError(
            f"read_parquet(columns={source.columns}) does not read the checkpoint's id "
            f"column {checkpoint.id_column!r}"
        )
    if id_column is not None and id_column not in source.schema.names:
        raise ValueError(
            f"the input has no column {checkpoint.id_column!r} (the checkpoint's id_column); "
            f"its columns: {source.schema.names}"
        )
    if source.checkpointed is not None:
        raise RuntimeError("this dataset is being written with a checkpoint already")
    if not source.files:
        raise ValueError(
            "the filter's terms on hive partition keys rule out every input file: there is "
            "nothing to write (and no input for the checkpoint to record)"
        )
    cpus = cluster_cpus()
    actors_given = num_filter_actors is not None
    num_filter_actors = check_resources(
        num_filter_actors,
        num_cpus_per_filter_actor,
        dict(ray_remote_args or {}),
        cpus,
    )
    if min_rows_per_file == "auto":
        min_rows_per_file = auto_rows_per_file(source.estimated_rows(), cpus)
    # The read tasks' filter, so that the checkpoint records what its inputs were finished
    # under (a rerun with another filter must not skip them silently).
    inputs = forebay.read_parquet(
        source.files,
        storage_options=source.storage_options,
        filter=source.scan_filter,
        **source.partition_options,
    )
    coordinator = RsCommitCoordinator(
        inputs._inner,
        checkpoint,
        on_changed_input,
        os.fspath(path),
        storage_options,
        compression,
        row_group_rows,
        shared_output=_shared_output(mode),
    )
    try:
        return _run(
            ds,
            source,
            coordinator,
            checkpoint,
            dict(storage_options or {}),
            min_rows_per_file,
            num_filter_actors,
            actors_given,
            num_cpus_per_filter_actor,
            ray_remote_args,
            started,
        )
    except ray.exceptions.RayError as e:
        cause = forebay_cause(e)
        if cause is None:
            raise
        cause.add_note("(raised in a Ray task of forebay.ray.write_parquet)")
        raise cause from None
    finally:
        coordinator.close()


def auto_rows_per_file(rows: int, cpus: int) -> int:
    """Rows per file (and commit) of ``min_rows_per_file="auto"``: a tenth of the input over
    the cluster's CPUs (counted as at least 4: a small cluster's commits lag the work by a
    few of them), so that the commits in flight at any time hold a small part of it, within
    1,024 - 131,072 rows."""
    share = rows // (10 * max(cpus, 4))
    return max(1_024, min(DEFAULT_MIN_ROWS_PER_FILE, share))


def check_resources(
    num_filter_actors: int | None,
    cpus_per_actor: float,
    task_args: dict[str, Any],
    cluster: int,
) -> int:
    """The filter actors to start; raises ValueError (naming what the job needs and what
    the cluster has) when the actors and one task cannot run at the same time, which would
    leave the job waiting forever."""
    if num_filter_actors is None:
        num_filter_actors = default_num_actors(cluster)
    if cpus_per_actor < 0:
        raise ValueError(f"num_cpus_per_filter_actor must be >= 0, not {cpus_per_actor}")
    task_cpus = float(task_args.get("num_cpus", 1))
    actors_cpus = num_filter_actors * cpus_per_actor
    if actors_cpus + task_cpus > cluster:
        raise ValueError(
            f"forebay.ray.write_parquet needs {actors_cpus + task_cpus:g} CPUs at once "
            f"({num_filter_actors} filter actors x {cpus_per_actor:g} CPU and "
            f"{task_cpus:g} for a read or stage task) and the Ray cluster has {cluster}: "
            "lower num_cpus_per_filter_actor (0 reserves nothing), num_filter_actors or "
            "ray_remote_args['num_cpus'], or add CPUs"
        )
    gpus = float(task_args.get("num_gpus", 0))
    have = ray.cluster_resources().get("GPU", 0)  # type: ignore[no-untyped-call]
    if gpus > have:
        raise ValueError(
            f"ray_remote_args asks {gpus:g} GPUs per stage task and the Ray cluster has {have:g}"
        )
    return num_filter_actors


def _run(
    ds: ray.data.Dataset,
    source: ForebayParquetDatasource,
    coordinator: RsCommitCoordinator,
    checkpoint: Checkpoint,
    output_options: dict[str, str],
    min_rows_per_file: int | None,
    num_filter_actors: int,
    actors_given: bool,
    num_cpus_per_filter_actor: float,
    ray_remote_args: Mapping[str, Any] | None,
    started: float,
) -> dict[str, Any]:
    id_column = checkpoint.id_column
    files = coordinator.files()
    if files != source.files:
        raise RuntimeError(
            "the checkpoint's coordinator listed the input files differently from the "
            f"dataset ({len(files)} vs {len(source.files)} files)"
        )
    # Named after the checkpoint (whose lock this run holds): actors a killed driver left
    # behind are found and stopped here.
    name = f"forebay-write-{hashlib.sha1(coordinator.state_uri().encode()).hexdigest()[:16]}"
    shards = coordinator.num_shards()
    if actors_given and not 1 <= num_filter_actors <= shards:
        raise ValueError(
            f"num_filter_actors must be 1..{shards} (the checkpoint's shards), not "
            f"{num_filter_actors}"
        )
    by_position = coordinator.resumes_by_position()
    id_filter: ShardedCheckpointFilter | None = None
    ledger: Any  # an actor handle: a UnitLedger, or shard actor 0
    if by_position:
        # Done rows are dropped by position: no id is loaded, the ledger is the one actor.
        stop_named_actors(name)
        ledger = (
            ray.remote(UnitLedger)
            .options(
                name=f"{name}-0",
                namespace=ACTOR_NAMESPACE,
                num_cpus=num_cpus_per_filter_actor,
                max_restarts=-1,
                max_task_retries=-1,
            )
            .remote()
        )
    else:
        assert id_column is not None, "a checkpoint without ids resumes by position"
        if not actors_given:  # the default never exceeds the checkpoint's shards
            num_filter_actors = min(num_filter_actors, shards)
        id_filter = ShardedCheckpointFilter(
            coordinator.state_uri(),
            id_column,
            num_shards=coordinator.num_shards(),
            num_actors=num_filter_actors,
            storage_options=checkpoint.storage_options,
            num_cpus_per_actor=num_cpus_per_filter_actor,
            wait_for_load=False,  # the actors load while the read tasks start
            first_actor_class=LedgerShardOwner,
            name=name,
        )
        ledger = id_filter.actors[0]
    source.checkpointed = CheckpointedRead(
        id_column,
        json.loads(coordinator.finished_inputs()),
        {uri: i for i, uri in enumerate(files)},
        by_position,
        id_filter,
        ledger,
        block_rows=min_rows_per_file,
    )
    tracker = UnitTracker()
    try:
        staged = ds.map_batches(
            functools.partial(
                _stage_block,
                coordinator.stager_spec(),
                output_options,
                dict(checkpoint.storage_options or {}),
            ),
            batch_format="pyarrow",
            batch_size=min_rows_per_file,
            zero_copy_batch=True,
            **dict(ray_remote_args or {}),
        )
        # A step's error travels as itself (a WriteError naming the missing id column),
        # not as Ray Data's UserCodeException that keeps only its text.
        staged.context.raise_original_map_exception = True
        if min_rows_per_file is not None:
            # Ray Data merges a task's output into blocks of up to target_max_block_size
            # (128 MiB): a read task's rows would travel, and wait in steps, as one block.
            # Blocks of about a commit's rows keep what a kill loses to a few commits.
            context = staged.context
            context.target_max_block_size = max(
                MIN_BLOCK_BYTES,
                min(
                    context.target_max_block_size or MAX_BLOCK_BYTES,
                    min_rows_per_file * source.estimated_row_bytes(),
                ),
            )

        def new_reports() -> list[int]:
            return tracker.reported(*ray.get(ledger.take_new.remote()))

        for batch in staged.iter_batches(batch_size=None, batch_format="pyarrow"):
            block = cast(pa.Table, batch)
            for described, units, consumed, rows, repeated in zip(
                block.column("staged").to_pylist(),
                block.column("units").to_pylist(),
                block.column("consumed").to_pylist(),
                block.column("rows").to_pylist(),
                block.column("repeated").to_pylist(),
                strict=True,
            ):
                if described is None:
                    continue
                candidates = new_reports()
                rows_per_unit = json.loads(units) if units is not None else None
                tracker.committing(rows_per_unit, rows, repeated or [])
                candidates += [int(u) for u in rows_per_unit or {}]
                done_units, done_files = tracker.finished(candidates)
                coordinator.commit(described, done_units, done_files, _positions(consumed))
        new_reports()
        done_units, done_files = tracker.finished_at_end()
        coordinator.commit(None, done_units, done_files)
        ids_done = len(id_filter) if id_filter is not None else coordinator.report()["ids_done"]
        coordinator.finish()
    finally:
        source.checkpointed = None
        if id_filter is not None:
            id_filter.shutdown()
        else:
            ray.kill(ledger, no_restart=True)
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
            "by_position": by_position,
            "rows_skipped_by_position": tracker.rows_skipped_by_position,
            "units_finished": len(tracker.recorded),
            "finished_late": tracker.late,
            "rows_dropped_by_steps": tracker.rows_dropped(),
        },
    }


def _positions(consumed: str | None) -> list[tuple[tuple[int, int], list[tuple[int, int]]]] | None:
    """A stage task's positions (JSON by unit) as the coordinator takes them (None: the
    rows carried no tags)."""
    if consumed is None:
        return None
    return [
        (split_unit(int(unit)), [(int(s), int(e)) for s, e in ranges])
        for unit, ranges in json.loads(consumed).items()
    ]


def _shared_output(mode: str | None) -> bool:
    """Whether ``mode`` asks to append to an output other checkpoints committed into."""
    if mode is None:
        return False
    if mode != "append":
        raise ValueError(
            f"mode must be None or 'append' (a checkpointed write appends), not {mode!r}"
        )
    return True
