"""Trust at the edges: what a new user does in the first week must end in a correct result or
a clear error, never in lost input, duplicated rows or a checkpoint that no later run can use.
(Concurrent runs and kills of whole jobs are in test_resume.py.)"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import forebay
from conftest import REPO

ROWS = 3000


@pytest.fixture
def data(tmp_path) -> Path:
    """Three files of 1,000 rows (int64 ids), row groups of 250."""
    d = tmp_path / "data"
    d.mkdir()
    for part in range(3):
        ids = np.arange(part * 1000, (part + 1) * 1000)
        table = pa.table({"id": ids, "text": [f"row {i}" for i in ids]})
        pq.write_table(table, d / f"part-{part}.parquet", row_group_size=250)
    return d


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def output_ids(out: Path) -> list[int]:
    ids: list[int] = []
    for f in sorted(out.glob("*.parquet")):
        ids.extend(pq.read_table(f, columns=["id"])["id"].to_pylist())
    return ids


# ---------------------------------------------------------------- the write's arguments


def test_wrong_checkpoint_arguments_are_refused_before_anything_is_written(data, tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    ds = forebay.read_parquet(str(data))
    with pytest.raises(ValueError, match="on_changed_input must be 'error' or 'reprocess'"):
        ds.write_parquet(
            str(out), checkpoint=forebay.Checkpoint("id", ckpt), on_changed_input="ignore"
        )
    with pytest.raises(TypeError, match="Checkpoint: path must be a str"):
        forebay.Checkpoint("id", bytes(ckpt))  # type: ignore[arg-type]
    assert not ckpt.exists()
    assert not out.exists() or not any(out.iterdir())
    # The checkpoint's fields reach the engine by name (a pathlib path is taken as its
    # string).
    forebay.read_parquet(str(data)).write_parquet(
        str(out), checkpoint=forebay.Checkpoint("id", ckpt, num_shards=4, storage_options={})
    )
    assert sorted(output_ids(out)) == list(range(ROWS))
    manifest = (ckpt / "_forebay_checkpoint").read_text().splitlines()
    assert "num_shards 4" in manifest and "id_column id" in manifest, manifest


# ---------------------------------------------------------------- where a write may go


@pytest.mark.parametrize("mode", ["overwrite", "append", "error"])
def test_writing_over_its_own_input_is_refused_and_the_input_kept(data, mode):
    before = snapshot(data)
    ds = forebay.read_parquet(str(data)).map_batches(lambda b: b)
    with pytest.raises(forebay.WriteError) as raised:
        ds.write_parquet(str(data), mode=mode)
    message = str(raised.value)
    assert "input file" in message and "part-0.parquet" in message, message
    if mode == "overwrite":
        assert "delete" in message, message
    assert snapshot(data) == before, "the input is untouched"
    assert forebay.read_parquet(str(data)).count_rows() == ROWS


def test_an_output_inside_the_input_directory_is_refused(data, tmp_path):
    ds = forebay.read_parquet(str(data))
    with pytest.raises(forebay.WriteError, match="inside the input directory"):
        ds.write_parquet(str(data / "out"))
    # The same place through a symlink is the same place.
    link = tmp_path / "link"
    link.symlink_to(data)
    with pytest.raises(forebay.WriteError, match="input"):
        ds.write_parquet(str(link / "out"), mode="overwrite")
    assert not (data / "out").exists()
    # A plain glob lists only its own directory: a subdirectory of it is fine.
    stats = forebay.read_parquet(str(data / "*.parquet")).write_parquet(str(data / "out"))
    assert stats["rows"] == ROWS and sorted(output_ids(data / "out")) == list(range(ROWS))


@pytest.mark.parametrize("where", ["same", "inside-output", "around-output", "inside-input"])
def test_a_checkpoint_overlapping_the_output_or_input_is_refused(data, tmp_path, where):
    out = tmp_path / "out"
    checkpoint = {
        "same": out,
        "inside-output": out / "ckpt",
        "around-output": tmp_path,
        "inside-input": data / "ckpt",
    }[where]
    ds = forebay.read_parquet(str(data))
    with pytest.raises(forebay.WriteError) as raised:
        ds.write_parquet(str(out), checkpoint=forebay.Checkpoint("id", str(checkpoint)))
    message = str(raised.value)
    assert str(checkpoint) in message, message
    assert not out.exists() or not list(out.rglob("*.parquet")), "nothing written"
    assert not (data / "ckpt").exists()


# ---------------------------------------------------------------- the checkpoint stays usable


def test_a_step_that_changes_the_ids_type_fails_before_committing(data, tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def as_text(batch):
        return batch.set_column(0, "id", pc.cast(batch["id"], pa.string()))

    with pytest.raises(forebay.ForebayError) as raised:
        forebay.read_parquet(str(data)).map_batches(as_text).write_parquet(
            str(out), checkpoint=forebay.Checkpoint("id", str(ckpt))
        )
    message = str(raised.value)
    assert "'id'" in message and "integer" in message and "string" in message.lower(), message
    assert output_ids(out) == [], "nothing committed"
    # The checkpoint is still usable: the fixed job runs, exactly once.
    stats = (
        forebay.read_parquet(str(data))
        .map_batches(lambda b: b)
        .write_parquet(str(out), checkpoint=forebay.Checkpoint("id", str(ckpt)))
    )
    assert stats["rows"] == ROWS and sorted(output_ids(out)) == list(range(ROWS))


def test_a_rerun_after_delete_on_success_writes_nothing_again_and_says_so(data, tmp_path, caplog):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run() -> dict:
        return forebay.read_parquet(str(data)).write_parquet(
            str(out), checkpoint=forebay.Checkpoint("id", str(ckpt), delete_on_success=True)
        )

    assert run()["rows"] == ROWS
    assert not (ckpt / "ids").exists(), "the ids were deleted"
    with caplog.at_level(logging.WARNING, logger="forebay"):
        again = run()
    assert again["rows"] == 0, "a finished job's rerun writes nothing"
    assert sorted(output_ids(out)) == list(range(ROWS))
    assert any("this job is done" in r.getMessage() for r in caplog.records), caplog.text
    # A file added later is read and written (its ids are no longer checked against the
    # deleted ones: that is what delete_on_success gives up).
    pq.write_table(pa.table({"id": [5000, 5001], "text": ["a", "b"]}), data / "part-9.parquet")
    assert run()["rows"] == 2


# ---------------------------------------------------------------- shared memory of dead runs


def _kill_stores_bench():
    """benches/python/kill_stores.py: its job is the one these tests kill (it kills it 40
    times for BENCHMARKS.md)."""
    path = REPO / "benches" / "python" / "kill_stores.py"
    spec = importlib.util.spec_from_file_location("kill_stores", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROCESS_JOB: str = _kill_stores_bench().JOB


def stores_of(pid: int) -> list[Path]:
    shm = Path("/dev/shm")
    return [p for p in shm.glob(f"forebay-store-{pid}-*")] if shm.is_dir() else []


def start_process_job(tmp_path: Path, data: Path) -> subprocess.Popen:
    script = tmp_path / "job.py"
    script.write_text(PROCESS_JOB)
    return subprocess.Popen(
        [sys.executable, str(script), str(data), str(tmp_path / "out"), str(tmp_path / "ckpt")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_store(proc: subprocess.Popen) -> None:
    assert proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 60
    while not stores_of(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stores_of(proc.pid), "the run made its object store"


def test_sigterm_stops_a_run_cleanly_and_removes_its_store(data, tmp_path):
    proc = start_process_job(tmp_path, data)
    wait_for_store(proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    assert stores_of(proc.pid) == [], "the store was removed"
    staged = [p for p in (tmp_path / "out").rglob("*") if "_forebay_staging" in p.parts]
    assert not [p for p in staged if p.is_file()], staged
    # What was committed stays committed; the rerun finishes the job exactly once.
    rerun = start_process_job(tmp_path, data)
    _out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    ids = output_ids(tmp_path / "out")
    assert sorted(ids) == list(range(ROWS))


def test_the_store_of_a_sigkilled_run_is_reclaimed_by_the_next_run(data, tmp_path):
    proc = start_process_job(tmp_path, data)
    wait_for_store(proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    left = stores_of(proc.pid)
    assert left, "a SIGKILLed run cannot remove its own store"
    rerun = start_process_job(tmp_path, data)
    wait_for_store(rerun)
    assert stores_of(proc.pid) == [], "the next run removed the dead run's store"
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert sorted(output_ids(tmp_path / "out")) == list(range(ROWS))


def test_an_object_store_whose_owner_was_killed_is_reclaimed(tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(
        "import forebay, time\n"
        "s = forebay.ObjectStore(capacity='64MiB')\n"
        "print(s.path, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    path = Path(proc.stdout.readline().strip())
    assert path.is_dir()
    proc.kill()
    proc.wait(timeout=10)
    assert path.is_dir(), "left behind by SIGKILL"
    store = forebay.ObjectStore(capacity="64MiB")
    try:
        assert not path.exists(), "reclaimed when the next store was made"
    finally:
        del store


# ---------------------------------------------------------------- errors that say what to do


def test_no_columns_is_a_clear_error(data):
    with pytest.raises(ValueError, match=r"columns=\[\] selects no column"):
        forebay.read_parquet(str(data), columns=[])


def test_a_later_batch_with_other_types_names_the_column(data, tmp_path):
    def nulls_make_floats(batch):
        frame = batch.to_pandas()
        if frame["id"].iloc[0] >= 1000:
            frame.loc[frame.index[0], "id"] = None  # pandas: int64 becomes float64
        return frame

    ds = forebay.read_parquet(str(data)).map_batches(
        nulls_make_floats, concurrency=1, batch_size=1000
    )
    with pytest.raises(forebay.ForebayError) as raised:
        ds.write_parquet(str(tmp_path / "out"), preserve_order=True)
    message = str(raised.value)
    assert "'id' is Float64 (first batch: Int64)" in message, message
    assert "Schema {" not in message and "Field {" not in message, message


def test_checkpoint_filter_writes_to_a_relative_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = forebay.CheckpointFilter(pa.int64(), id_column="id")
    done.insert(pa.array([1, 2, 3]))
    done.write("relative/dir")
    again = forebay.CheckpointFilter.load(str(tmp_path / "relative" / "dir"), "id")
    assert again.contains(pa.array([1, 4])).to_pylist() == [True, False]


@pytest.mark.parametrize("compute", ["threads", "processes"])
def test_a_function_returning_a_list_gets_a_message_naming_what_it_returned(data, compute):
    ds = forebay.read_parquet(str(data)).map_batches(
        lambda b: [1, 2], compute=compute, concurrency=1
    )
    with pytest.raises(forebay.StageError) as raised:
        ds.to_arrow()
    message = str(raised.value)
    assert "returned a list whose item 0 is int" in message, message
    assert "StageError" not in message, "the type is not repeated inside the message"


class NotCallable:
    pass


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda ds: ds.map_batches(lambda b: b, batch_size="10"), TypeError, "batch_size"),
        (lambda ds: ds.map_batches(lambda b: b, concurrency="2"), TypeError, "concurrency"),
        (lambda ds: ds.map_batches(lambda b: b, concurrency=2.5), TypeError, "concurrency"),
        (lambda ds: ds.map_batches(NotCallable), TypeError, "__call__"),
        (
            lambda ds: ds.map_batches(lambda b: b, fn_constructor_args=(1,)),
            ValueError,
            "apply to a class",
        ),
        (
            lambda ds: ds.map_batches(lambda b: b, fn_constructor_kwargs={"x": 1}),
            ValueError,
            "fn_args/fn_kwargs",
        ),
        (lambda ds: ds.limit("5"), TypeError, "limit"),
        (lambda ds: ds.limit(-1), ValueError, "limit"),
        (lambda ds: ds.write_parquet("x", rows_per_file=0), ValueError, "rows_per_file"),
        (lambda ds: next(ds.iter_batches(prefetch_batches=-1)), ValueError, "prefetch"),
        (lambda ds: next(ds.iter_batches(local_shuffle_seed="1")), TypeError, "seed"),
    ],
)
def test_wrong_arguments_are_named(data, call, error, text):
    with pytest.raises(error, match=text):
        call(forebay.read_parquet(str(data)))


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"prefetch": -1}, ValueError, "prefetch"),
        ({"num_threads": 0}, ValueError, "num_threads"),
        ({"batch_size": "10"}, TypeError, "batch_size"),
        ({"file_extensions": "parquet"}, TypeError, "file_extensions"),
        ({"columns": ["id", "x", "id"]}, ValueError, "columns names 'id' twice"),
    ],
)
def test_wrong_read_arguments_are_named(data, kwargs, error, text):
    with pytest.raises(error, match=text):
        forebay.read_parquet(str(data), **kwargs)


def test_negative_sizes_are_named():
    store = forebay.ObjectStore(capacity="16MiB")
    with pytest.raises(ValueError, match="size"):
        store.create(-1)
    with pytest.raises(TypeError, match="num_threads"):
        forebay.configure(num_threads="4")


def test_iter_batches_accepts_no_prefetch_as_ray_does(data):
    rows = sum(len(b) for b in forebay.read_parquet(str(data)).iter_batches(prefetch_batches=0))
    assert rows == ROWS


def test_stray_files_beside_the_data_are_not_read(data):
    (data / "README").write_text("what these files are")
    (data / "notes.csv").write_text("a,b\n1,2\n")
    assert forebay.read_parquet(str(data)).count_rows() == ROWS
    # Named explicitly, a file is read whatever its name: an error naming it.
    with pytest.raises(forebay.ForebayError, match="README"):
        forebay.read_parquet(str(data / "README"))
    # Every file, if asked.
    with pytest.raises(forebay.ForebayError, match=r"README|notes\.csv"):
        forebay.read_parquet(str(data), file_extensions=None).count_rows()


def test_a_directory_without_parquet_names_says_so(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(forebay.DatasetNotFoundError, match="an empty directory"):
        forebay.read_parquet(str(empty))
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"id": [1]}), other / "000000_0")
    with pytest.raises(forebay.DatasetNotFoundError, match="file_extensions=None") as raised:
        forebay.read_parquet(str(other))
    assert "000000_0" in str(raised.value)
    assert forebay.read_parquet(str(other), file_extensions=None).count_rows() == 1


def test_a_file_with_an_extra_column_is_named_with_the_column(data):
    pq.write_table(pa.table({"id": [9000], "text": ["x"], "score": [0.5]}), data / "part-3.parquet")
    with pytest.raises(forebay.SchemaMismatchError) as raised:
        forebay.read_parquet(str(data)).to_arrow()
    message = str(raised.value)
    assert "part-3.parquet" in message and '["score"]' in message, message
    assert forebay.read_parquet(str(data), columns=["id", "text"]).count_rows() == ROWS + 1


# ---------------------------------------------------------------- tight memory caps

SWEEP = textwrap.dedent(
    """
    import shutil, sys, time, forebay

    cap, path, scratch = sys.argv[1], sys.argv[2], sys.argv[3]
    forebay.configure(memory_limit=cap, progress=False)

    def identity(batch):
        return batch

    def run(shape):
        ds = forebay.read_parquet(path)
        if shape == "iter":
            return sum(len(b) for b in ds.iter_batches(batch_size=256))
        if shape == "shuffle":
            batches = ds.iter_batches(
                batch_size=256, local_shuffle_buffer_size=5000, local_shuffle_seed=1
            )
            return sum(len(b) for b in batches)
        if shape in ("threads", "processes"):
            mapped = ds.map_batches(identity, batch_size=2000, compute=shape, concurrency=2)
            return sum(len(b) for b in mapped.iter_batches(batch_size=None))
        if shape == "processes-whole":
            # The source's batches as they come: one may be larger than the whole store.
            mapped = ds.map_batches(identity, compute="processes", concurrency=2)
            return sum(len(b) for b in mapped.iter_batches(batch_size=None))
        shutil.rmtree(scratch, ignore_errors=True)
        checkpoint = forebay.Checkpoint("id", scratch + "/ckpt")
        out = ds.map_batches(identity, batch_size=2000)
        return out.write_parquet(scratch + "/out", checkpoint=checkpoint)["rows"]

    for shape in ("iter", "shuffle", "threads", "processes", "processes-whole", "write"):
        started = time.monotonic()
        try:
            outcome = f"rows {run(shape)}"
        except forebay.ForebayError as e:
            outcome = f"error {type(e).__name__}: {e}"
        print(shape, round(time.monotonic() - started, 1), outcome, flush=True)
    """
)


@pytest.fixture(scope="module")
def sweep_inputs(tmp_path_factory) -> dict[str, tuple[Path, int]]:
    """One file of four large row groups (~5 MB decoded each), and 40 small files."""
    root = tmp_path_factory.mktemp("sweep")
    n = 4 * 150_000
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "id": np.arange(n),
            "x": rng.random(n),
            "s": pa.array([f"row-{i}-payload" for i in range(n)]),
        }
    )
    pq.write_table(table, root / "big.parquet", row_group_size=150_000)
    small = root / "small"
    small.mkdir()
    for f in range(40):
        part = table.slice(f * 2500, 2500)
        pq.write_table(part, small / f"part-{f:02}.parquet", row_group_size=1000)
    return {"big": (root / "big.parquet", n), "small": (small, 40 * 2500)}


@pytest.mark.parametrize("cap", ["1MiB", "8MiB", "64MiB", "1GiB"])
@pytest.mark.parametrize("dataset", ["big", "small"])
def test_every_pipeline_finishes_or_says_which_cap_would_do(sweep_inputs, tmp_path, cap, dataset):
    """Iterate, shuffle, map on threads and in processes, and write with a checkpoint under
    caps from 1 MiB to 1 GiB: each ends with every row or a clear error within its deadline
    (a tight cap degrades to a batch at a time; it never waits forever)."""
    path, rows = sweep_inputs[dataset]
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP)
    try:
        result = subprocess.run(
            [sys.executable, str(script), cap, str(path), str(tmp_path / "scratch")],
            capture_output=True,
            text=True,
            timeout=150,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"cap {cap}: a pipeline hung; finished before it: {e.stdout!r}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == [
        "iter",
        "shuffle",
        "threads",
        "processes",
        "processes-whole",
        "write",
    ], result.stdout
    for line in lines:
        shape, _seconds, outcome = line.split(maxsplit=2)
        if outcome.startswith("error"):
            # Only a cap too small for the worker processes' exchange may fail, and its
            # message says what to set.
            assert shape.startswith("processes") and "memory_limit" in outcome, line
        else:
            assert outcome == f"rows {rows}", line


def test_a_worker_whose_input_comes_back_from_disk_into_a_full_store_names_the_limit(tmp_path):
    """The run spills a queued task's input while the store is full; the worker gets it back
    (a restore needs room too). No room is the memory limit's doing, as for its outputs."""
    from forebay._store import ObjectStore
    from forebay._worker import _store_full_is_the_memory_limit

    with ObjectStore(capacity="4MiB", spill_dir=str(tmp_path / "spill"), put_timeout=0.2) as store:
        queued = store.put(np.full(600_000, 7, dtype=np.int32))  # 2.4 MB, not pinned
        working = store.get(store.put(np.zeros(600_000, dtype=np.int32)))  # spills `queued`
        assert store.stats()["resident_objects"] == 1
        restoring = _store_full_is_the_memory_limit("a worker's input batch, back from disk,")
        with pytest.raises(forebay.MemoryLimitExceeded) as raised, restoring:
            store.get(queued)
        message = str(raised.value)
        assert "input batch" in message and "memory_limit" in message, message
        del working
        assert np.array_equal(store.get(queued), np.full(600_000, 7, dtype=np.int32))


# ---------------------------------------------------------------- what Ray users expect


def typed_columns() -> pa.Table:
    """Columns numpy has no form of its own for: a map, a struct, a decimal, a dictionary,
    a timestamp with a time zone (and nulls in them)."""
    import datetime as dt
    import decimal

    return pa.table(
        {
            "id": [1, 2, 3],
            "m": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
            "st": pa.array([{"p": 1, "q": "z"}, None, {"p": 3, "q": None}]),
            "dec": pa.array(
                [decimal.Decimal("1.25"), None, decimal.Decimal("-3.5")], pa.decimal128(9, 2)
            ),
            "cat": pa.array(["a", None, "a"]).dictionary_encode(),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, 12), None, dt.datetime(2024, 6, 1)],
                pa.timestamp("us", tz="Europe/Paris"),
            ),
        }
    )


@pytest.mark.parametrize("compute", ["threads", "processes"])
def test_a_numpy_batch_passed_on_unchanged_keeps_every_column_type(tmp_path, compute):
    """numpy holds maps and structs as Python objects and datetimes without their zone: a
    function returning its batch as it came must give back the input's columns, types and
    values (before: a map failed the run as 'not a batch', a time zone was lost)."""
    table = typed_columns()
    pq.write_table(table, tmp_path / "t.parquet")
    out = (
        forebay.read_parquet(str(tmp_path / "t.parquet"))
        .map_batches(lambda b: b, batch_format="numpy", compute=compute, concurrency=1)
        .to_arrow()
    )
    assert out.equals(table), (out.schema, table.schema)


def test_a_pandas_batch_with_a_map_column_passes_on(tmp_path):
    table = typed_columns()
    pq.write_table(table, tmp_path / "t.parquet")
    out = (
        forebay.read_parquet(str(tmp_path / "t.parquet"))
        .map_batches(lambda b: b, batch_format="pandas")
        .to_arrow()
    )
    for name in ("id", "m", "st", "dec", "ts"):
        assert out[name].equals(table[name]), name
    # (pandas makes a dictionary a Categorical: pyarrow gives back a dictionary of its own widths)
    assert out["cat"].cast(pa.string()).equals(table["cat"].cast(pa.string()))


def test_a_column_the_function_retypes_keeps_its_new_type(tmp_path):
    table = typed_columns()
    pq.write_table(table, tmp_path / "t.parquet")

    def retype(batch):
        batch["id"] = np.array([str(i) for i in batch["id"]], dtype=object)
        batch["ts"] = batch["ts"].astype("datetime64[ms]")
        batch["m"] = np.array(["map"] * len(batch["m"]), dtype=object)
        return batch

    out = (
        forebay.read_parquet(str(tmp_path / "t.parquet"))
        .map_batches(retype, batch_format="numpy")
        .to_arrow()
    )
    assert out.schema.field("id").type == pa.string()
    assert out.schema.field("ts").type == pa.timestamp("ms")
    assert out["m"].to_pylist() == ["map"] * 3


@pytest.mark.parametrize("compute", ["threads", "processes"])
def test_numpy_batches_are_writable_unless_zero_copy_is_asked_for(data, compute):
    def double(batch):
        batch["id"] *= 2  # in place, as Ray users write it
        return batch

    out = forebay.read_parquet(str(data), columns=["id"]).map_batches(
        double, batch_format="numpy", compute=compute, concurrency=1
    )
    assert sorted(out.to_arrow()["id"].to_pylist()) == [2 * i for i in range(ROWS)]

    def writable(batch):
        return {"writable": np.array([batch["id"].flags.writeable] * len(batch["id"]))}

    views = forebay.read_parquet(str(data), columns=["id"]).map_batches(
        writable, batch_format="numpy", zero_copy_batch=True
    )
    assert set(views.to_arrow()["writable"].to_pylist()) == {False}


def test_numpy_scalars_come_back_as_numpy_scalars():
    store = forebay.ObjectStore(capacity="16MiB")
    for value in (np.float64(3.0), np.int32(-7), np.bool_(True)):
        back = store.get(store.put(value))
        assert type(back) is type(value) and back == value
    assert store.get(store.put(np.array(5.0))).shape == ()


def test_stats_say_what_the_run_did(data, tmp_path):
    ds = forebay.read_parquet(str(data)).map_batches(
        lambda b: b, compute="processes", concurrency=1
    )
    ds.write_parquet(str(tmp_path / "out"))
    stats = ds.stats()
    stages = {s["name"]: s for s in stats["stages"]}
    # The worker processes' store reserves a quarter of the limit; it is not data in flight.
    assert 0 < stats["peak_bytes"] < 64 << 20, stats["peak_bytes"]
    read, write = stages["read_parquet"], stages["write_parquet"]
    assert read["busy_s"] > 0 and write["busy_s"] > 0
    assert write["rows_in"] == write["rows_out"] == ROWS
    assert write["batches_in"] == write["batches_out"] > 1


def test_a_seeded_shuffle_after_a_concurrent_step_is_reproducible(data):
    def jitter(batch):
        time.sleep(0.001 * (batch["id"][0].as_py() % 7))  # finishes out of order
        return batch

    def order() -> list[int]:
        ds = forebay.read_parquet(str(data), batch_size=100).map_batches(jitter, concurrency=2)
        batches = ds.iter_batches(
            batch_size=128, local_shuffle_buffer_size=500, local_shuffle_seed=3
        )
        return [i for b in batches for i in b["id"].to_pylist()]

    first = order()
    assert sorted(first) == list(range(ROWS))
    assert order() == first


JOB_INTO_SHARED_OUTPUT = """
import sys
import forebay
forebay.configure(progress=False)
name = sys.argv[1]
stats = forebay.read_parquet(f"in-{name}").map_batches(lambda b: b, batch_size=1000).write_parquet(
    "out", checkpoint=forebay.Checkpoint("id", f"ck-{name}"), rows_per_file=2000, concurrency=1,
    mode="append",  # each job adds to an output the other one commits into too
)
print(stats["rows"])
"""


def test_jobs_with_their_own_checkpoints_share_an_output_directory(tmp_path):
    """Job A killed with a commit recorded but not yet published; job B (another input,
    its own checkpoint, asking to append) then runs into the same output directory: A's resume still
    publishes that commit, and both jobs' rows are there exactly once (B's start used to
    delete A's staged files: A could not resume, its committed rows lost)."""
    for name, first in (("A", 0), ("B", 100_000)):
        (tmp_path / f"in-{name}").mkdir()
        ids = np.arange(first, first + 10_000)
        pq.write_table(
            pa.table({"id": ids}), tmp_path / f"in-{name}" / "a.parquet", row_group_size=1000
        )
    script = tmp_path / "job.py"
    script.write_text(JOB_INTO_SHARED_OUTPUT)

    def run(name, **env):
        return subprocess.run(
            [sys.executable, str(script), name],
            cwd=tmp_path,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    killed = run("A", FOREBAY_CRASH_AT="recorded:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    b = run("B")
    assert b.returncode == 0, b.stderr
    a = run("A")
    assert a.returncode == 0, a.stderr
    ids = sorted(output_ids(tmp_path / "out"))
    assert ids == list(range(10_000)) + list(range(100_000, 110_000))
    leftovers = [
        p for p in (tmp_path / "out").rglob("*") if p.is_file() and "_forebay_staging" in str(p)
    ]
    assert leftovers == []


def test_a_map_whose_column_is_all_null_in_some_batches_writes_the_column_s_type(tmp_path):
    """A batch whose answers are all missing comes out of pyarrow as the null type; it takes
    the type the column has in the dataset's first batch, also in a writer thread whose own
    first batch it is."""
    import pyarrow.parquet as pq

    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"id": list(range(80))}), src / "a.parquet", row_group_size=10)

    def answer(batch: pa.Table) -> pa.Table:
        ids = batch.column("id").to_pylist()
        texts = [None] * len(ids) if ids[0] >= 20 else [f"t{i}" for i in ids]
        return batch.append_column("text", pa.array(texts))  # all None: the null type

    out = tmp_path / "out"
    # One map task at a time: the typed batches come first; four writers take them in turn,
    # so most writers' first batch is all-null.
    forebay.read_parquet(str(src), batch_size=10).map_batches(
        answer, batch_size=10, concurrency=1
    ).write_parquet(str(out), concurrency=4, rows_per_file=10)
    assert len(list(out.glob("*.parquet"))) == 8
    for part in out.glob("*.parquet"):
        assert pq.read_schema(part).field("text").type == pa.string(), part.name
    back = pq.read_table(out).sort_by("id")
    assert back.column("text").to_pylist() == [f"t{i}" for i in range(20)] + [None] * 60


def test_a_polars_int128_column_is_an_unsupported_type_naming_it(tmp_path):
    pl = pytest.importorskip("polars")
    path = tmp_path / "wide.parquet"
    pl.DataFrame({"ok": [1, 2], "big": pl.Series([1, 2**100], dtype=pl.Int128)}).write_parquet(path)
    with pytest.raises(forebay.ForebayError, match="more than 64 bits") as caught:
        forebay.read_parquet(str(path)).to_arrow()
    assert not isinstance(caught.value, forebay.CorruptFileError)


def test_duckdb_intervals_keep_their_months_as_pyarrow_reads_them(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "intervals.parquet"
    duckdb.sql(
        "copy (select * from (values"
        " (1, INTERVAL 1 MONTH + INTERVAL 2 DAY + INTERVAL 3 SECOND, [INTERVAL 14 MONTH],"
        "  {'a': INTERVAL 7 DAY}),"
        " (2, INTERVAL 1 MONTH, [], {'a': NULL}),"
        " (3, NULL, NULL, NULL)) t(id, iv, l, s)"
        f") to '{path}' (row_group_size 2)"
    )
    expected = pq.read_table(path).replace_schema_metadata(None)
    assert expected.schema.field("iv").type == pa.binary(12)
    got = forebay.read_parquet(str(path)).to_arrow()
    assert got.schema == expected.schema
    assert got.equals(expected)
    # The months are there: 1 month is not 0 days.
    months = int.from_bytes(got.column("iv")[1].as_py()[:4], "little")
    assert months == 1
    # The column also reads alone, filtered by another.
    assert (
        forebay.read_parquet(str(path), columns=["iv"], filter=[("id", ">", 1)])
        .to_arrow()
        .equals(expected.select(["iv"]).slice(1))
    )


def test_a_zoned_timestamp_in_seconds_keeps_its_zone_as_pyarrow_reads_it(tmp_path):
    path = tmp_path / "s.parquet"
    column = pa.array([0, 3600], pa.timestamp("s", tz="America/New_York"))
    pq.write_table(pa.table({"t": column}), path)
    got = forebay.read_parquet(str(path)).to_arrow()
    assert got.schema == pq.read_table(path).schema.remove_metadata()
    assert got.equals(pq.read_table(path).replace_schema_metadata(None))


def test_ray_data_s_concurrency_range_runs_its_max_and_bad_ranges_are_refused(tmp_path):
    import threading

    pq.write_table(pa.table({"id": list(range(2000))}), tmp_path / "a.parquet", row_group_size=50)
    ds = forebay.read_parquet(str(tmp_path), batch_size=50)
    seen: set[int] = set()

    def slow(batch: pa.Table) -> pa.Table:
        seen.add(threading.get_ident())
        time.sleep(0.005)
        return batch

    out = ds.map_batches(slow, concurrency=(1, 3)).to_arrow()
    assert sorted(out.column("id").to_pylist()) == list(range(2000))
    assert 1 <= len(seen) <= 3
    for bad, message in [((3, 1), "min 3 above max 1"), ((1, 2, 5), "initial 5"), ((1,), "not")]:
        with pytest.raises(ValueError, match=message):
            ds.map_batches(slow, concurrency=bad)
    with pytest.raises(ValueError, match="at least 1"):
        ds.map_batches(slow, concurrency=(0, 2))
