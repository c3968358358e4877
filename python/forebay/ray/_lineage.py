"""Which input rows a checkpointed Ray write has committed, tracked across processes.

On one machine the engine knows which output batches derive from which input rows (lineage
tickets and positions). On Ray the rows pass through the user's steps in other processes, so
forebay tags them instead:

```text
 read task (CheckpointedRead)                 stage task                 driver (UnitTracker)
 ────────────────────────────                 ──────────                 ────────────────────
 skip finished files / row groups unread
 drop rows earlier commits consumed
   (by position; or by id, in shard actors)
 tag each row: __forebay_unit = file<<32 | rg ─► … user steps … ─► per unit: rows and
               __forebay_row  = its position                      positions; drop the tags,
 report rows emitted per unit ──► UnitLedger                       stage  ─┐
                                  (an actor) ── new reports ──────────────────────► commit:
                                                       positions it holds, committed[u] += rows
                                                 unit finished when committed[u] == emitted[u]
                                                 file finished when all its units are
```

A row's position is its index among the rows the scan emits for its row group (see
forebay-engine's ``positions`` module): each commit records the positions its rows came
from, and a resumed run drops exactly those rows, whatever their ids, so that duplicate ids
are written as an uninterrupted run writes them. A checkpoint whose progress is known only by
id (one that holds Ray Data's id files, or was written before positions) is probed by id.

A unit is recorded finished in the commit record of its last rows (or a later one), so a
resumed run skips it unread only when every row read from it is in a committed file:
- steps that keep the rows they are given (adding columns, as batch inference does): each
  unit as soon as its rows are committed;
- steps that drop rows (filters): their units when the run ends, since dropped rows never
  arrive to be counted (a run killed before reads them again and the step drops them again);
- steps that emit several rows per input row, or drop the tags: every unit when the run
  ends, with a :class:`RowCountWarning` (multiplied rows are seen when a unit's rows repeat
  a position or outnumber the rows read). Without tags the commits record no positions.
Files are cut into byte-range pieces read by different tasks: a file is read through when
each of its pieces has reported.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .._forebay import RsDataset
from ._checkpoint import _ShardOwner

#: The column that carries each row's input unit from the read to the write step.
UNIT_COLUMN = "__forebay_unit"
#: The column that carries each row's position in its unit (see the module docs).
ROW_COLUMN = "__forebay_row"
#: Both tag columns, as the read tasks append them.
TAG_FIELDS = [
    pa.field(UNIT_COLUMN, pa.int64(), nullable=False),
    pa.field(ROW_COLUMN, pa.int64(), nullable=False),
]
#: Rows a read task gathers before asking the shard actors which ids are done.
FILTER_ROWS = 65_536


def unit_of(file_index: int, row_group: int) -> int:
    return (file_index << 32) | row_group


def split_unit(unit: int) -> tuple[int, int]:
    return unit >> 32, unit & 0xFFFF_FFFF


@dataclass
class CheckpointedRead:
    """What a read task of a checkpointed run needs (pickled into each task).

    finished: the coordinator's finished inputs (``uri -> state``), only this task's files;
        a state's ``consumed`` lists the positions earlier commits consumed in row groups
        not finished (``{row_group: [[start, end], ...]}``).
    file_index: input URI -> its index in the coordinator's file list.
    by_position: drop the rows at the positions ``finished`` lists (the checkpoint's
        progress is known by position); else drop rows whose id ``id_filter`` holds.
    id_filter: a ``ShardedCheckpointFilter`` (None: no row is dropped by id).
    ledger: the actor keeping the :class:`UnitLedger` that hears the rows emitted per unit.
    pieces: this task's shares of files, ``(file index, part, parts)`` (a file cut into
        ``parts`` byte ranges is read through when every part has reported).
    block_rows: rows per block at most (the write's rows per commit).
    """

    id_column: str | None
    finished: dict[str, Any]
    file_index: dict[str, int]
    by_position: bool
    id_filter: Any
    ledger: Any
    pieces: list[tuple[int, int, int]] = field(default_factory=list)
    #: Rows per block the task yields at most (None: as read).
    block_rows: int | None = None

    def for_pieces(self, pieces: list[Any], files: list[str]) -> CheckpointedRead:
        """This run's context trimmed to one task's pieces (``_datasource.Piece`` s of
        ``files``)."""
        mine = [files[p.file] for p in pieces]
        return CheckpointedRead(
            self.id_column,
            {f: self.finished[f] for f in mine if f in self.finished},
            {f: self.file_index[f] for f in mine},
            self.by_position,
            self.id_filter,
            self.ledger,
            [(self.file_index[files[p.file]], p.part, p.parts) for p in pieces],
            self.block_rows,
        )

    def read(self, dataset: RsDataset, ranges: dict[str, tuple[int, int]]) -> Iterator[pa.Table]:
        """Scan ``dataset`` (within ``ranges``) without finished input and without the rows
        earlier commits consumed, tag rows with their unit and position, and report the
        rows emitted per unit once the scan is through."""
        import ray

        dataset = dataset.with_finished_inputs(json.dumps(self.finished))
        if ranges:
            dataset = dataset.with_byte_ranges(ranges)
        scan = dataset.scan()
        emitted: dict[int, int] = {}
        skipped = 0
        # Positions: the unit being read and how many of its rows the scan emitted before
        # the current batch (as forebay's own source counts them).
        unit, unit_rows = -1, 0
        consumed: np.ndarray | None = None  # the unit's consumed positions (by_position)
        # Batches wait here until FILTER_ROWS of them can be filtered with one request per
        # shard actor (a request per small batch would cost more than the probing), and
        # the actors probe one group while the task reads the next.
        group: list[_Rows] = []
        group_rows = 0
        asked: tuple[list[_Rows], Any] | None = None
        while True:
            item = scan.next_with_provenance()
            if item is not None:
                batch, provenance = item
                this = unit_of(self.file_index[provenance["file"]], provenance["row_group"])
                emitted.setdefault(this, 0)
                if this != unit:
                    unit, unit_rows = this, 0
                    if self.by_position:
                        consumed = self._consumed_ranges(
                            provenance["file"], provenance["row_group"]
                        )
                first, unit_rows = unit_rows, unit_rows + batch.num_rows
                positions = np.arange(first, unit_rows, dtype=np.int64)
                if consumed is not None and batch.num_rows:
                    keep = not_consumed(consumed, first, batch.num_rows)
                    if keep is not None:
                        skipped += batch.num_rows - int(np.count_nonzero(keep))
                        batch, positions = batch.filter(pa.array(keep)), positions[keep]
                if batch.num_rows:
                    group.append(_Rows(batch, this, positions))
                    group_rows += batch.num_rows
            if group and (item is None or group_rows >= FILTER_ROWS):
                probe = self._ask(group)
                if asked is not None:
                    yield from self._tagged(*asked, emitted)
                asked = (group, probe)
                group, group_rows = [], 0
            if item is None:
                break
        # The last group's rows are counted before they go out, and the counts reported
        # first: when the driver commits a unit's last rows it already knows the unit is
        # read through, and records it finished in that same commit. Delivered before the
        # task ends: a task that is retried reports the same again.
        last = list(self._tagged(*asked, emitted)) if asked is not None else []
        ray.get(self.ledger.report.remote(emitted, self.pieces, skipped))
        yield from last

    def _consumed_ranges(self, uri: str, row_group: int) -> np.ndarray | None:
        """The positions earlier commits consumed in a row group, as ``(start, end)`` rows
        (None: none)."""
        consumed = self.finished.get(uri, {}).get("consumed", {}).get(str(row_group))
        if not consumed:
            return None
        return np.asarray(consumed, dtype=np.int64).reshape(-1, 2)

    def _ask(self, group: list[_Rows]) -> Any:
        if self.id_filter is None or self.id_column is None:
            return None
        return self.id_filter.ask(pa.chunked_array([r.batch.column(self.id_column) for r in group]))

    def _tagged(
        self, group: list[_Rows], probe: Any, emitted: dict[int, int]
    ) -> Iterator[pa.Table]:
        """The group's batches without done rows, each row tagged with its unit and
        position."""
        done = probe.answer() if probe is not None else None
        offset = 0
        for rows in group:
            batch, positions = rows.batch, rows.positions
            if done is not None:
                mine = done[offset : offset + batch.num_rows]
                offset += batch.num_rows
                if mine.any():
                    batch, positions = batch.filter(pa.array(~mine)), positions[~mine]
            if not batch.num_rows:
                continue
            emitted[rows.unit] += batch.num_rows
            tags = [
                pa.array(np.full(batch.num_rows, rows.unit, dtype=np.int64)),
                pa.array(positions),
            ]
            table = pa.Table.from_batches([batch])
            for tag_field, tag in zip(TAG_FIELDS, tags, strict=True):
                table = table.append_column(tag_field, tag)
            # Blocks of at most a commit's rows: the rows a step's task holds at a time
            # are then those of a few commits, not of a whole row group (what a kill loses).
            step = self.block_rows or table.num_rows
            for first in range(0, table.num_rows, step):
                yield table.slice(first, step)


def not_consumed(ranges: np.ndarray, first: int, rows: int) -> np.ndarray | None:
    """Which rows at positions ``first .. first + rows`` of a row group no earlier commit
    consumed, given the row group's consumed ``ranges`` (None: all of them)."""
    # The sorted, disjoint ranges overlapping [first, first + rows).
    lo = int(np.searchsorted(ranges[:, 1], first, side="right"))
    hi = int(np.searchsorted(ranges[:, 0], first + rows, side="left"))
    if lo >= hi:
        return None
    keep = np.ones(rows, dtype=bool)
    for start, end in ranges[lo:hi]:
        keep[max(start - first, 0) : min(end - first, rows)] = False
    return keep


@dataclass
class _Rows:
    """A batch a read task holds, with its unit and its rows' positions."""

    batch: pa.RecordBatch
    unit: int
    positions: np.ndarray


class UnitLedger:
    """What read tasks report: rows emitted per unit, pieces of files read through, rows
    dropped because earlier commits consumed their positions.

    Runs as an actor of its own when no shard actor is needed (a resume by position), else
    inside shard actor 0 (:class:`LedgerShardOwner`).
    """

    def __init__(self) -> None:
        self.new_units: dict[int, int] = {}
        self.new_pieces: list[tuple[int, int, int]] = []
        #: Rows dropped by position, per task (its pieces): a retried task reports again.
        self.skipped: dict[tuple[tuple[int, int, int], ...], int] = {}

    def report(
        self, emitted: dict[int, int], pieces: list[tuple[int, int, int]], skipped: int = 0
    ) -> None:
        self.new_units.update(emitted)
        self.new_pieces.extend(pieces)
        self.skipped[tuple((int(f), int(p), int(n)) for f, p, n in pieces)] = skipped

    def take_new(self) -> tuple[dict[int, int], list[tuple[int, int, int]], int]:
        """What was reported since the last call, and the rows dropped by position so far."""
        units, pieces = self.new_units, self.new_pieces
        self.new_units, self.new_pieces = {}, []
        return units, pieces, sum(self.skipped.values())


class LedgerShardOwner(_ShardOwner):
    """Shard actor 0 of a checkpointed write that probes ids, which also keeps the run's
    :class:`UnitLedger`.

    A separate ledger actor cost a Ray worker process of its own, whose start (Python, Ray,
    pyarrow) took 1-2 CPU-seconds: a tenth of the seed workload's run on 2 cores. If this
    actor restarts, reports it held and the driver had not taken yet are lost: those units
    are then never recorded finished this run (a resume reads them again and drops the rows
    committed: still exactly once).
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.ledger = UnitLedger()

    def report(
        self, emitted: dict[int, int], pieces: list[tuple[int, int, int]], skipped: int = 0
    ) -> None:
        self.ledger.report(emitted, pieces, skipped)

    def take_new(self) -> tuple[dict[int, int], list[tuple[int, int, int]], int]:
        return self.ledger.take_new()


class RowCountWarning(UserWarning):
    """The rows reaching a checkpointed Ray write are not the rows read, one to one: a step
    emits several rows per input row or dropped the unit tag. Input is then recorded
    finished only at the end of the run."""


@dataclass
class UnitTracker:
    """The driver's books: which units and files the next commit may record as finished.

    While the run goes on, a unit is finished when as many of its rows are committed as were
    read (steps that keep or add columns). Rows a step drops never arrive, so such a unit
    waits for the end of the run, when every unit read is finished (all its rows are either
    committed or dropped). When rows cannot be counted one to one (a step multiplies them or
    drops the tag), every unit waits for the end of the run (:attr:`late` says why).
    """

    emitted: dict[int, int] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)
    units_of_file: dict[int, set[int]] = field(default_factory=dict)
    parts_read: dict[int, set[int]] = field(default_factory=dict)
    files_read: set[int] = field(default_factory=set)
    recorded: set[int] = field(default_factory=set)
    files_recorded: set[int] = field(default_factory=set)
    #: Why finished input is recorded only at the end of this run (None: as it finishes).
    late: str | None = None
    #: Rows committed without the tags.
    untagged_rows: int = 0
    #: Rows the read tasks dropped because earlier commits consumed their positions.
    rows_skipped_by_position: int = 0

    def record_late(self, why: str) -> None:
        if self.late is None:
            self.late = why
            warnings.warn(
                f"forebay.ray.write_parquet: {why}; input is recorded finished only when the "
                "run ends (a run killed before that reads it again and drops the rows its "
                "commits hold: by position, or by id when the tags were dropped)",
                RowCountWarning,
                stacklevel=4,
            )

    def reported(
        self, emitted: dict[int, int], pieces: list[tuple[int, int, int]], skipped: int = 0
    ) -> list[int]:
        """Take reports from read tasks (``skipped``: rows dropped by position so far);
        returns the units they name."""
        self.rows_skipped_by_position = skipped
        for unit, rows in emitted.items():
            unit, rows = int(unit), int(rows)
            known = self.emitted.get(unit)
            if known is not None and known != rows:
                self.record_late(
                    f"input unit {split_unit(unit)} was read twice with different rows"
                )
            self.emitted[unit] = rows
            self.units_of_file.setdefault(split_unit(unit)[0], set()).add(unit)
        for file, part, parts in pieces:
            read = self.parts_read.setdefault(int(file), set())
            read.add(int(part))
            if len(read) == int(parts):
                self.files_read.add(int(file))
        return [int(u) for u in emitted]

    def committing(
        self, rows_per_unit: dict[int, int] | None, rows: int, repeated: list[int]
    ) -> None:
        """Count the rows of the commit being decided; ``repeated``: units some of whose
        rows in it share a position."""
        if rows_per_unit is None:
            if rows:
                self.untagged_rows += rows
                self.record_late(
                    f"{rows} rows reached the write without the {UNIT_COLUMN} and "
                    f"{ROW_COLUMN} columns (a step dropped them); their commits record no "
                    "input positions, so a resume drops done rows by id"
                )
            return
        if repeated:
            self.record_late(
                f"rows of input unit {split_unit(int(repeated[0]))} repeat a position (a "
                "step emits several rows per input row)"
            )
        for unit, n in rows_per_unit.items():
            unit = int(unit)
            self.committed[unit] = self.committed.get(unit, 0) + int(n)
            if self.committed[unit] > self.emitted.get(unit, self.committed[unit]):
                self.record_late(
                    f"more rows of input unit {split_unit(unit)} were written than read (a "
                    "step emits several rows per input row)"
                )

    def finished(self, candidates: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
        """Units among ``candidates`` (and files) now finished and not yet recorded; they
        are marked recorded (the caller puts them in the commit it is deciding)."""
        if self.late is not None:
            return [], []
        units = [
            unit
            for unit in candidates
            if unit not in self.recorded
            and unit in self.emitted
            and self.committed.get(unit, 0) == self.emitted[unit]
        ]
        return self._record(units)

    def finished_at_end(self) -> tuple[list[tuple[int, int]], list[int]]:
        """Once every block of the run is committed: every unit read is finished, its rows
        committed or dropped by a step."""
        return self._record([u for u in self.emitted if u not in self.recorded])

    def _record(self, units: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
        self.recorded.update(units)
        files = [
            f
            for f in self.files_read - self.files_recorded
            if self.units_of_file.get(f, set()) <= self.recorded
        ]
        self.files_recorded.update(files)
        return [split_unit(u) for u in units], sorted(files)

    def rows_dropped(self) -> int:
        """Rows read this run that no step passed on to the write (when counted)."""
        if self.untagged_rows:
            return 0
        return max(0, sum(self.emitted.values()) - sum(self.committed.values()))
