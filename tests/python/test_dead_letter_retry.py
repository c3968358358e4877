"""``write_parquet(..., retry_dead_letters=True)``: the rows a job set aside, run again with
the function fixed, land in the output exactly once (or are set aside again), and the
dead-letter files retried are gone; a kill at any moment of the retry and a rerun finish it
exactly once; the job's own checkpoint is untouched (a rerun of the job writes nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay

ROWS = 20_000
POISON = [17, 4_100, 8_000, 12_345, ROWS - 1]

# The job as a script: ``job.py <out> <checkpoint> <fixed ids, comma-separated> [retry]``.
JOB = """
import sys
import forebay

data, out, ckpt, fixed, *retry = sys.argv[1:]
POISON = {POISON}
fixed = {{int(i) for i in fixed.split(",") if i}}


def model(batch):
    hit = sorted((POISON - fixed).intersection(batch["id"].tolist()))
    if hit:
        raise ValueError(f"cannot embed {{hit}}")
    return batch


forebay.configure(progress=False)
stats = (
    forebay.read_parquet(data)
    .map_batches(model, batch_format="numpy", batch_size=500, on_error="dead_letter")
    .write_parquet(
        out,
        checkpoint=forebay.Checkpoint("id", ckpt),
        rows_per_file=3_000,
        retry_dead_letters=bool(retry),
    )
)
print(stats["rows"], stats.get("dead_letters_retried"))
"""


@pytest.fixture
def job(tmp_path):
    data = tmp_path / "in.parquet"
    ids = np.arange(ROWS)
    pq.write_table(pa.table({"id": ids, "x": ids * 2}), data, row_group_size=2_500)
    script = tmp_path / "job.py"
    script.write_text(JOB.format(POISON=set(POISON)))

    def run(fixed=(), retry=False, crash_at=None):
        env = {k: v for k, v in os.environ.items() if k != "FOREBAY_CRASH_AT"}
        if crash_at:
            env["FOREBAY_CRASH_AT"] = crash_at
        args = [str(data), str(tmp_path / "out"), str(tmp_path / "ck"), ",".join(map(str, fixed))]
        return subprocess.run(
            [sys.executable, str(script), *args, *(["retry"] if retry else [])],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    return run


def output_ids(out: Path) -> list[int]:
    return sorted(i for f in out.glob("*.parquet") for i in pq.read_table(f)["id"].to_pylist())


def dead_letter_ids(out: Path) -> list[int]:
    files = sorted((out / "_dead_letter").rglob("*.parquet"))
    return sorted(i for f in files for i in pq.read_table(f)["id"].to_pylist())


def ok(run) -> list[str]:
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split()


def test_a_retry_writes_the_rows_set_aside_once_and_removes_their_dead_letters(job, tmp_path):
    out = tmp_path / "out"
    assert ok(job())[0] == str(ROWS - len(POISON))
    assert dead_letter_ids(out) == POISON
    files = len(list((out / "_dead_letter").rglob("*.parquet")))
    assert files > 1, "several commits set rows aside"
    assert ok(job(fixed=POISON, retry=True)) == [str(len(POISON)), str(files)]
    assert output_ids(out) == list(range(ROWS))
    assert dead_letter_ids(out) == []
    assert not (tmp_path / "ck.retry").exists(), "the retry's state is gone"
    # The job's checkpoint is untouched: the job is done, and so is the retry.
    assert ok(job(fixed=POISON))[0] == "0"
    assert ok(job(fixed=POISON, retry=True)) == ["0", "0"]
    assert output_ids(out) == list(range(ROWS))


def test_rows_failing_again_are_set_aside_again_and_a_later_retry_takes_them(job, tmp_path):
    out = tmp_path / "out"
    ok(job())
    assert ok(job(fixed=POISON[:3], retry=True))[0] == "3"
    assert output_ids(out) == sorted(set(range(ROWS)) - set(POISON[3:]))
    assert dead_letter_ids(out) == POISON[3:], "only the rows that failed again"
    assert ok(job(fixed=POISON, retry=True))[0] == "2"
    assert output_ids(out) == list(range(ROWS))
    assert dead_letter_ids(out) == []


@pytest.mark.parametrize(
    "crash_at",
    [
        "staged:1",  # the retry's commit staged, not recorded: rolled back
        "recorded:1",  # recorded, not published: rolled forward
        "published:1",
        "retry-written:1",  # all retried rows committed, no dead letter deleted yet
        "retry-deleting:1",  # one dead-letter file deleted
        "retry-cleaned:1",  # dead letters gone, the retry's state not yet
    ],
)
def test_a_retry_killed_anywhere_finishes_exactly_once(job, tmp_path, crash_at):
    out = tmp_path / "out"
    ok(job())
    killed = job(fixed=POISON, retry=True, crash_at=crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    ok(job(fixed=POISON, retry=True))
    assert output_ids(out) == list(range(ROWS)), "each row exactly once"
    assert dead_letter_ids(out) == []
    assert not (tmp_path / "ck.retry").exists()


def test_retry_arguments_are_checked_and_nothing_to_retry_is_no_work(tmp_path):
    data = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": np.arange(100)}), data)
    ds = forebay.read_parquet(str(data)).map_batches(lambda b: b)
    out, ck = str(tmp_path / "out"), forebay.Checkpoint("id", str(tmp_path / "ck"))
    with pytest.raises(ValueError, match="needs the job's checkpoint"):
        ds.write_parquet(out, retry_dead_letters=True)
    with pytest.raises(ValueError, match="no map_batches step"):
        forebay.read_parquet(str(data)).write_parquet(out, checkpoint=ck, retry_dead_letters=True)
    with pytest.raises(ValueError, match="mode must be 'append'"):
        ds.write_parquet(out, checkpoint=ck, mode="overwrite", retry_dead_letters=True)
    stats = ds.write_parquet(out, checkpoint=ck, retry_dead_letters=True)
    assert stats["rows"] == 0 and stats["dead_letters_retried"] == 0
    assert not (tmp_path / "ck.retry").exists()
    # Reading an output's dead letters back into it is allowed (what a retry does), but not
    # with mode="overwrite", which would delete them before they are read.
    dead = tmp_path / "out" / "_dead_letter" / "s" / "part-0.parquet"
    dead.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": np.arange(3)}), dead)
    again = forebay.read_parquet(str(dead)).write_parquet(out, mode="append")
    assert again["rows"] == 3
    with pytest.raises(forebay.WriteError, match=r"overwrite.*would delete it"):
        forebay.read_parquet(str(dead)).write_parquet(out, mode="overwrite")


def test_a_retry_on_s3(tmp_path):
    from conftest import S3_CREDENTIALS, moto_s3

    data = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": np.arange(ROWS)}), data, row_group_size=2_500)
    fixed: set[int] = set()

    def model(batch):
        if (set(POISON) - fixed).intersection(batch["id"].tolist()):
            raise ValueError("poison")
        return batch

    with moto_s3(tmp_path / "moto.log") as (client, endpoint):
        client.create_bucket(Bucket="retry")
        options = {"aws_endpoint": endpoint, **S3_CREDENTIALS}
        ck = forebay.Checkpoint("id", "s3://retry/ck", storage_options=options)

        def run(retry: bool) -> dict:
            return (
                forebay.read_parquet(str(data))
                .map_batches(model, batch_format="numpy", batch_size=500, on_error="dead_letter")
                .write_parquet(
                    "s3://retry/out/",
                    storage_options=options,
                    checkpoint=ck,
                    rows_per_file=3_000,
                    retry_dead_letters=retry,
                )
            )

        assert run(False)["rows"] == ROWS - len(POISON)
        fixed.update(POISON)
        assert run(True)["rows"] == len(POISON)
        keys = [o["Key"] for o in client.list_objects_v2(Bucket="retry")["Contents"]]
        assert not [k for k in keys if k.startswith(("out/_dead_letter/", "ck.retry"))], keys
        got = forebay.read_parquet("s3://retry/out/", storage_options=options).to_arrow()
        assert sorted(got["id"].to_pylist()) == list(range(ROWS))
