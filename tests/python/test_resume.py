"""Exactly-once, resumable writes under fire: a job is SIGKILLed at random moments (and at
every point of the commit protocol, and in its worker processes), Ctrl-C'd, fed changed
input and a damaged checkpoint; after each interruption a rerun of the same script must
leave every input id in the output exactly once. Locally and on an S3 server (moto on
127.0.0.1)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay
from conftest import S3_CREDENTIALS, moto_s3

FILES, ROWS = 6, 4000  # per file; row groups of 500
IDS = {f"id-{i}" for i in range(FILES * ROWS)}

JOB = textwrap.dedent(
    """
    import json, os, sys, time
    import pyarrow.compute as pc
    import forebay

    def embed(batch):
        busy = os.environ.get("TEST_BUSY_DIR")
        if busy:  # tell the test this process is inside a batch (past its start-up)
            open(os.path.join(busy, str(os.getpid())), "w").close()
        time.sleep(0.03)  # a model's work
        poison = os.environ.get("TEST_POISON")
        if poison and set(poison.split(",")).intersection(batch["id"].to_pylist()):
            raise ValueError("a row the model cannot take")
        return batch.append_column("length", pc.utf8_length(batch["text"]))

    if __name__ == "__main__":
        config = json.loads(sys.argv[1])
        options = config.get("storage_options")
        forebay.configure(progress=False)
        scan_filter = [tuple(term) for term in config.get("filter", [])] or None
        ds = forebay.read_parquet(config["input"], storage_options=options, filter=scan_filter)
        out = ds.map_batches(
            embed, batch_size=400, compute=config["compute"], concurrency=2,
            max_retries=config.get("max_retries", 0), on_error=config.get("on_error", "raise"),
        )
        print("started", flush=True)
        stats = out.write_parquet(
            config["output"],
            rows_per_file=1500,
            storage_options=options,
            checkpoint=forebay.Checkpoint(
                config.get("id_column", "id"), config["checkpoint"], storage_options=options,
                delete_on_success=config.get("delete_on_success", False),
            ),
            on_changed_input=config.get("on_changed_input", "error"),
            mode=config.get("mode"),
        )
        print(json.dumps(stats), flush=True)
    """
)


def write_input(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        ids = np.arange(f * ROWS, (f + 1) * ROWS)
        table = pa.table({"id": [f"id-{i}" for i in ids], "text": [f"row {i} " * 3 for i in ids]})
        pq.write_table(table, directory / f"part-{f}.parquet", row_group_size=500)


@pytest.fixture
def job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    write_input(tmp_path / "in")

    def start(config: dict, env: dict | None = None) -> subprocess.Popen:
        full = {
            "input": str(tmp_path / "in"),
            "output": str(tmp_path / "out"),
            "checkpoint": str(tmp_path / "ckpt"),
            "compute": "threads",
            **config,
        }
        return subprocess.Popen(
            [sys.executable, str(script), json.dumps(full)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )

    def run(config: dict | None = None, env: dict | None = None) -> dict:
        proc = start(config or {}, env)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    start.run = run
    start.tmp = tmp_path
    return start


def output_ids(out: Path) -> list[str]:
    if not out.exists():
        return []
    files = [
        p for p in out.iterdir() if p.suffix == ".parquet" and not p.name.startswith((".", "_"))
    ]
    ids: list[str] = []
    for f in files:
        ids.extend(pq.read_table(f, columns=["id"]).column("id").to_pylist())
    return ids


def assert_exactly_once(out: Path) -> None:
    ids = output_ids(out)
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} rows written twice"
    assert set(ids) == IDS, f"{len(IDS - set(ids))} rows missing"


def reset(tmp: Path) -> None:
    for name in ("out", "ckpt"):
        shutil.rmtree(tmp / name, ignore_errors=True)


# ---------------------------------------------------------------- SIGKILL


@pytest.mark.parametrize(
    "point", ["staged:2", "recorded:1", "recorded:3", "ids-published:2", "published:4"]
)
def test_killed_inside_a_commit_then_rerun_is_exactly_once(job, point):
    victim = job({}, env={"FOREBAY_CRASH_AT": point})
    victim.communicate(timeout=120)
    assert victim.returncode == -signal.SIGKILL
    stats = job.run()
    assert_exactly_once(job.tmp / "out")
    assert stats["resume"]["ids_done_before"] > 0
    if point.startswith(("recorded", "ids-published")):
        assert stats["resume"]["commits_recovered"] >= 1, "the record was rolled forward"


def test_killed_while_recovering_then_rerun_is_exactly_once(job):
    job({}, env={"FOREBAY_CRASH_AT": "recorded:3"}).communicate(timeout=120)
    # The next run dies while rolling the recorded commit forward; the one after recovers.
    victim = job({}, env={"FOREBAY_CRASH_AT": "recovering:1"})
    victim.communicate(timeout=120)
    assert victim.returncode == -signal.SIGKILL
    job.run()
    assert_exactly_once(job.tmp / "out")


def test_killed_while_deleting_on_success_then_rerun_writes_nothing_again(job):
    # Killed after the ids are deleted and before the inputs snapshot is: the output is
    # complete, and the rerun must find every input finished rather than rows to redo.
    victim = job({"delete_on_success": True}, env={"FOREBAY_CRASH_AT": "deleting:1"})
    victim.communicate(timeout=120)
    assert victim.returncode == -signal.SIGKILL
    assert_exactly_once(job.tmp / "out")
    assert not (job.tmp / "ckpt" / "ids").exists(), "the ids were deleted"
    stats = job.run({"delete_on_success": True})
    assert stats["rows"] == 0
    assert_exactly_once(job.tmp / "out")
    # What stays is the record of finished inputs (what keeps a rerun from writing again)
    # and the checkpoint's identity (the output's mark names it: a rerun is not a stranger).
    assert sorted(p.name for p in (job.tmp / "ckpt").iterdir() if p.is_file()) == [
        "_forebay_identity",
        "_forebay_inputs.json",
        "_forebay_lock",
    ]


def test_kills_inside_folds_lose_nothing_and_leave_few_records(job):
    """A run folds its commit records into the inputs snapshot every few commits (3 here;
    256 by default), so that a resume reads few records however many commits came before.
    Killed at 20 random points inside folds (the snapshot written, its records partly
    deleted), then run again: every row once, and the rerun rolled forward fewer records
    than a fold takes."""
    rng = random.Random(2026112701)
    fold = {"FOREBAY_FOLD_EVERY": "3"}
    # 16 commits: 5 folds of 3 records in the run, then the last one in `finish`.
    points = [f"folded:{n}" for n in range(1, 6)] + [f"folding:{n}" for n in range(1, 16)]
    for point in rng.sample(points, 20):
        victim = job({}, env={**fold, "FOREBAY_CRASH_AT": point})
        _, err = victim.communicate(timeout=120)
        assert victim.returncode == -signal.SIGKILL, f"{point}: {err[-2000:]}"
        records = list((job.tmp / "ckpt" / "_forebay_commits").glob("*.json"))
        stats = job.run(env=fold)
        assert_exactly_once(job.tmp / "out")
        assert len(records) <= 3 + 2, f"{point}: {len(records)} records left"
        assert stats["resume"]["commits_recovered"] <= 3, (point, stats["resume"])
        reset(job.tmp)


def kill_at_random(job, rng: random.Random, config: dict) -> None:
    proc = job(config)
    assert proc.stdout.readline().strip() == "started"
    time.sleep(rng.uniform(0.0, 0.9))
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)


@pytest.mark.parametrize("id_column", ["id", None])
def test_fifty_random_sigkills_each_followed_by_a_rerun(job, id_column):
    """With an id column, and without (``Checkpoint(None, ...)``: rows known by input
    position alone, no id written): each kill's rerun leaves every input row once."""
    rng = random.Random(20261122)
    outcomes = {"killed": 0, "finished first": 0}
    for trial in range(50):
        config = {
            "compute": "processes" if trial % 5 == 4 else "threads",
            "id_column": id_column,
        }
        proc = job(config)
        assert proc.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.0, 0.9))
        proc.send_signal(signal.SIGKILL)
        _, _err = proc.communicate(timeout=60)
        outcomes["killed" if proc.returncode == -signal.SIGKILL else "finished first"] += 1
        job.run(config)
        assert_exactly_once(job.tmp / "out")
        reset(job.tmp)
    assert outcomes["killed"] >= 40, outcomes


def dead_letter_ids(out: Path) -> list[str]:
    """Ids in the dead-letter files of the output (``_dead_letter/<stage>/``)."""
    files = sorted((out / "_dead_letter").rglob("*.parquet")) if out.exists() else []
    files = [f for f in files if not f.name.startswith(".")]
    return [i for f in files for i in pq.read_table(f, columns=["id"]).column("id").to_pylist()]


@pytest.mark.parametrize(
    ("on_error", "id_column"), [("skip", "id"), ("dead_letter", "id"), ("dead_letter", None)]
)
def test_poison_rows_through_sigkills_and_reruns_are_set_aside_exactly_once(
    job, on_error, id_column
):
    """5 rows raise: after each kill and rerun the output holds every other row exactly
    once and never a poison row; with on_error="dead_letter" the dead-letter files hold the
    5 rows exactly once, with their errors."""
    poison = {"id-17", "id-4000", "id-4001", "id-12345", f"id-{FILES * ROWS - 1}"}
    env = {"TEST_POISON": ",".join(sorted(poison))}
    rng = random.Random(20261127)
    for trial in range(int(os.environ.get("TEST_POISON_TRIALS", "4"))):
        config = {
            "compute": "processes" if trial % 3 == 2 else "threads",
            "id_column": id_column,
            "on_error": on_error,
        }
        proc = job(config, env=env)
        assert proc.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.0, 0.9))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        job.run(config, env=env)
        ids = output_ids(job.tmp / "out")
        assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} rows written twice"
        assert set(ids) == IDS - poison
        dead = dead_letter_ids(job.tmp / "out")
        if on_error == "dead_letter":
            assert sorted(dead) == sorted(poison), f"trial {trial}: {sorted(dead)}"
            errors = pa.concat_tables(
                pq.read_table(f) for f in (job.tmp / "out" / "_dead_letter").rglob("*.parquet")
            )
            assert set(errors["_error_type"].to_pylist()) == {"ValueError"}
            assert set(errors["_input_row"].to_pylist()) == {
                int(i.removeprefix("id-")) % ROWS for i in poison
            }
        else:
            assert dead == []
        reset(job.tmp)


@pytest.mark.parametrize("point", ["staged:2", "recorded:2", "ids-published:2", "published:3"])
def test_killed_inside_a_commit_with_dead_letters_then_rerun_is_exactly_once(job, point):
    """Dead-letter files are staged, recorded and published with the data file: a kill at
    each point of the protocol, then a rerun, leaves each poison row there once."""
    poison = {f"id-{i}" for i in range(0, FILES * ROWS, 997)}
    config = {"on_error": "dead_letter"}
    env = {"TEST_POISON": ",".join(sorted(poison))}
    victim = job(config, env={**env, "FOREBAY_CRASH_AT": point})
    victim.communicate(timeout=120)
    assert victim.returncode == -signal.SIGKILL
    stats = job.run(config, env=env)
    ids = output_ids(job.tmp / "out")
    assert len(ids) == len(set(ids)) and set(ids) == IDS - poison
    assert sorted(dead_letter_ids(job.tmp / "out")) == sorted(poison)
    if point.startswith(("recorded", "ids-published")):
        assert stats["resume"]["commits_recovered"] >= 1, "the record was rolled forward"


def _workers_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().split()
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[3]) == pid and b"forebay._worker" in cmd:
                found.append(int(entry.name))
    return found


@pytest.mark.parametrize("max_retries", [0, 1])
def test_a_killed_worker_process_then_rerun_is_exactly_once(job, max_retries):
    busy = job.tmp / "busy"
    busy.mkdir()
    proc = job(
        {"compute": "processes", "max_retries": max_retries}, env={"TEST_BUSY_DIR": str(busy)}
    )
    assert proc.stdout.readline().strip() == "started"
    # Kill a worker inside a batch: one that has run the function (a worker killed while it
    # starts is a start-up failure, reported as such; on a slow machine start-up takes
    # longer than any fixed wait).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        inside = {int(p.name) for p in busy.iterdir()} & set(_workers_of(proc.pid))
        if inside:
            break
        time.sleep(0.02)
    assert inside, "no worker process ran a batch within 60 s"
    os.kill(min(inside), signal.SIGKILL)
    _out, err = proc.communicate(timeout=120)
    if max_retries:
        assert proc.returncode == 0, err  # the batch ran again on a fresh worker
    else:
        assert proc.returncode != 0 and "WorkerDiedError" in err, err
    job.run({"compute": "processes"})
    assert_exactly_once(job.tmp / "out")


def test_ctrl_c_leaves_a_consistent_checkpoint(job):
    proc = job({})
    assert proc.stdout.readline().strip() == "started"
    time.sleep(0.4)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    ckpt = job.tmp / "ckpt"
    staged = [
        p for p in (job.tmp / "out").rglob("*") if "_forebay_staging" in p.parts and p.is_file()
    ]
    assert not staged, f"nothing left staged after Ctrl-C: {staged}"
    # Whatever was committed is complete: its ids and data agree.
    committed = set(output_ids(job.tmp / "out"))
    done = forebay.CheckpointFilter.load(str(ckpt), "id")
    assert len(done) == len(committed)
    assert all(done.contains(pa.array(sorted(committed))).to_pylist())
    job.run()
    assert_exactly_once(job.tmp / "out")


# ---------------------------------------------------------------- inputs and damage


def test_finished_input_is_skipped_unread(job):
    first = job.run()
    assert first["rows"] == len(IDS)
    again = job.run()
    assert again["rows"] == 0
    resume = again["resume"]
    # What was read is the first file's footer, for the dataset's schema.
    assert resume["files_skipped"] == FILES
    assert 0 < resume["bytes_read"] <= (job.tmp / "in" / "part-0.parquet").stat().st_size
    assert resume["ids_done_before"] == len(IDS)


def test_files_are_cut_between_batches_with_a_checkpoint(tmp_path):
    """A checkpointed write never splits a batch between files (a commit records the input
    rows its batches consumed): every file but the last holds at least ``rows_per_file``
    rows and less than a batch (a 500-row row group) more; each id is written once, and a
    rerun finds every input finished."""
    write_input(tmp_path / "in")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run() -> dict:
        return forebay.read_parquet(str(tmp_path / "in")).write_parquet(
            str(out),
            rows_per_file=700,
            concurrency=1,
            checkpoint=forebay.Checkpoint("id", str(ckpt)),
        )

    assert run()["rows"] == len(IDS)
    sizes = sorted(pq.ParquetFile(f).metadata.num_rows for f in out.glob("*.parquet"))
    assert sum(sizes) == len(IDS)
    assert all(700 <= n < 700 + 500 for n in sizes[1:]), sizes
    assert 0 < sizes[0] < 700 + 500, sizes
    assert_exactly_once(out)
    again = run()
    assert again["rows"] == 0 and again["resume"]["files_skipped"] == FILES


def test_a_changed_input_is_detected(job):
    job.run()
    time.sleep(0.02)
    extra = pa.table({"id": ["id-new-1", "id-new-2"], "text": ["a", "b"]})
    old = pq.read_table(job.tmp / "in" / "part-3.parquet")
    pq.write_table(pa.concat_tables([old, extra]), job.tmp / "in" / "part-3.parquet")
    proc = job({})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "part-3.parquet" in err and "changed" in err and "reprocess" in err, err
    stats = job.run({"on_changed_input": "reprocess"})
    assert stats["rows"] == 2 and stats["resume"]["rows_skipped_by_id"] == ROWS
    ids = output_ids(job.tmp / "out")
    assert len(ids) == len(set(ids)) == len(IDS) + 2


def test_a_changed_scan_filter_is_detected(job):
    # Run 1 drops id-5 by its filter and finishes every input.
    first = job.run({"filter": [["id", "!=", "id-5"]]})
    assert first["rows"] == len(IDS) - 1
    # Skipping the finished inputs under a filter that keeps id-5 would lose it silently.
    proc = job({"filter": [["id", "!=", "id-6"]]})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "scan filter" in err and '"id" != Str("id-5")' in err and "reprocess" in err, err
    stats = job.run({"filter": [["id", "!=", "id-6"]], "on_changed_input": "reprocess"})
    assert stats["rows"] == 1 and len(stats["resume"]["files_changed"]) == FILES
    assert_exactly_once(job.tmp / "out")
    # Finished with no filter, an input holds no row any filter could add: no error.
    reset(job.tmp)
    job.run()
    assert job.run({"filter": [["id", "!=", "id-7"]]})["rows"] == 0
    assert_exactly_once(job.tmp / "out")


def test_a_deleted_checkpoint_is_refused_instead_of_writing_everything_again(job):
    """The output knows which checkpoints committed into it: a rerun whose checkpoint
    directory was deleted (a new checkpoint at the same path) would write every row again
    beside the first run's files; it stops before reading, naming the checkpoint, unless
    the user asks to append."""
    out = job.tmp / "out"
    job.run()
    shutil.rmtree(job.tmp / "ckpt")
    proc = job({})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "committed under another checkpoint" in err, err
    assert str(job.tmp / "ckpt") in err and "mode='append'" in err, err
    assert len(output_ids(out)) == len(IDS), "nothing was written again"
    # Asked to append, the new checkpoint writes its rows; its reruns resume as usual.
    assert job.run({"mode": "append"})["rows"] == len(IDS)
    assert job.run()["rows"] == 0
    assert len(output_ids(out)) == 2 * len(IDS)
    # A second job with its own checkpoint into the same output asks as well.
    proc = job({"checkpoint": str(job.tmp / "ckpt-2")})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "committed under another checkpoint" in err, err
    # A run killed before its first commit left no mark: a fresh checkpoint may follow it.
    reset(job.tmp)
    proc = job({}, env={"FOREBAY_CRASH_AT": "staged:1"})
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    shutil.rmtree(job.tmp / "ckpt")
    assert job.run()["rows"] == len(IDS)
    assert_exactly_once(out)


def test_a_damaged_checkpoint_is_an_error_not_a_silent_rerun(job):
    """The record of finished inputs is what a resume relies on: damaged, it is an error
    naming it. An id part is read only by a resume that drops rows by id (here the job's
    own checkpoint resumes by input position, so the damaged part is not read, and nothing
    is written again); one that reads it names it."""
    job.run()
    part = next((job.tmp / "ckpt" / "ids").iterdir())
    part.write_bytes(b"PAR1 this is not a parquet file")
    assert job.run()["rows"] == 0
    (job.tmp / "ckpt" / "foreign-ids.parquet").write_bytes(
        (job.tmp / "in" / "part-0.parquet").read_bytes()
    )  # ids another writer left: this resume drops rows by id, and reads every part
    proc = job({})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "CheckpointError" in err and part.name in err, err
    (job.tmp / "ckpt" / "foreign-ids.parquet").unlink()
    inputs = job.tmp / "ckpt" / "_forebay_inputs.json"
    inputs.write_text('{"format": 1, "files": ')
    proc = job({})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "CheckpointError" in err and inputs.name in err, err
    assert len(output_ids(job.tmp / "out")) == len(IDS), "nothing was written again"


# ---------------------------------------------------------------- S3


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with moto_s3(tmp_path_factory.mktemp("moto-resume") / "moto.log") as server:
        yield server


def test_twenty_random_sigkills_on_s3(job, s3):
    client, endpoint = s3
    options = {**S3_CREDENTIALS, "aws_endpoint": endpoint}
    rng = random.Random(7)
    for trial in range(20):
        bucket = f"resume-{trial}"
        client.create_bucket(Bucket=bucket)
        for f in (job.tmp / "in").iterdir():
            client.upload_file(str(f), bucket, f"in/{f.name}")
        config = {
            "input": f"s3://{bucket}/in/",
            "output": f"s3://{bucket}/out",
            "checkpoint": f"s3://{bucket}/ckpt",
            "storage_options": options,
        }
        kill_at_random(job, rng, config)
        resumed = job.run(config)
        # A resume that wrote rows read them: the metric counts the store's bytes.
        if resumed["rows"] > 0:
            assert resumed["resume"]["bytes_read"] > 0, resumed["resume"]
        keys = [
            o["Key"]
            for o in client.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents", [])
        ]
        visible = [k for k in keys if "/_" not in k and "/." not in k]
        assert not [k for k in keys if "_forebay_staging" in k], "staging cleaned up"
        ids: list[str] = []
        for key in visible:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            ids.extend(pq.read_table(pa.BufferReader(body), columns=["id"])["id"].to_pylist())
        assert len(ids) == len(set(ids)) and set(ids) == IDS, f"trial {trial}"


# ---------------------------------------------------------------- concurrent runs

#: Seeded trials of each concurrency test; `FOREBAY_STRESS_TRIALS=20` for the full check
#: (BENCHMARKS.md records such runs), a few in `make test`.
TRIALS = int(os.environ.get("FOREBAY_STRESS_TRIALS", "2"))
REFUSED = ("another run is using this checkpoint", "took over this checkpoint")


def run_at_once(job, config: dict, runs: int, rng: random.Random) -> list[int]:
    """Start `runs` copies of the job, each 0-0.5 s after the previous; every one must end
    in success or in the clear refusal of a checkpoint in use. Returns the exit codes."""
    procs = []
    for _ in range(runs):
        procs.append(job(config))
        time.sleep(rng.uniform(0.0, 0.5))
    codes = []
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0 or any(r in err for r in REFUSED), err
        codes.append(proc.returncode)
    return codes


def s3_config(job, client, endpoint: str, bucket: str) -> dict:
    client.create_bucket(Bucket=bucket)
    for f in (job.tmp / "in").iterdir():
        client.upload_file(str(f), bucket, f"in/{f.name}")
    return {
        "input": f"s3://{bucket}/in/",
        "output": f"s3://{bucket}/out",
        "checkpoint": f"s3://{bucket}/ckpt",
        "storage_options": {**S3_CREDENTIALS, "aws_endpoint": endpoint},
    }


def s3_output_ids(client, bucket: str) -> list[str]:
    keys = [
        o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents", [])
    ]
    ids: list[str] = []
    for key in keys:
        if "/_" in key or "/." in key:
            continue
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        ids.extend(pq.read_table(pa.BufferReader(body), columns=["id"])["id"].to_pylist())
    return ids


@pytest.mark.parametrize("runs", [2, 3])
def test_concurrent_runs_on_one_local_checkpoint_write_each_row_once(job, runs):
    rng = random.Random(100 + runs)
    refused = 0
    for _trial in range(TRIALS):
        codes = run_at_once(job, {}, runs, rng)
        assert 0 in codes, codes
        refused += sum(1 for c in codes if c != 0)
        assert_exactly_once(job.tmp / "out")
        assert job.run()["rows"] == 0
        reset(job.tmp)
    assert refused, "the runs overlapped (the test would prove nothing otherwise)"


@pytest.mark.parametrize("runs", [2, 3])
def test_concurrent_runs_on_one_s3_checkpoint_write_each_row_once(job, s3, runs):
    client, endpoint = s3
    rng = random.Random(200 + runs)
    refused = 0
    for trial in range(TRIALS):
        bucket = f"concurrent-{runs}-{trial}"
        config = s3_config(job, client, endpoint, bucket)
        codes = run_at_once(job, config, runs, rng)
        assert 0 in codes, codes
        refused += sum(1 for c in codes if c != 0)
        ids = s3_output_ids(client, bucket)
        assert len(ids) == len(set(ids)) and set(ids) == IDS, f"trial {trial}: {codes}"
        assert job.run(config)["rows"] == 0
    assert refused, "the runs overlapped (the test would prove nothing otherwise)"


def test_a_run_after_the_s3_lease_holder_was_sigkilled_takes_over_at_once(job, s3):
    client, endpoint = s3
    rng = random.Random(300)
    for trial in range(TRIALS):
        bucket = f"lease-killed-{trial}"
        config = s3_config(job, client, endpoint, bucket)
        kill_at_random(job, rng, config)
        started = time.monotonic()
        stats = job.run(config)  # no waiting out the dead holder's lease: its pid is gone
        assert time.monotonic() - started < 25
        assert stats["rows"] <= len(IDS)
        ids = s3_output_ids(client, bucket)
        assert len(ids) == len(set(ids)) and set(ids) == IDS, f"trial {trial}"
