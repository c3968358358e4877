"""forebay.ray on a local Ray cluster started by the tests: the datasource, the sharded
checkpoint filter as a Ray Data step and as Ray's CheckpointConfig plug-in, and their
behaviour when an actor or a task's worker process is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import ray

import forebay
import forebay.ray as fray
from conftest import S3_CREDENTIALS, moto_s3

FILES = 24
ROWS_PER_FILE = 5_000


def test_import_forebay_does_not_import_ray() -> None:
    code = "import sys, forebay; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ray-inputs")
    for f in range(FILES):
        ids = np.arange(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        pq.write_table(
            pa.table(
                {
                    "id": pa.array([f"id-{i}" for i in ids]),
                    "value": pa.array(ids, pa.int64()),
                    "payload": pa.array([f"row {i} " * 3 for i in ids]),
                }
            ),
            root / f"part-{f:03d}.parquet",
            row_group_size=1_000,
        )
    return root


def values_of(ds) -> np.ndarray:
    table = ds.to_arrow_refs()
    values = pa.concat_tables(ray.get(table)).column("value").to_numpy()
    return np.sort(values)


# ---------------------------------------------------------------- read_parquet


def test_read_parquet_matches_pyarrow(cluster, inputs: Path) -> None:
    ds = fray.read_parquet(str(inputs), columns=["value", "id"], filter=[("value", ">=", 7_777)])
    table = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    assert table.schema.names == ["value", "id"]
    expected = pq.read_table(inputs, columns=["value", "id"], filters=[("value", ">=", 7_777)])
    assert table.num_rows == expected.num_rows
    assert table.sort_by("value").equals(expected.sort_by("value"))


def test_read_tasks_are_sized_by_bytes(cluster, inputs: Path) -> None:
    sizes = [p.stat().st_size for p in sorted(inputs.glob("*.parquet"))]
    source = fray.ForebayParquetDatasource(str(inputs), task_bytes=4 * max(sizes))
    tasks = source.get_read_tasks(200)
    # Ray asked for 200; 24 tiny files make 6 tasks of 4 files, in scan order.
    assert len(tasks) == FILES // 4
    files = [f for t in tasks for f in t.metadata.input_files]
    assert files == sorted(str(p) for p in inputs.glob("*.parquet"))
    # By default tiny inputs are one task (at least 64 MiB a task).
    assert len(fray.ForebayParquetDatasource(str(inputs)).get_read_tasks(200)) == 1


def test_hive_partition_columns_through_ray_read_tasks(cluster, tmp_path: Path) -> None:
    """Read tasks get lists of files: they take the keys from the directories below the one
    listed, typed as on the driver (a task holding only year=__HIVE_DEFAULT_PARTITION__ would
    infer a string), and files the filter's terms on keys rule out are not planned."""
    root = tmp_path / "table"
    years = [2023, 2024, None, 2025]
    table = pa.table({"x": list(range(8)), "year": years * 2})
    pq.write_to_dataset(table, str(root), ["year"])
    source = fray.ForebayParquetDatasource(str(root), task_bytes=1)
    assert source.schema.names == ["x", "year"]
    assert source.schema.field("year").type == pa.int64()
    assert len(source.get_read_tasks(100)) == 4  # a task a file
    out = pa.concat_tables(ray.get(fray.read_parquet(str(root), task_bytes=1).to_arrow_refs()))
    assert sorted(out.to_pylist(), key=lambda r: r["x"]) == sorted(
        table.to_pylist(), key=lambda r: r["x"]
    )
    filtered = fray.ForebayParquetDatasource(str(root), filter=[("year", ">=", 2024)], task_bytes=1)
    assert len(filtered.files) == 2
    out = pa.concat_tables(
        ray.get(
            fray.read_parquet(
                str(root), filter=[("year", ">=", 2024)], task_bytes=1
            ).to_arrow_refs()
        )
    )
    assert sorted(out["x"].to_pylist()) == [1, 3, 5, 7]
    # Every file ruled out: no rows, and the schema still said.
    nothing = fray.read_parquet(str(root), filter=[("year", "=", 1999)])
    assert nothing.count() == 0 and nothing.schema().names == ["x", "year"]
    plain = fray.ForebayParquetDatasource(str(root), partitioning=None)
    assert plain.schema.names == ["x"]


def test_downstream_ray_data_works(cluster, inputs: Path) -> None:
    ds = fray.read_parquet(str(inputs), columns=["value"]).map_batches(
        lambda b: {"double": b["value"] * 2}, batch_format="numpy"
    )
    total = sum(int(b["double"].sum()) for b in ds.iter_batches(batch_size=1000))
    n = FILES * ROWS_PER_FILE
    assert total == 2 * (n * (n - 1) // 2)
    left, right = fray.read_parquet(str(inputs), columns=["value"]).streaming_split(2)
    got: list[int] = []

    def consume(it) -> None:
        for b in it.iter_batches(batch_size=None, batch_format="numpy"):
            got.extend(b["value"].tolist())

    threads = [threading.Thread(target=consume, args=(s,)) for s in (left, right)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(n))


def test_bad_input_names_the_file(cluster, tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(forebay.ForebayError, match=r"bad\.parquet"):
        fray.read_parquet(str(bad))
    with pytest.raises(forebay.ForebayError, match="nope"):
        fray.read_parquet(str(tmp_path / "nope"))


# ---------------------------------------------------------------- sharded checkpoint filter


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, inputs: Path) -> Path:
    """A forebay checkpoint (8 shards) holding the ids of every third row."""
    path = tmp_path_factory.mktemp("ray-ckpt") / "ckpt"
    done = forebay.CheckpointFilter(pa.string(), num_shards=8, id_column="id")
    done.insert(pa.array([f"id-{i}" for i in range(0, FILES * ROWS_PER_FILE, 3)]))
    done.write(str(path))
    return path


def expected_left() -> np.ndarray:
    return np.array([i for i in range(FILES * ROWS_PER_FILE) if i % 3])


def test_sharded_filter_splits_shards_and_filters(cluster, inputs: Path, checkpoint: Path) -> None:
    sharded = fray.ShardedCheckpointFilter(str(checkpoint), "id", num_shards=8, num_actors=3)
    parts = sharded.describe()
    assert sorted(k for p in parts for k in p["shards"]) == list(range(8))
    assert sum(p["ids"] for p in parts) == len(range(0, FILES * ROWS_PER_FILE, 3))
    # Each actor holds only its share (3 actors over 8 shards: at most 3 shards each).
    assert all(len(p["shards"]) <= 3 for p in parts)
    assert max(p["ids"] for p in parts) < 0.5 * len(sharded)
    ds = sharded.apply(fray.read_parquet(str(inputs)))
    assert np.array_equal(values_of(ds), expected_left())
    # Called directly on a table; nulls are never done.
    table = pa.table({"id": pa.array(["id-0", None, "id-1", "id-3"]), "x": [1, 2, 3, 4]})
    assert sharded(table).column("x").to_pylist() == [2, 3]
    sharded.shutdown()


def test_sharded_filter_reads_ray_layout_and_missing_path(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    flat = tmp_path / "ray-ckpt"
    flat.mkdir()
    for k in range(3):
        ids = [f"id-{i}" for i in range(k, FILES * ROWS_PER_FILE, 6)]
        pq.write_table(pa.table({"id": ids}), flat / f"{k}.parquet")
    sharded = fray.ShardedCheckpointFilter(str(flat), "id", num_actors=2)
    got = values_of(sharded.apply(fray.read_parquet(str(inputs))))
    assert np.array_equal(got, np.array([i for i in range(FILES * ROWS_PER_FILE) if i % 6 >= 3]))
    sharded.shutdown()
    empty = fray.ShardedCheckpointFilter(str(tmp_path / "none-yet"), "id", num_actors=2)
    assert len(empty) == 0
    assert len(values_of(empty.apply(fray.read_parquet(str(inputs))))) == FILES * ROWS_PER_FILE
    empty.shutdown()


def test_sharded_filter_errors(cluster, inputs: Path, checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="power of two"):
        fray.ShardedCheckpointFilter(str(checkpoint), "id", num_shards=6)
    with pytest.raises(ValueError, match="num_actors"):
        fray.ShardedCheckpointFilter(str(checkpoint), "id", num_shards=4, num_actors=5)
    with pytest.raises(Exception, match="nope"):
        fray.ShardedCheckpointFilter(str(checkpoint), "nope", num_shards=8)
    sharded = fray.ShardedCheckpointFilter(str(checkpoint), "id", num_shards=8, num_actors=2)
    with pytest.raises(KeyError, match="no id column"):
        sharded(pa.table({"other": [1]}))
    sharded.shutdown()


def slow_identity(batch: pa.Table) -> pa.Table:
    time.sleep(0.05)
    return batch


def test_killed_filter_actor_restarts_and_reloads(cluster, inputs: Path, checkpoint: Path) -> None:
    sharded = fray.ShardedCheckpointFilter(str(checkpoint), "id", num_shards=8, num_actors=2)
    ds = sharded.apply(
        fray.read_parquet(str(inputs), batch_size=500).map_batches(
            slow_identity, batch_format="pyarrow", batch_size=500
        ),
        batch_size=500,
    )
    killed = threading.Event()

    def kill_later() -> None:
        time.sleep(1.0)
        ray.kill(sharded.actors[0], no_restart=False)
        killed.set()

    killer = threading.Thread(target=kill_later)
    killer.start()
    got = values_of(ds)
    killer.join()
    assert killed.is_set()
    assert np.array_equal(got, expected_left())
    # The restarted actor reloaded its shards.
    assert sum(p["ids"] for p in sharded.describe()) == len(range(0, FILES * ROWS_PER_FILE, 3))
    sharded.shutdown()


def ray_worker_pids(marker: str) -> list[int]:
    """Worker processes whose command line (Ray sets it to the task's name) has ``marker``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmdline.startswith("ray::") and marker in cmdline:
            pids.append(int(proc.name))
    return pids


class WorkerKiller:
    """SIGKILLs the first Ray worker whose command line has each marker, while the block runs.

    It looks until the block ends, not for a fixed time: on a busy machine a task or actor
    can start later than any deadline a test would choose.
    """

    def __init__(self, *markers: str) -> None:
        self.killed: dict[str, int] = {}
        self._block_over = threading.Event()
        self._hunters = [threading.Thread(target=self._hunt, args=(m,)) for m in markers]

    def __enter__(self) -> Self:
        for hunter in self._hunters:
            hunter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._block_over.set()
        for hunter in self._hunters:
            hunter.join()

    def _hunt(self, marker: str) -> None:
        while not self._block_over.is_set():
            for pid in ray_worker_pids(marker):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.killed[marker] = pid
                return
            time.sleep(0.05)


def test_killed_task_worker_is_retried_exactly_once(
    cluster, inputs: Path, checkpoint: Path
) -> None:
    sharded = fray.ShardedCheckpointFilter(str(checkpoint), "id", num_shards=8, num_actors=2)
    ds = sharded.apply(
        fray.read_parquet(str(inputs), batch_size=500).map_batches(
            slow_identity, batch_format="pyarrow", batch_size=500
        ),
        batch_size=500,
    )
    with WorkerKiller("slow_identity") as killer:
        got = values_of(ds)
    assert killer.killed, "no worker of the map step was found to kill"
    assert np.array_equal(got, expected_left())
    sharded.shutdown()


# ---------------------------------------------------------------- Ray's CheckpointConfig


def test_checkpoint_config_plugin(cluster, inputs: Path, tmp_path: Path) -> None:
    # Ray's own checkpoint layout: a flat directory of Parquet files of ids.
    ckpt = tmp_path / "ray-ckpt"
    ckpt.mkdir()
    pq.write_table(
        pa.table({"id": [f"id-{i}" for i in range(0, FILES * ROWS_PER_FILE, 3)]}),
        ckpt / "done.parquet",
    )
    out = tmp_path / "out"
    ctx = ray.data.DataContext.get_current()
    ctx.checkpoint_config = fray.checkpoint_config(
        "id", str(ckpt), num_actors=2, delete_checkpoint_on_success=False
    )
    try:
        ray.data.read_parquet(str(inputs)).map_batches(
            slow_identity, batch_format="pyarrow"
        ).write_parquet(str(out))
    finally:
        ctx.checkpoint_config = None
    written = pq.read_table(out, columns=["value"]).column("value").to_numpy()
    assert np.array_equal(np.sort(written), expected_left())
    # Ray recorded the rows it wrote; with them the checkpoint holds every id.
    everything = fray.ShardedCheckpointFilter(str(ckpt), "id", num_actors=2)
    assert len(everything) == FILES * ROWS_PER_FILE
    everything.shutdown()
    assert pc.count_distinct(pq.read_table(out).column("id")).as_py() == len(written)


def test_checkpoint_config_plugin_takes_rays_s3_filesystem(
    cluster, inputs: Path, s3, tmp_path: Path
) -> None:
    # Ray's CheckpointConfig(override_filesystem=S3FileSystem(...)) with a path without a
    # scheme: forebay's filter reads the checkpoint through the same endpoint and keys,
    # given no storage_options of its own.
    from pyarrow.fs import S3FileSystem

    client, endpoint = s3
    client.create_bucket(Bucket="ray-fs")
    ids = pa.table({"id": [f"id-{i}" for i in range(0, FILES * ROWS_PER_FILE, 3)]})
    sink = pa.BufferOutputStream()
    pq.write_table(ids, sink)
    client.put_object(Bucket="ray-fs", Key="ckpt/done.parquet", Body=sink.getvalue().to_pybytes())
    filesystem = S3FileSystem(
        access_key="testing", secret_key="testing", region="us-east-1", endpoint_override=endpoint
    )
    from forebay.ray._checkpoint import object_store_options

    assert object_store_options(filesystem) == {**S3_CREDENTIALS, "aws_endpoint": endpoint}
    ctx = ray.data.DataContext.get_current()
    ctx.checkpoint_config = fray.checkpoint_config(
        "id",
        "ray-fs/ckpt",
        num_actors=2,
        delete_checkpoint_on_success=False,
        override_filesystem=filesystem,
    )
    out = tmp_path / "out"
    try:
        ray.data.read_parquet(str(inputs)).map_batches(
            slow_identity, batch_format="pyarrow"
        ).write_parquet(str(out))
    finally:
        ctx.checkpoint_config = None
    written = pq.read_table(out, columns=["value"]).column("value").to_numpy()
    assert np.array_equal(np.sort(written), expected_left())


# ---------------------------------------------------------------- write_parquet


def add_double(batch: pa.Table) -> pa.Table:
    """The batch-inference shape: the batch it gets, plus a column."""
    time.sleep(0.02)
    return batch.append_column("double", pc.multiply(batch.column("value"), 2))


def one_file(inputs: Path) -> int:
    """A read task's share that is one whole input file (no byte ranges, no grouping)."""
    return max(p.stat().st_size for p in inputs.glob("*.parquet"))


def assert_written_once(out: Path, expected: np.ndarray) -> pa.Table:
    """Every expected value exactly once in the data files under ``out``, and nothing else."""
    table = pq.read_table(out)
    values = np.sort(table.column("value").to_numpy())
    assert len(values) == len(expected), f"{len(values)} rows written, {len(expected)} expected"
    assert np.array_equal(values, expected)
    assert "__forebay_unit" not in table.column_names
    return table


def test_write_parquet_exactly_once_and_a_rerun_reads_nothing(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    out, ckpt = tmp_path / "out", forebay.Checkpoint("id", str(tmp_path / "ckpt"))

    def job() -> dict:
        ds = fray.read_parquet(str(inputs), batch_size=1_000, task_bytes=1 << 20)
        return fray.write_parquet(
            ds.map_batches(add_double, batch_format="pyarrow"), out, checkpoint=ckpt
        )

    first = job()
    assert first["rows"] == FILES * ROWS_PER_FILE
    table = assert_written_once(out, np.arange(FILES * ROWS_PER_FILE))
    assert np.array_equal(table.column("double").to_numpy(), table.column("value").to_numpy() * 2)
    assert first["resume"]["units_finished"] == FILES * ROWS_PER_FILE // 1_000
    assert first["resume"]["finished_late"] is None
    files_after_first = sorted(p.name for p in out.glob("*.parquet"))
    assert len(files_after_first) == first["files"]

    second = job()
    assert second["rows"] == 0 and second["files"] == 0
    assert second["resume"]["files_done"] == FILES  # every input skipped unread
    assert second["resume"]["ids_done"] == FILES * ROWS_PER_FILE
    assert sorted(p.name for p in out.glob("*.parquet")) == files_after_first
    assert not (out / "_forebay_staging").exists()


def test_write_parquet_of_hive_inputs_keeps_the_keys_exactly_once(cluster, tmp_path: Path) -> None:
    root = tmp_path / "table"
    table = pa.table({"id": np.arange(3_000), "year": np.arange(3_000) % 3 + 2022})
    pq.write_to_dataset(table, str(root), ["year"])
    out, ckpt = tmp_path / "out", forebay.Checkpoint("id", str(tmp_path / "ckpt"))

    def job() -> dict:
        ds = fray.read_parquet(str(root), filter=[("year", "!=", 2023)], task_bytes=1)
        return fray.write_parquet(ds, out, checkpoint=ckpt)

    assert job()["rows"] == 2_000
    written = pq.read_table(out, partitioning=None)
    assert written.schema.names[:2] == ["id", "year"]
    assert sorted(written.select(["id", "year"]).to_pylist(), key=lambda r: r["id"]) == [
        r for r in table.to_pylist() if r["year"] != 2023
    ]
    again = job()
    assert again["rows"] == 0 and again["resume"]["files_done"] == 2
    none = fray.read_parquet(str(root), filter=[("year", "=", 1999)])
    with pytest.raises(ValueError, match="rule out every input file"):
        fray.write_parquet(none, tmp_path / "none", checkpoint=ckpt)


def test_write_parquet_a_changed_scan_filter_is_detected(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    out, ckpt = tmp_path / "out", forebay.Checkpoint("id", str(tmp_path / "ckpt"))

    def job(dropped: int) -> dict:
        ds = fray.read_parquet(str(inputs), filter=[("value", "!=", dropped)])
        return fray.write_parquet(ds, out, checkpoint=ckpt)

    assert job(5)["rows"] == FILES * ROWS_PER_FILE - 1
    # Every input is finished under the first filter, which dropped value 5; skipping them
    # under one that keeps it would lose it silently.
    with pytest.raises(Exception, match="scan filter"):
        job(6)
    assert_written_once(out, np.delete(np.arange(FILES * ROWS_PER_FILE), 5))


def test_write_parquet_counts_ray_checkpoint_files_as_done(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    # A checkpoint directory Ray Data's CheckpointConfig wrote (flat files of ids).
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    pq.write_table(
        pa.table({"id": [f"id-{i}" for i in range(0, FILES * ROWS_PER_FILE, 3)]}),
        ckpt_dir / "ray-done.parquet",
    )
    out, ckpt = tmp_path / "out", forebay.Checkpoint("id", str(ckpt_dir), num_shards=8)
    ds = fray.read_parquet(str(inputs), batch_size=1_000).map_batches(
        add_double, batch_format="pyarrow"
    )
    result = fray.write_parquet(ds, out, checkpoint=ckpt, num_filter_actors=3)
    assert result["resume"]["ids_done"] == len(range(0, FILES * ROWS_PER_FILE, 3))
    assert_written_once(out, expected_left())
    # The next run's actors read forebay's shards and Ray's file beside them.
    again = fray.write_parquet(
        fray.read_parquet(str(inputs), batch_size=1_000), out, checkpoint=ckpt, num_filter_actors=3
    )
    assert again["rows"] == 0
    assert again["resume"]["ids_done"] == FILES * ROWS_PER_FILE


def drop_the_tag(batch: pa.Table) -> pa.Table:
    """A step that builds a new table from the columns it knows."""
    return pa.table({"id": batch.column("id"), "value": batch.column("value")})


def test_write_parquet_a_step_dropping_the_tag_stays_exactly_once(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    out, ckpt = tmp_path / "out", forebay.Checkpoint("id", str(tmp_path / "ckpt"))
    ds = fray.read_parquet(str(inputs), batch_size=1_000).map_batches(
        drop_the_tag, batch_format="pyarrow"
    )
    with pytest.warns(fray.RowCountWarning, match="__forebay_unit"):
        first = fray.write_parquet(ds, out, checkpoint=ckpt)
    assert "__forebay_unit" in first["resume"]["finished_late"]
    assert_written_once(out, np.arange(FILES * ROWS_PER_FILE))
    # Finished input was recorded when the run ended: the rerun reads nothing.
    second = fray.write_parquet(ds, out, checkpoint=ckpt)
    assert second["resume"]["files_done"] == FILES
    assert second["rows"] == 0
    # Its commits could not say which input rows they held: a resume drops done rows by id.
    assert not second["resume"]["by_position"]
    assert_written_once(out, np.arange(FILES * ROWS_PER_FILE))


def test_write_parquet_errors(cluster, inputs: Path, tmp_path: Path) -> None:
    ckpt = forebay.Checkpoint("id", str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match=r"forebay\.ray\.read_parquet"):
        fray.write_parquet(ray.data.range(10), tmp_path / "out", checkpoint=ckpt)
    with pytest.raises(ValueError, match="'id'"):
        fray.write_parquet(
            fray.read_parquet(str(inputs), columns=["value"]), tmp_path / "out", checkpoint=ckpt
        )
    with pytest.raises(TypeError, match=r"forebay\.Checkpoint"):
        fray.write_parquet(fray.read_parquet(str(inputs)), tmp_path / "out", checkpoint="ckpt")
    # A step that loses the id column: the stage task's error names it.
    no_id = fray.read_parquet(str(inputs)).map_batches(
        lambda b: b.drop_columns(["id"]), batch_format="pyarrow"
    )
    with pytest.raises(Exception, match="'id'"):
        fray.write_parquet(no_id, tmp_path / "out", checkpoint=ckpt)
    # The failed run released the checkpoint: the next one can use it.
    ok = fray.write_parquet(fray.read_parquet(str(inputs)), tmp_path / "out", checkpoint=ckpt)
    assert ok["rows"] == FILES * ROWS_PER_FILE


def test_write_parquet_a_damaged_checkpoint_fails_naming_the_file(
    cluster, inputs: Path, tmp_path: Path
) -> None:
    ckpt = forebay.Checkpoint("id", str(tmp_path / "ckpt"))
    first = fray.write_parquet(fray.read_parquet(str(inputs)), tmp_path / "out", checkpoint=ckpt)
    assert first["rows"] == FILES * ROWS_PER_FILE
    assert first["resume"]["by_position"]
    # A resume by position reads the record of finished inputs, not the ids.
    inputs_record = tmp_path / "ckpt" / "_forebay_inputs.json"
    kept = inputs_record.read_bytes()
    inputs_record.write_bytes(b"{ not json")
    with pytest.raises(forebay.CheckpointError, match=inputs_record.name):
        fray.write_parquet(fray.read_parquet(str(inputs)), tmp_path / "out", checkpoint=ckpt)
    inputs_record.write_bytes(kept)
    # Ray Data's id files beside forebay's make the resume drop done rows by id: a damaged
    # id part is then read, in the shard actors, which load while the read tasks start:
    # their error must still end the run.
    pq.write_table(pa.table({"id": ["id-none"]}), tmp_path / "ckpt" / "ray-checkpoint.parquet")
    damaged = next((tmp_path / "ckpt" / "ids").glob("*.parquet"))
    damaged.write_bytes(b"not parquet at all")
    with pytest.raises(Exception, match=damaged.name):
        fray.write_parquet(fray.read_parquet(str(inputs)), tmp_path / "out", checkpoint=ckpt)


DRIVER = """
import sys, ray, pyarrow.compute as pc, forebay, forebay.ray as fray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False
def add_double(batch):
    return batch.append_column("double", pc.multiply(batch.column("value"), 2))
# One read task (and so one committed file) per input file: a task's share is one file,
# so no file is cut into byte ranges and none shares a task.
ds = fray.read_parquet(sys.argv[2], batch_size=1_000, task_bytes=int(sys.argv[5]))
fray.write_parquet(ds.map_batches(add_double, batch_format="pyarrow"), sys.argv[3],
                   checkpoint=forebay.Checkpoint("id", sys.argv[4]), min_rows_per_file=5_000)
"""


# The driver's side of each recovery branch: rolled back (staged, no record) and rolled
# forward with the data file still staged (ids published). "recorded" (nothing published
# yet) is the S3 test's crash point below; test_resume.py kills the same CommitLog at every
# point, locally.
@pytest.mark.parametrize("crash_at", ["staged:4", "ids-published:6"])
def test_write_parquet_driver_killed_inside_a_commit_resumes_exactly_once(
    cluster, inputs: Path, tmp_path: Path, crash_at: str
) -> None:
    out, ckpt_dir = tmp_path / "out", tmp_path / "ckpt"
    address = ray.get_runtime_context().gcs_address
    killed = subprocess.run(
        [sys.executable, "-c", DRIVER, address]
        + [str(a) for a in (inputs, out, ckpt_dir, one_file(inputs))],
        env={**os.environ, "FOREBAY_CRASH_AT": crash_at},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    before = len(list(out.glob("*.parquet")))
    resumed = fray.write_parquet(
        fray.read_parquet(str(inputs), batch_size=1_000, task_bytes=one_file(inputs)).map_batches(
            add_double, batch_format="pyarrow"
        ),
        out,
        checkpoint=forebay.Checkpoint("id", str(ckpt_dir)),
        min_rows_per_file=5_000,
    )
    assert_written_once(out, np.arange(FILES * ROWS_PER_FILE))
    report = resumed["resume"]
    # The records of the first three commits at least (and of the one in flight, once
    # recorded) were found and rolled forward, and their rows were not written again. A commit
    # can hold rows of every file read at once (a file is done once all its rows are): with
    # four or more read tasks interleaved, three commits of 5,000 rows finish no file, so
    # whole files skipped unread are not promised here (test_ray's rerun-after-a-finished-run
    # tests and test_resume.py check that). Nor is a commit's size: a read task's last file
    # holds what its block had left (a clean-clone run recovered 3 commits of 11,000 rows).
    assert report["commits_recovered"] >= 3
    assert report["ids_done"] >= report["commits_recovered"]
    assert resumed["rows"] <= FILES * ROWS_PER_FILE - report["ids_done"]
    assert len(list(out.glob("*.parquet"))) >= before


def test_write_parquet_killed_task_and_filter_actor_stay_exactly_once(
    cluster, inputs: Path, checkpoint: Path, tmp_path: Path
) -> None:
    # Start from a forebay checkpoint holding every third id (8 shards, 2 actors).
    ckpt_dir = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(checkpoint), str(ckpt_dir)], check=True)
    ds = fray.read_parquet(str(inputs), batch_size=500).map_batches(
        slow_identity, batch_format="pyarrow", batch_size=500
    )
    # Actor 0 (LedgerShardOwner) also keeps the run's unit ledger: reports it loses when
    # killed only keep their units from being recorded finished.
    markers = ("slow_identity", "_ShardOwner", "LedgerShardOwner")
    with WorkerKiller(*markers) as killer:
        result = fray.write_parquet(
            ds,
            tmp_path / "out",
            checkpoint=forebay.Checkpoint("id", str(ckpt_dir)),
            num_filter_actors=2,
        )
    assert set(killer.killed) == set(markers), killer.killed
    assert_written_once(tmp_path / "out", expected_left())
    assert result["rows"] == len(expected_left())


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with moto_s3(tmp_path_factory.mktemp("moto-ray") / "moto.log") as server:
        yield server


S3_DRIVER = """
import json, sys, ray, forebay, forebay.ray as fray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False
bucket, options = sys.argv[2], json.loads(sys.argv[3])
ds = fray.read_parquet(f"s3://{bucket}/in/", batch_size=1_000, task_bytes=int(sys.argv[4]),
                       storage_options=options)
result = fray.write_parquet(ds, f"s3://{bucket}/out", storage_options=options,
                            min_rows_per_file=5_000,
                            checkpoint=forebay.Checkpoint("id", f"s3://{bucket}/ckpt",
                                                          storage_options=options))
print(json.dumps(result["resume"]))
"""


def test_write_parquet_on_s3_resumes_exactly_once(cluster, inputs: Path, s3) -> None:
    client, endpoint = s3
    options = {**S3_CREDENTIALS, "aws_endpoint": endpoint}
    bucket = "ray-write"
    client.create_bucket(Bucket=bucket)
    for f in sorted(inputs.iterdir()):
        client.upload_file(str(f), bucket, f"in/{f.name}")
    address = ray.get_runtime_context().gcs_address
    args = [sys.executable, "-c", S3_DRIVER, address, bucket, json.dumps(options)]
    args.append(str(one_file(inputs)))
    killed = subprocess.run(
        args,
        env={**os.environ, "FOREBAY_CRASH_AT": "recorded:5"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(resumed.stdout.strip().splitlines()[-1])
    # As above: commits can mix rows of every file read at once, so no file may be finished,
    # and a read task's last file holds what its block had left.
    assert report["commits_recovered"] >= 5
    assert report["ids_done"] >= report["commits_recovered"]
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]]
    assert not [k for k in keys if "_forebay_staging" in k], "staging cleaned up"
    values = []
    for key in keys:
        if "/_" in key or "/." in key:
            continue
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        values.extend(pq.read_table(pa.BufferReader(body), columns=["value"])["value"].to_pylist())
    assert sorted(values) == list(range(FILES * ROWS_PER_FILE))
