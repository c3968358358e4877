"""forebay.ray at the edges, as a new Ray Data user meets them: clusters of 1-4 CPUs, a
default job that runs in parallel and commits as it goes (a kill keeps most of the work),
steps that drop or multiply rows, wrong arguments, errors raised in Ray tasks, and actors a
killed driver leaves behind."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import ray

import forebay
import forebay.ray as fray
from forebay.ray._write import _forebay_source, positions_held

FILES = 10
ROWS_PER_FILE = 10_000
ROWS = FILES * ROWS_PER_FILE
ROW_GROUP = 2_000


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """The shape of the issue: 10 files, 100k rows (row groups of 2,000)."""
    root = tmp_path_factory.mktemp("ray-edges-inputs")
    for f in range(FILES):
        ids = np.arange(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        table = pa.table({"id": ids, "value": ids, "text": [f"row {i}" for i in ids]})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=ROW_GROUP)
    return root


def add_double(batch: pa.Table) -> pa.Table:
    return batch.append_column("double", pc.multiply(batch.column("value"), 2))


def written_values(out: Path) -> np.ndarray:
    return np.sort(pq.read_table(out, columns=["value"]).column("value").to_numpy())


def committed_rows(out: Path) -> int:
    """Rows in the data files a write has published (staged files live in a subdirectory)."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in out.glob("*.parquet"))


# ---------------------------------------------------------------- small clusters

SMALL_CLUSTER = """
import json, sys, ray, forebay, forebay.ray as fray, pyarrow.compute as pc
ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False, logging_level="ERROR",
         log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False
inputs, out, ckpt = sys.argv[2:5]
# A reservation the cluster cannot hold is refused at once, naming the resources.
try:
    fray.write_parquet(fray.read_parquet(inputs), out + "-x", num_filter_actors=4,
                       num_cpus_per_filter_actor=1.0,
                       checkpoint=forebay.Checkpoint("id", ckpt + "-x"))
    refused = None
except ValueError as e:
    refused = str(e)
def add(b):
    return b.append_column("double", pc.multiply(b.column("value"), 2))
ds = fray.read_parquet(inputs).map_batches(add, batch_format="pyarrow")
result = fray.write_parquet(ds, out, checkpoint=forebay.Checkpoint("id", ckpt))
print(json.dumps({"refused": refused, "rows": result["rows"], "files": result["files"]}))
"""


@pytest.mark.parametrize("cpus", [1, 2, 4])
def test_a_small_cluster_finishes_or_says_what_it_lacks(
    inputs: Path, tmp_path: Path, cpus: int
) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    try:
        run = subprocess.run(
            [sys.executable, "-c", SMALL_CLUSTER, str(cpus), str(inputs), str(out), str(ckpt)],
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the write on a {cpus}-CPU cluster hung: {str(e.stderr)[-2000:]}")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["refused"] is not None
    assert "CPUs" in report["refused"] and f"has {cpus}" in report["refused"]
    assert report["rows"] == ROWS and report["files"] >= 5
    assert np.array_equal(written_values(out), np.arange(ROWS))


def test_sharded_filter_refuses_a_reservation_that_starves_tasks(cluster, tmp_path) -> None:
    cpus = int(ray.cluster_resources()["CPU"])
    with pytest.raises(ValueError, match=f"has {cpus}"):
        fray.ShardedCheckpointFilter(
            str(tmp_path / "none"), "id", num_actors=4, num_cpus_per_actor=cpus / 4
        )


# ---------------------------------------------------------------- parallel, commits as it goes


def test_plan_tasks_cuts_large_files_and_groups_small_ones() -> None:
    from forebay.ray._datasource import MIN_PIECE_BYTES, plan_tasks

    mib = 1 << 20
    sizes = [10 * mib, mib // 4, mib // 4, 3 * mib, 0]
    tasks = plan_tasks(sizes, 4 * mib)
    # The 10 MiB file in 3 ranges; the others (3.5 MiB together) share a task.
    assert [[(p.file, p.part, p.parts) for p in t] for t in tasks] == [
        [(0, 0, 3)],
        [(0, 1, 3)],
        [(0, 2, 3)],
        [(1, 0, 1), (2, 0, 1), (3, 0, 1), (4, 0, 1)],
    ]
    # The ranges of a file are contiguous and cover it.
    ranges = [(p.start, p.end) for t in tasks for p in t if p.file == 0]
    assert ranges[0][0] == 0 and ranges[-1][1] == sizes[0]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    # A tiny share per task never cuts a file below MIN_PIECE_BYTES.
    tiny = plan_tasks([mib], 1)
    assert len(tiny) == mib // MIN_PIECE_BYTES
    assert all(p.end - p.start >= MIN_PIECE_BYTES for t in tiny for p in t)


def test_the_default_plan_is_parallel_and_commits_as_it_goes(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    cpus = int(ray.cluster_resources()["CPU"])
    ds = fray.read_parquet(str(inputs))
    source = _forebay_source(ds)
    # Files are cut into byte ranges too: >= 2 tasks per CPU, each holding rows, and
    # together every row once.
    rows_per_task = [sum(block.num_rows for block in task()) for task in source.get_read_tasks(1)]
    assert len(rows_per_task) >= 2 * cpus
    assert sum(1 for rows in rows_per_task if rows) >= 2 * cpus, rows_per_task

    out = tmp_path / "out"
    result = fray.write_parquet(
        ds.map_batches(add_double, batch_format="pyarrow"),
        out,
        checkpoint=forebay.Checkpoint("id", str(tmp_path / "ckpt")),
    )
    # A commit at least every 20 % of the input.
    file_rows = [pq.ParquetFile(out / Path(p).name).metadata.num_rows for p in result["paths"]]
    assert sum(file_rows) == ROWS and max(file_rows) <= ROWS // 5, file_rows
    # The byte ranges of the files' pieces read every row once.
    assert np.array_equal(written_values(out), np.arange(ROWS))


KILLED_DRIVER = """
import os, sys, time, ray, forebay, forebay.ray as fray, pyarrow.compute as pc
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False
inputs, out, ckpt, progress = sys.argv[2:6]
def infer(batch):
    time.sleep(batch.num_rows * 2e-4)  # a model: 0.2 ms a row
    with open(os.path.join(progress, f"{os.getpid()}-{time.monotonic_ns()}"), "w") as f:
        f.write(str(batch.num_rows))
    return batch.append_column("double", pc.multiply(batch.column("value"), 2))
ds = fray.read_parquet(inputs).map_batches(infer, batch_format="pyarrow")
fray.write_parquet(ds, out, checkpoint=forebay.Checkpoint("id", ckpt))
"""


def forebay_actors() -> list[str]:
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "forebay"
    ]


def test_a_kill_half_way_keeps_most_of_the_work(cluster, inputs: Path, tmp_path: Path) -> None:
    out, ckpt, progress = tmp_path / "out", tmp_path / "ckpt", tmp_path / "progress"
    progress.mkdir()
    address = ray.get_runtime_context().gcs_address
    driver = subprocess.Popen(
        [sys.executable, "-c", KILLED_DRIVER, address]
        + [str(p) for p in (inputs, out, ckpt, progress)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    inferred = 0
    while inferred < ROWS // 2:
        assert driver.poll() is None, driver.stderr.read()[-3000:] if driver.stderr else ""
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.01)
        inferred = sum(int(p.read_text() or 0) for p in progress.iterdir())
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    # The model saw >= 50 % by the kill; a run that commits as it goes has kept a good share
    # of it (before issue 42 every commit came at the end: 0 %). How much is latency between
    # "seen" and "committed", a benchmark's figure (benches/python/ray_kill_half.py: 40-45 %
    # on a quiet machine); under make test's load it has been as low as 39 %, so the line
    # here is well below that, and far above the regression.
    kept = committed_rows(out)
    assert kept >= 0.25 * ROWS, f"{kept} rows committed when {inferred} were inferred"
    # The killed driver's actors went with it (Ray ties them to the driver's job; a rerun
    # would stop any left under the write's names).
    deadline = time.monotonic() + 30
    while [a for a in forebay_actors() if a.startswith("forebay-write-")]:
        assert time.monotonic() < deadline, forebay_actors()
        time.sleep(0.2)
    # A commit under way at the kill may land before its actor goes (once on a clean clone:
    # 1,289 rows after the count above): the rerun does what is left after that.
    kept = committed_rows(out)

    rerun = fray.write_parquet(
        fray.read_parquet(str(inputs)).map_batches(add_double, batch_format="pyarrow"),
        out,
        checkpoint=forebay.Checkpoint("id", str(ckpt)),
    )
    assert rerun["rows"] == ROWS - kept
    assert np.array_equal(written_values(out), np.arange(ROWS))


def test_actors_left_under_a_name_are_stopped_by_the_next_user(cluster, tmp_path: Path) -> None:
    path = str(tmp_path / "none-yet")
    left = fray.ShardedCheckpointFilter(path, "id", num_actors=2, name="forebay-test-left")
    assert sorted(a for a in forebay_actors() if a.startswith("forebay-test-left")) == [
        "forebay-test-left-0",
        "forebay-test-left-1",
    ]
    new = fray.ShardedCheckpointFilter(path, "id", num_actors=1, name="forebay-test-left")
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(left.actors[1].describe.remote(), timeout=30)
    assert [a for a in forebay_actors() if a.startswith("forebay-test-left")] == [
        "forebay-test-left-0"
    ]
    assert len(new) == 0
    new.shutdown()


# ---------------------------------------------------------------- steps that drop or multiply


def keep_even(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.equal(pc.bit_wise_and(batch.column("value"), 1), 0))


def test_a_filter_step_still_lets_a_rerun_skip_finished_input(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    out, ckpt = tmp_path / "out", forebay.Checkpoint("id", str(tmp_path / "ckpt"))

    def job() -> dict:
        ds = fray.read_parquet(str(inputs)).map_batches(keep_even, batch_format="pyarrow")
        return fray.write_parquet(
            ds.filter(lambda row: row["value"] % 4 == 0), out, checkpoint=ckpt
        )

    with warnings.catch_warnings():
        warnings.simplefilter("error", fray.RowCountWarning)
        first = job()
    assert first["rows"] == ROWS // 4
    assert first["resume"]["units_finished"] == ROWS // ROW_GROUP
    assert first["resume"]["rows_dropped_by_steps"] == ROWS - ROWS // 4
    assert first["resume"]["finished_late"] is None
    again = job()
    assert again["resume"]["files_done"] == FILES and again["rows"] == 0
    assert np.array_equal(written_values(out), np.arange(0, ROWS, 4))


def twice(batch: pa.Table) -> pa.Table:
    return pa.concat_tables([batch, batch])


def test_a_step_multiplying_rows_warns_and_writes_each_once(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    out, ckpt = tmp_path / "out", forebay.Checkpoint("id", str(tmp_path / "ckpt"))
    ds = fray.read_parquet(str(inputs)).map_batches(twice, batch_format="pyarrow")
    with pytest.warns(fray.RowCountWarning, match="several rows per input row"):
        first = fray.write_parquet(ds, out, checkpoint=ckpt, min_rows_per_file=None)
    assert first["rows"] == 2 * ROWS
    assert "input unit" in first["resume"]["finished_late"]
    assert np.array_equal(written_values(out), np.repeat(np.arange(ROWS), 2))
    # Recorded finished when the run ended: a rerun reads nothing and writes nothing.
    again = fray.write_parquet(ds, out, checkpoint=ckpt, min_rows_per_file=None)
    assert again["resume"]["files_done"] == FILES and again["rows"] == 0


# ---------------------------------------------------------------- arguments and errors


def test_sharded_filter_counts_and_arguments(cluster, tmp_path: Path) -> None:
    flat = tmp_path / "ray-layout"
    flat.mkdir()
    for k in range(3):
        pq.write_table(pa.table({"id": np.arange(k, 30_000, 6)}), flat / f"{k}.parquet")
    sharded = fray.ShardedCheckpointFilter(str(flat), "id", num_actors=2)
    assert len(sharded) == 15_000
    assert [d["ids"] > 0 for d in sharded.describe()] == [True, True]
    assert sharded.done(pa.array([0, 1, 3, 6])).tolist() == [True, True, False, True]
    sharded.shutdown()
    with pytest.raises(ValueError, match=r"num_actors must be 1\.\.16"):
        fray.ShardedCheckpointFilter(str(flat), "id", num_actors=0)
    with pytest.raises(forebay.CheckpointError, match="'nope' not found"):
        fray.ShardedCheckpointFilter(str(flat), "nope", num_actors=2)


def test_write_errors_come_out_as_themselves(cluster, inputs: Path, tmp_path: Path) -> None:
    ckpt = forebay.Checkpoint("id", str(tmp_path / "ckpt"))
    no_id = fray.read_parquet(str(inputs)).map_batches(
        lambda b: b.drop_columns(["id"]), batch_format="pyarrow"
    )
    with pytest.raises(forebay.ForebayError, match="'id'") as raised:
        fray.write_parquet(no_id, tmp_path / "out", checkpoint=ckpt)
    assert not isinstance(raised.value, ray.exceptions.RayError)
    # Ray's own reader: the message says what to use instead.
    with pytest.raises(ValueError, match=r"forebay\.ray\.read_parquet\(paths"):
        fray.write_parquet(ray.data.read_parquet(str(inputs)), tmp_path / "out", checkpoint=ckpt)
    with pytest.raises(ValueError, match="no column 'key'"):
        fray.write_parquet(
            fray.read_parquet(str(inputs)),
            tmp_path / "out",
            checkpoint=forebay.Checkpoint("key", str(tmp_path / "ckpt2")),
        )
    with pytest.raises(TypeError, match="min_rows_per_file"):
        fray.write_parquet(
            fray.read_parquet(str(inputs)), tmp_path / "out", checkpoint=ckpt, min_rows_per_file="x"
        )


def test_a_checkpoint_with_fewer_shards_than_default_actors(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    # 8 CPUs make 4 actors by default; a checkpoint of 2 shards gets 2.
    result = fray.write_parquet(
        fray.read_parquet(str(inputs)),
        tmp_path / "out",
        checkpoint=forebay.Checkpoint("id", str(tmp_path / "ckpt"), num_shards=2),
    )
    assert result["rows"] == ROWS
    # More actors than shards is refused, whether or not the resume needs the actors (it
    # drops done rows by position here).
    with pytest.raises(ValueError, match=r"num_filter_actors must be 1\.\.2"):
        fray.write_parquet(
            fray.read_parquet(str(inputs)),
            tmp_path / "out",
            checkpoint=forebay.Checkpoint("id", str(tmp_path / "ckpt"), num_shards=2),
            num_filter_actors=3,
        )


# ---------------------------------------------------------------- progress by input position

DUPLICATES = """
import os, sys, time, ray, forebay, forebay.ray as fray
inputs, out, ckpt, progress, id_column = sys.argv[2:7]
# The workers of this driver's job import the model by name and note their progress.
env = {"PYTHONPATH": os.environ["PYTHONPATH"], "FOREBAY_TEST_PROGRESS": progress}
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False,
         runtime_env={"env_vars": env})
ray.data.DataContext.get_current().enable_progress_bars = False
from test_ray_edges import model
ds = fray.read_parquet(inputs, batch_size=250).map_batches(model, batch_format="pyarrow")
fray.write_parquet(ds, out, checkpoint=forebay.Checkpoint(id_column or None, ckpt),
                   min_rows_per_file=500)
"""

DUP_FILES, DUP_ROWS, DUP_DISTINCT = 3, 3000, 1700  # ids repeat within and across files


def model(batch: pa.Table) -> pa.Table:
    """A model that drops every eighth row, works 0.3 ms a row and, in a killed driver's
    run, notes how many rows it has seen."""
    time.sleep(batch.num_rows * 3e-4)
    progress = os.environ.get("FOREBAY_TEST_PROGRESS")
    if progress:
        with open(os.path.join(progress, f"{os.getpid()}-{time.monotonic_ns()}"), "w") as f:
            f.write(str(batch.num_rows))
    keep = pc.not_equal(pc.bit_wise_and(batch.column("n"), 7), 0)
    kept = batch.filter(keep)
    return kept.append_column("answer", pc.multiply(kept.column("n"), 3))


def test_positions_held_by_a_block() -> None:
    units = np.array([5, 7, 5, 5, 7, 5, 5], dtype=np.int64)
    rows = np.array([3, 0, 0, 1, 1, 9, 9], dtype=np.int64)
    # Unit 5: positions 0, 1, 3, 9 (twice: a step multiplied it); unit 7: 0-1.
    assert positions_held(units, rows) == {
        5: (5, [(0, 2), (3, 4), (9, 10)]),
        7: (2, [(0, 2)]),
    }
    assert positions_held(np.array([], np.int64), np.array([], np.int64)) == {}


@pytest.mark.parametrize("id_column", ["id", None])
def test_random_driver_kills_write_what_an_uninterrupted_run_writes(
    cluster, tmp_path: Path, id_column: str | None
) -> None:
    """Input ids repeat (within row groups and across files). A driver SIGKILLed at random
    moments, then the job run again: the output is the uninterrupted run's, every input
    row's once (a resume that dropped done rows by id lost the other rows of their ids)."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for f in range(DUP_FILES):
        n = np.arange(f * DUP_ROWS, (f + 1) * DUP_ROWS)
        table = pa.table({"id": (n * 7919) % DUP_DISTINCT, "n": n})
        pq.write_table(table, inputs / f"part-{f}.parquet", row_group_size=400)
    every = np.arange(DUP_FILES * DUP_ROWS)
    expected = every[every & 7 != 0]
    address = ray.get_runtime_context().gcs_address
    rng = random.Random(20261127 if id_column else 20261128)
    ds = fray.read_parquet(str(inputs), batch_size=250).map_batches(model, batch_format="pyarrow")
    committed_by_kills = []
    for trial in range(3):
        out, ckpt, progress = (tmp_path / f"{name}{trial}" for name in ("out", "ckpt", "progress"))
        progress.mkdir()
        driver = subprocess.Popen(
            [sys.executable, "-c", DUPLICATES, address]
            + [str(p) for p in (inputs, out, ckpt, progress, id_column or "")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
        )
        kill_at = rng.uniform(0.2, 0.9) * len(every)
        deadline = time.monotonic() + 240
        while sum(int(p.read_text() or 0) for p in progress.iterdir()) < kill_at:
            assert driver.poll() is None, driver.stderr.read()[-3000:] if driver.stderr else ""
            assert time.monotonic() < deadline, "the job made no progress"
            time.sleep(0.01)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        killed_with = len(pq.read_table(out)) if out.exists() else 0
        committed_by_kills.append(killed_with)
        resumed = fray.write_parquet(ds, out, checkpoint=forebay.Checkpoint(id_column, str(ckpt)))
        written = np.sort(pq.read_table(out, columns=["n"]).column("n").to_numpy())
        assert np.array_equal(written, expected), (
            f"trial {trial}: {len(written)} rows written for {len(expected)} "
            f"({killed_with} before the resume); it reported {resumed['resume']}"
        )
        print(f"trial {trial}: {killed_with} rows committed when killed")
        assert resumed["resume"]["by_position"]
        assert resumed["rows"] == len(expected) - killed_with
        # No id was loaded: the ids done are counted from the commit records.
        assert resumed["resume"]["ids_done"] == (killed_with if id_column else 0)
    # Kills after commits and before the end: a resume had done rows to drop.
    assert any(0 < k < len(expected) for k in committed_by_kills), committed_by_kills


def test_a_checkpoint_without_ids_needs_the_tags(cluster, inputs: Path, tmp_path: Path) -> None:
    ckpt = forebay.Checkpoint(None, str(tmp_path / "ckpt"))
    ds = fray.read_parquet(str(inputs))
    first = fray.write_parquet(ds, tmp_path / "out", checkpoint=ckpt)
    assert first["rows"] == ROWS and first["resume"]["by_position"]
    assert not (tmp_path / "ckpt" / "ids").exists()
    assert fray.write_parquet(ds, tmp_path / "out", checkpoint=ckpt)["rows"] == 0
    # A step that drops forebay's tags leaves nothing to resume by: refused at its commit.
    untagged = fray.read_parquet(str(inputs)).map_batches(drop_the_tags, batch_format="pyarrow")
    with pytest.raises(ValueError, match="tag columns"), warnings.catch_warnings():
        warnings.simplefilter("ignore", fray.RowCountWarning)
        fray.write_parquet(
            untagged,
            tmp_path / "out2",
            checkpoint=forebay.Checkpoint(None, str(tmp_path / "ckpt2")),
        )
    # Nothing was published.
    assert committed_rows(tmp_path / "out2") == 0
    # The checkpoint by position refuses an id column, and the other way round.
    with pytest.raises(forebay.CheckpointError, match="without an id column"):
        fray.write_parquet(
            ds, tmp_path / "out", checkpoint=forebay.Checkpoint("id", str(tmp_path / "ckpt"))
        )


def drop_the_tags(batch: pa.Table) -> pa.Table:
    return pa.table({"id": batch.column("id"), "value": batch.column("value")})
