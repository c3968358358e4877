"""``forebay.Checkpoint``: makes ``write_parquet`` exactly once and resumable."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ._args import optional_seconds


@dataclass(frozen=True)
class Checkpoint:
    """Where ``write_parquet`` records what it finished, so that a rerun of the same script
    resumes: it skips finished input files and row groups without reading them, drops the
    rows of unfinished row groups that an earlier commit already holds (your function never
    sees them), and writes what each input row becomes exactly once, whenever the previous
    run died (SIGKILL, OOM, Ctrl-C, an exception).

    Progress is recorded by input position (file, row group, row), not by id: rows that
    share an id are each written once, as an uninterrupted run writes them, and a resume
    loads no id. A checkpoint that also holds ids known only as ids (Ray Data's layout, a
    single id file, commits of an older forebay, or ``forebay.ray`` commits whose rows lost
    its hidden tag columns in a step) drops rows by id as well, as does a run
    reading changed inputs again (``on_changed_input="reprocess"``); there a row whose id
    another row already wrote is not written. A commit never splits what one input batch
    became: files hold at least ``rows_per_file`` rows and less than a batch more (or what
    came within ``commit_interval``), a function
    that returns several batches for one input has them joined, and a ``map_batches`` after
    the first gets whole outputs of the one before it, merged up to its ``batch_size``.

    id_column: a column that identifies each input row; it must survive your functions
        (every step's output must keep it). Its values are written to the checkpoint with
        every commit (Ray Data's layout: ``forebay.CheckpointFilter`` and Ray read them).
        ``None`` for input without an id: rows are known by input position alone (valid
        while the inputs are unchanged, which every run checks) and no id is written. Such
        a checkpoint cannot read changed inputs again (``on_changed_input="reprocess"``),
        hold another writer's id files, or be resumed with an id column (nor one with ids
        without it).
    path: a directory or URI for the checkpoint (``s3://...`` works: commits need no rename).
        If it already holds Parquet files with ``id_column`` (Ray Data's checkpoint layout)
        or is a single such file, their ids count as done; forebay keeps its own files
        beside them (for a single file, in ``<file>.forebay/``).
    num_shards: hash shards of the id files (a power of two; default the checkpoint's own,
        else 16).
    delete_on_success: once a run finishes successfully, delete the ids (the bulk of the
        checkpoint, ~10 bytes an id) but keep the small record of finished input files, so
        that running the finished job again writes nothing (it warns that the job is done).
        Input files added later are written; their ids are no longer checked against the
        deleted ones.
    storage_options: object_store options for a URI ``path`` (as in ``read_parquet``).
    commit_interval: seconds a writer may hold rows before it commits them, its file full
        or not (default 30; ``None``: only when a file reaches ``rows_per_file``). A writer
        waiting for rows commits when the interval ends, so a kill loses at most about this
        much work of the rows that reached it (calls to a paid endpoint, say). Fast runs
        fill their files first and are not affected; slow ones write a smaller file per
        writer each interval.

    Each output file is committed together with the ids of its rows and the input it
    finishes: a commit record written atomically is the decision; files are staged under
    ``_forebay_staging*`` (invisible to readers) until then, and published after. The next
    run rolls an interrupted commit forward or back before it reads anything. One run at a
    time may use a checkpoint: a lock on local disks, a lease on object stores (a second run
    is refused, naming the run that holds it). The checkpoint must not lie inside the output
    or the input, nor hold either.
    """

    id_column: str | None
    path: str | os.PathLike[str]
    num_shards: int | None = None
    delete_on_success: bool = False
    storage_options: Mapping[str, str] | None = field(default=None)
    commit_interval: float | None = 30.0

    def __post_init__(self) -> None:
        if self.id_column is not None and (
            not isinstance(self.id_column, str) or not self.id_column
        ):
            raise ValueError(
                "Checkpoint: id_column must be a column name, or None to key rows by input position"
            )
        if not isinstance(self.path, (str, os.PathLike)) or not isinstance(
            os.fspath(self.path), str
        ):
            raise TypeError(
                f"Checkpoint: path must be a str or os.PathLike of str, not {self.path!r}"
            )
        if self.num_shards is not None and (
            self.num_shards < 1 or self.num_shards & (self.num_shards - 1)
        ):
            raise ValueError(
                f"Checkpoint: num_shards must be a power of two, not {self.num_shards}"
            )
        interval = optional_seconds("Checkpoint: commit_interval", self.commit_interval)
        if interval is not None and not math.isfinite(interval):
            raise ValueError(
                "Checkpoint: commit_interval must be a finite number of seconds "
                "(None commits only full files)"
            )
