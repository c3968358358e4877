"""``write_parquet(..., retry_dead_letters=True)``: the rows a job's first ``map_batches``
set aside (``on_error="dead_letter"``), run again through the job's steps into the same
output, each exactly once, after which the dead-letter files retried are deleted.

    <output>/_dead_letter/<stage>/part-*.parquet    rows set aside (input columns + _error_*
                                                    and _input_* columns)
    <checkpoint>.retry/                             the retry's own checkpoint (beside the
                                                    job's: the job's is not touched; its
                                                    dead-lettered rows already count as done)
    <checkpoint>.retry/_forebay_dead_letters.json   the files this retry takes, pinned when it
                                                    starts (its own new dead letters are not
                                                    read back on a resume)

Order: pin the manifest -> run the job's steps from its first map over the pinned files
(their dead-letter columns dropped) into the output with the retry checkpoint (a resume after
a kill writes what is left, exactly once; rows failing again are set aside again, under new
names) -> delete the pinned files -> delete the retry checkpoint, the manifest last. A rerun
that finds the manifest with some of its files gone knows the retry finished and only
completes the cleanup.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _forebay
from ._checkpoint_config import Checkpoint

if TYPE_CHECKING:
    from ._dataset import Dataset

DEAD_LETTER_DIR = "_dead_letter"
DEAD_LETTER_COLUMNS = (
    "_error_type",
    "_error_message",
    "_input_file",
    "_input_row_group",
    "_input_row",
)
MANIFEST = "_forebay_dead_letters.json"
MANIFEST_FORMAT = "forebay.dead_letter_retry/1"

_crash_counts: dict[str, int] = {}


def _crash_point(point: str) -> None:
    """The fault-injection hook of the tests (``FOREBAY_CRASH_AT=<point>:<n>``, as the
    engine's commit protocol has)."""
    at, _, n = os.environ.get("FOREBAY_CRASH_AT", "").partition(":")
    if at == point:
        _crash_counts[point] = _crash_counts.get(point, 0) + 1
        if str(_crash_counts[point]) == n:
            os.kill(os.getpid(), signal.SIGKILL)


def retry_location(checkpoint: Checkpoint) -> str:
    """Where the retry of ``checkpoint``'s job keeps its state: beside the checkpoint."""
    return os.fspath(checkpoint.path).rstrip("/") + ".retry"


def retry_dead_letters(
    dataset: Dataset,
    path: str,
    checkpoint: Checkpoint | None,
    storage_options: Mapping[str, str] | None,
    write: dict[str, Any],
) -> dict[str, Any]:
    """See the module docs; ``write``: the other arguments of ``write_parquet``."""
    from ._dataset import Dataset, _MapStep
    from ._read import read_parquet

    if checkpoint is None:
        raise ValueError(
            "retry_dead_letters needs the job's checkpoint: its rows set aside count as done "
            "there, and the retry keeps its own state beside it"
        )
    first_map = next((i for i, s in enumerate(dataset._steps) if isinstance(s, _MapStep)), None)
    if first_map is None:
        raise ValueError(
            "retry_dead_letters runs the job's steps from its first map_batches over the rows "
            "set aside (they are that step's input): this dataset has no map_batches step"
        )
    if write.get("mode") not in (None, "append"):
        raise ValueError("retry_dead_letters writes beside the job's output: mode must be 'append'")
    # The retry's checkpoint is a new one each time, writing into the job's output.
    write = {**write, "mode": "append"}
    out = _forebay.RsDir(path, storage_options)
    state_location = retry_location(checkpoint)
    state = _forebay.RsDir(state_location, checkpoint.storage_options)
    raw = state.get(MANIFEST)
    if raw is None:
        files = sorted(
            f
            for f in out.files_under(DEAD_LETTER_DIR)
            if f.endswith(".parquet") and not any(p[:1] in "._" for p in f.split("/")[1:])
        )
        if not files:
            return {**_nothing_to_retry(), "dead_letters_retried": 0}
        state.put_atomic(MANIFEST, json.dumps({"format": MANIFEST_FORMAT, "files": files}).encode())
    else:
        manifest = json.loads(raw)
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"{state.shown(MANIFEST)}: not a dead-letter retry manifest")
        files = manifest["files"]
    present = [f for f in files if out.exists(f)]
    if len(present) == len(files):
        source = read_parquet([out.shown(f) for f in files], storage_options=storage_options)
        columns = [c for c in source.schema.names if c not in DEAD_LETTER_COLUMNS]
        rows = read_parquet(
            [out.shown(f) for f in files], columns=columns, storage_options=storage_options
        )
        retry = Dataset(rows._inner, dataset._steps[first_map:])
        result = retry.write_parquet(
            path,
            storage_options=storage_options,
            checkpoint=Checkpoint(
                checkpoint.id_column,
                state_location,
                num_shards=checkpoint.num_shards,
                storage_options=checkpoint.storage_options,
            ),
            **write,
        )
        dataset._last_stats = retry._last_stats
    else:  # the retry finished; a kill interrupted its cleanup
        result = _nothing_to_retry()
    _crash_point("retry-written")
    for f in present:
        out.delete(f)
        _crash_point("retry-deleting")
    for f in state.files_under(""):
        if f != MANIFEST:
            state.delete(f)
    _crash_point("retry-cleaned")
    state.delete(MANIFEST)
    state.delete_tree("")  # the directories left
    result["dead_letters_retried"] = len(files)
    return result


def _nothing_to_retry() -> dict[str, Any]:
    return {"rows": 0, "files": 0, "bytes": 0, "seconds": 0.0, "paths": []}
