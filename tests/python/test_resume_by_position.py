"""Resumes by input position. Inputs whose ids repeat (within a row group, across row
groups and files): a checkpointed job killed with SIGKILL at random moments and at every
point of the commit protocol, then run again, writes exactly what an uninterrupted run
writes: every input row's output once, duplicates included (a resume never mistakes a row
for another row holding the same id). The job filters rows, explodes others, returns
several batches for one input, and chains two maps with different batch sizes. And a
checkpoint without an id column (``Checkpoint(None, path)``): what it refuses."""

from __future__ import annotations

import collections
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay

FILES, ROWS, DISTINCT_IDS = 3, 3000, 1700  # ids repeat within and across files

JOB = textwrap.dedent(
    """
    import json, sys, time
    import pyarrow as pa
    import pyarrow.compute as pc
    import forebay

    def filter_and_explode(batch):
        # Drops rows numbered 0 mod 8 and writes those numbered 4 mod 8 twice: two
        # batches for one input.
        time.sleep(0.03)  # a model's work
        number = pc.cast(pc.utf8_slice_codeunits(batch["row"], 3), pa.int64())
        kept = pc.not_equal(pc.bit_wise_and(number, 7), 0)
        first = batch.filter(kept)
        second = first.filter(pc.equal(pc.bit_wise_and(number.filter(kept), 3), 0))
        first = first.append_column("copy", pa.array([0] * first.num_rows, pa.int64()))
        second = second.append_column("copy", pa.array([1] * second.num_rows, pa.int64()))
        return [first, second] if second.num_rows else first

    def tag(batch):
        return batch.append_column("stage2", pc.utf8_length(batch["row"]))

    if __name__ == "__main__":
        config = json.loads(sys.argv[1])
        forebay.configure(progress=False)
        out = (
            forebay.read_parquet(config["input"])
            .map_batches(filter_and_explode, batch_size=256, concurrency=2)
            .map_batches(tag, batch_size=333, concurrency=2)
        )
        print("started", flush=True)
        stats = out.write_parquet(
            config["output"],
            rows_per_file=1000,
            concurrency=2,
            checkpoint=forebay.Checkpoint("id", config["checkpoint"]),
        )
        print(json.dumps(stats), flush=True)
    """
)


def row_number(f: int, i: int) -> int:
    return f * ROWS + i


def write_input(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        numbers = [row_number(f, i) for i in range(ROWS)]
        table = pa.table(
            {
                # A number's low bits decide the job's filter; its position its id.
                "id": [(n * 7919) % DISTINCT_IDS for n in numbers],
                "row": [f"row{n:06d}" for n in numbers],
            }
        )
        pq.write_table(table, directory / f"part-{f}.parquet", row_group_size=400)


def expected_rows() -> collections.Counter:
    """What the job writes, computed without it: (row, copy) for every output row."""
    out: collections.Counter = collections.Counter()
    for f in range(FILES):
        for i in range(ROWS):
            n = row_number(f, i)
            if n & 7 == 0:
                continue
            out[(f"row{n:06d}", 0)] += 1
            if n & 3 == 0:
                out[(f"row{n:06d}", 1)] += 1
    return out


def output_rows(out: Path) -> collections.Counter:
    rows: collections.Counter = collections.Counter()
    if not out.exists():
        return rows
    for path in out.glob("*.parquet"):
        table = pq.read_table(path, columns=["row", "copy"])
        rows.update(zip(table["row"].to_pylist(), table["copy"].to_pylist(), strict=True))
    return rows


@pytest.fixture
def job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    write_input(tmp_path / "in")
    config = json.dumps(
        {
            "input": str(tmp_path / "in"),
            "output": str(tmp_path / "out"),
            "checkpoint": str(tmp_path / "ckpt"),
        }
    )

    def start(env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(script), config],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )

    def run() -> dict:
        proc = start()
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def reset() -> None:
        for name in ("out", "ckpt"):
            shutil.rmtree(tmp_path / name, ignore_errors=True)

    start.run = run
    start.reset = reset
    start.out = tmp_path / "out"
    return start


def failing_after(rows: int, pause: float):
    """A map that passes its batches on, pausing ``pause`` s each (so that the writer
    commits files meanwhile), and raises once it has seen more than ``rows`` rows."""
    seen = 0

    def fail_late(batch):
        nonlocal seen
        seen += batch.num_rows
        if seen > rows:
            raise RuntimeError("interrupted")
        time.sleep(pause)
        return batch

    return fail_late


def test_an_uninterrupted_run_writes_every_row_of_every_duplicate_id(job):
    stats = job.run()
    expected = expected_rows()
    assert output_rows(job.out) == expected
    assert stats["rows"] == sum(expected.values())
    # Run again: the job is done, nothing is written twice.
    again = job.run()
    assert again["rows"] == 0 and output_rows(job.out) == expected


def test_random_sigkills_and_reruns_write_what_an_uninterrupted_run_writes(job):
    expected = expected_rows()
    rng = random.Random(20261126)
    points = ["staged", "recorded", "ids-published", "published"]
    outcomes = collections.Counter()
    for trial in range(12):
        # One or two interrupted runs, then a run to the end.
        for _ in range(1 + trial % 2):
            if trial % 3 == 0:
                point = f"{rng.choice(points)}:{rng.randint(1, 6)}"
                proc = job({"FOREBAY_CRASH_AT": point})
                proc.communicate(timeout=180)
            else:
                proc = job()
                assert proc.stdout.readline().strip() == "started"
                time.sleep(rng.uniform(0.1, 0.9))
                proc.send_signal(signal.SIGKILL)
                proc.communicate(timeout=60)
            outcomes["killed" if proc.returncode == -signal.SIGKILL else "finished"] += 1
        stats = job.run()
        got = output_rows(job.out)
        missing, extra = expected - got, got - expected
        assert not missing and not extra, (
            f"trial {trial}: {sum(missing.values())} rows missing, {sum(extra.values())} "
            f"written twice; the resume reported {stats.get('resume')}"
        )
        job.reset()
    assert outcomes["killed"] >= 12, outcomes


def test_a_resume_loads_no_id_and_drops_done_rows_by_position(tmp_path):
    """An interrupted run leaves row groups half done; the resume skips the rows their
    commits hold by position (``rows_skipped_by_position``), probes no id, and the output
    holds each input row once, though every id appears three times."""
    src = tmp_path / "in"
    src.mkdir()
    table = pa.table({"id": [i % 1000 for i in range(3000)], "v": list(range(3000))})
    pq.write_table(table, src / "a.parquet", row_group_size=3000)  # one row group
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    fail_late = failing_after(2000, pause=0.1)

    checkpoint = forebay.Checkpoint("id", str(ckpt))
    with pytest.raises(RuntimeError, match="interrupted"):
        # Source batches of 250 rows: each a task of its own, written once it is mapped.
        forebay.read_parquet(str(src), batch_size=250).map_batches(
            fail_late, batch_size=250, concurrency=1
        ).write_parquet(str(out), rows_per_file=500, concurrency=1, checkpoint=checkpoint)
    written = pq.read_table(out).num_rows
    assert 0 < written <= 2000
    stats = (
        forebay.read_parquet(str(src), batch_size=250)
        .map_batches(lambda b: b, batch_size=250)
        .write_parquet(str(out), rows_per_file=500, concurrency=1, checkpoint=checkpoint)
    )
    resume = stats["resume"]
    assert resume["rows_skipped_by_position"] == written
    assert resume["rows_skipped_by_id"] == 0
    assert resume["ids_done_before"] == written
    values = pq.read_table(out).column("v").to_pylist()
    assert sorted(values) == list(range(3000))


def test_a_checkpoint_of_ids_only_still_drops_rows_by_id(tmp_path):
    """Ids written without positions (Ray Data's layout: a directory of id files) are
    still done: their rows are dropped by id, duplicates included."""
    src = tmp_path / "in"
    src.mkdir()
    table = pa.table({"id": [i % 100 for i in range(400)], "v": list(range(400))})
    pq.write_table(table, src / "a.parquet")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    pq.write_table(pa.table({"id": list(range(50))}), ckpt / "done.parquet")
    stats = forebay.read_parquet(str(src)).write_parquet(
        str(tmp_path / "out"), checkpoint=forebay.Checkpoint("id", str(ckpt))
    )
    assert stats["rows"] == 200 and stats["resume"]["rows_skipped_by_id"] == 200
    assert stats["resume"]["rows_skipped_by_position"] == 0


def test_a_limit_after_a_map_in_a_checkpointed_write_is_refused_before_anything_is_touched(
    tmp_path,
):
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"id": list(range(100))}), src / "a.parquet")
    ckpt = tmp_path / "ckpt"
    ds = forebay.read_parquet(str(src)).map_batches(lambda b: b).limit(10)
    with pytest.raises(ValueError, match=r"limit\(\) before map_batches"):
        ds.write_parquet(str(tmp_path / "out"), checkpoint=forebay.Checkpoint("id", str(ckpt)))
    assert not ckpt.exists() and not (tmp_path / "out").exists()
    # Before the map, a limit is exact: the first 10 rows, once.
    stats = (
        forebay.read_parquet(str(src))
        .limit(10)
        .map_batches(lambda b: b)
        .write_parquet(str(tmp_path / "out"), checkpoint=forebay.Checkpoint("id", str(ckpt)))
    )
    assert stats["rows"] == 10


LIMITED_JOB = textwrap.dedent(
    """
    import json, sys, time
    import forebay

    def slow(batch):
        time.sleep(0.02)  # a model's work: the writer commits meanwhile
        return batch

    if __name__ == "__main__":
        config = json.loads(sys.argv[1])
        forebay.configure(progress=False)
        stats = (
            forebay.read_parquet(config["input"], batch_size=50)
            .limit(config["limit"])
            .map_batches(slow, concurrency=1)
            .write_parquet(
                config["output"],
                rows_per_file=100,
                concurrency=1,
                checkpoint=forebay.Checkpoint("id", config["checkpoint"]),
            )
        )
        print(json.dumps(stats), flush=True)
    """
)


def limited_run(tmp_path: Path, limit: int, env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "limited.py"
    script.write_text(LIMITED_JOB)
    config = {
        "input": str(tmp_path / "in"),
        "output": str(tmp_path / "out"),
        "checkpoint": str(tmp_path / "ckpt"),
        "limit": limit,
    }
    return subprocess.run(
        [sys.executable, str(script), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


def written_ids(out: Path) -> list[int]:
    return [i for p in out.glob("*.parquet") for i in pq.read_table(p)["id"].to_pylist()]


@pytest.mark.parametrize("point", ["staged:2", "recorded:2", "published:3"])
def test_a_limited_job_killed_and_run_again_writes_its_limit_once_in_total(tmp_path, point):
    """``limit(n)`` in a checkpointed job is n rows over all its runs: killed after some
    commits (before a record, after one, after publishing), the rerun writes only what is
    left, and a rerun of the finished job writes nothing."""
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"id": list(range(1000))}), src / "a.parquet", row_group_size=100)
    killed = limited_run(tmp_path, 430, {"FOREBAY_CRASH_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = written_ids(tmp_path / "out")
    assert 0 < len(before) < 430
    resumed = limited_run(tmp_path, 430)
    assert resumed.returncode == 0, resumed.stderr
    ids = written_ids(tmp_path / "out")
    assert len(ids) == 430 and len(set(ids)) == 430 and set(before) <= set(ids)
    # (A commit recorded but not published before the kill is rolled forward, not redone.)
    stats = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert stats["rows"] in (430 - len(before), 430 - len(before) - 100)
    # The job is done: a rerun writes nothing and says why.
    again = limited_run(tmp_path, 430)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["rows"] == 0
    assert "limited to 430" in again.stderr
    assert sorted(written_ids(tmp_path / "out")) == sorted(ids)
    # A larger limit continues the job: 70 more rows, none written before.
    more = limited_run(tmp_path, 500)
    assert more.returncode == 0, more.stderr
    final = written_ids(tmp_path / "out")
    assert len(final) == 500 and len(set(final)) == 500, more.stderr


def test_a_limited_run_marks_no_input_finished_that_it_cut(tmp_path):
    """A limit stops mid-row-group, with the rest of the cut batch and batches already read
    never written: those row groups and files must not be recorded as finished (a later
    run then skipped them, their unwritten rows lost). A slow first call lets the scan run
    ahead of the writer, as a model's warm-up does."""
    src = tmp_path / "in"
    src.mkdir()
    for f in range(2):
        table = pa.table({"id": list(range(f * 500, (f + 1) * 500))})
        pq.write_table(table, src / f"{f}.parquet", row_group_size=100)

    for round_ in range(4):
        out, ckpt = tmp_path / f"out{round_}", tmp_path / f"ckpt{round_}"
        calls = 0

        def warming_up(batch):
            nonlocal calls
            calls += 1
            if calls == 1:
                time.sleep(0.2)
            return batch

        for limit in (230 + 100 * round_, None):
            ds = forebay.read_parquet(str(src), batch_size=50)
            if limit is not None:
                ds = ds.limit(limit)
            ds.map_batches(warming_up, concurrency=1).write_parquet(
                str(out), rows_per_file=100, checkpoint=forebay.Checkpoint("id", str(ckpt))
            )
        ids = written_ids(out)
        assert sorted(ids) == list(range(1000)), (round_, len(ids), len(set(ids)))


def test_a_limited_job_under_a_new_scan_filter_counts_its_rows_afresh(tmp_path, caplog):
    """Rows counted under one scan filter are another job's: a checkpoint's limit under a
    new filter (on_changed_input='reprocess') starts from 0."""
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"id": list(range(1000))}), src / "a.parquet", row_group_size=100)

    def run(limit: int, filter=None) -> dict:
        return (
            forebay.read_parquet(str(src), filter=filter)
            .limit(limit)
            .write_parquet(
                str(tmp_path / "out"),
                checkpoint=forebay.Checkpoint("id", str(tmp_path / "ckpt")),
                on_changed_input="reprocess",
            )
        )

    assert run(100)["rows"] == 100
    with caplog.at_level(logging.WARNING, logger="forebay"):
        assert run(100)["rows"] == 0
    assert any("limited to 100" in r.getMessage() for r in caplog.records), caplog.text
    stats = run(150)
    assert stats["rows"] == 50 and stats["resume"]["input_rows_done_before"] == 100
    # Under a new filter: 100 rows of the rows it keeps, none written before.
    assert run(100, filter=[("id", ">=", 500)])["rows"] == 100
    assert run(100, filter=[("id", ">=", 500)])["rows"] == 0
    ids = written_ids(tmp_path / "out")
    assert len(ids) == 250 and len(set(ids)) == 250


# ---------------------------------------------------------------- no id column


def small_input(directory: Path, rows: int = 1000) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table({"v": list(range(rows)), "text": [f"t{i}" for i in range(rows)]})
    pq.write_table(table, directory / "a.parquet", row_group_size=300)


def test_a_checkpoint_without_an_id_column_writes_no_id_and_resumes_by_position(tmp_path):
    small_input(tmp_path / "in")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    fail_late = failing_after(600, pause=0.05)

    def run(fn):
        return (
            forebay.read_parquet(str(tmp_path / "in"), batch_size=100)
            .map_batches(fn, batch_size=100, concurrency=1)
            .write_parquet(
                str(out),
                rows_per_file=200,
                concurrency=1,
                checkpoint=forebay.Checkpoint(None, ckpt),
            )
        )

    with pytest.raises(RuntimeError, match="interrupted"):
        run(fail_late)
    written = pq.read_table(out).num_rows
    assert 0 < written <= 600
    stats = run(lambda b: b)
    resume = stats["resume"]
    # Finished row groups (300 rows) are skipped unread, the rest of the done rows dropped
    # by position.
    assert resume["rows_skipped_by_position"] + 300 * resume["row_groups_skipped"] == written
    assert sorted(pq.read_table(out).column("v").to_pylist()) == list(range(1000))
    names = sorted(p.name for p in ckpt.iterdir())
    assert "ids" not in names and "_forebay_checkpoint" not in names, names
    assert "_forebay_by_position" in names
    assert run(lambda b: b)["rows"] == 0


def test_a_checkpoint_by_position_and_one_with_ids_do_not_mix(tmp_path):
    small_input(tmp_path / "in")

    def run(checkpoint: forebay.Checkpoint, out: str = "out") -> dict:
        return forebay.read_parquet(str(tmp_path / "in")).write_parquet(
            str(tmp_path / out), checkpoint=checkpoint
        )

    by_position = tmp_path / "by-position"
    run(forebay.Checkpoint(None, by_position))
    with pytest.raises(forebay.CheckpointError, match="written without an id column"):
        run(forebay.Checkpoint("v", by_position))
    with_ids = tmp_path / "with-ids"
    run(forebay.Checkpoint("v", with_ids), out="out2")
    with pytest.raises(forebay.CheckpointError, match="cannot be resumed without an id column"):
        run(forebay.Checkpoint(None, with_ids), out="out2")


def test_a_checkpoint_by_position_refuses_to_read_changed_input_again(tmp_path):
    small_input(tmp_path / "in")
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    forebay.read_parquet(str(tmp_path / "in")).write_parquet(
        str(out), checkpoint=forebay.Checkpoint(None, ckpt)
    )
    time.sleep(0.02)
    small_input(tmp_path / "in", rows=1200)  # rewritten: its positions name other rows
    with pytest.raises(forebay.CheckpointError, match="needs ids to tell their done rows apart"):
        forebay.read_parquet(str(tmp_path / "in")).write_parquet(
            str(out), checkpoint=forebay.Checkpoint(None, ckpt), on_changed_input="reprocess"
        )
    with pytest.raises(forebay.CheckpointError, match="changed since the checkpoint"):
        forebay.read_parquet(str(tmp_path / "in")).write_parquet(
            str(out), checkpoint=forebay.Checkpoint(None, ckpt)
        )
    assert pq.read_table(out).num_rows == 1000, "nothing written again"


def test_checkpoint_id_column_values():
    assert forebay.Checkpoint(None, "x").id_column is None
    with pytest.raises(ValueError, match="None to key rows by input position"):
        forebay.Checkpoint("", "x")


def test_rows_a_map_turned_into_nothing_are_not_mapped_again_on_a_resume(tmp_path):
    """A filter that drops the first half of one row group: once a later commit has
    recorded those rows as done, a resume does not send them to the function again (a
    model is not paid twice for rows that had no output)."""
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(
        pa.table({"id": list(range(3000)), "v": list(range(3000))}),
        src / "a.parquet",
        row_group_size=3000,
    )
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    seen: list[int] = []

    def keep_second_half(batch, fail_after=None):
        seen.extend(batch["v"].to_pylist())
        if fail_after is not None and len(seen) > fail_after:
            raise RuntimeError("interrupted")
        time.sleep(0.02)  # the writer commits files before the failure
        return batch.filter(pa.compute.greater_equal(batch["v"], 1500))

    def run(fail_after=None):
        return (
            forebay.read_parquet(str(src), batch_size=100)
            .map_batches(lambda b: keep_second_half(b, fail_after), batch_size=100, concurrency=1)
            .write_parquet(
                str(out),
                rows_per_file=200,
                concurrency=1,
                checkpoint=forebay.Checkpoint("id", str(ckpt)),
            )
        )

    with pytest.raises(RuntimeError, match="interrupted"):
        run(fail_after=2000)
    assert pq.read_table(out).num_rows > 0
    seen.clear()
    run()
    assert min(seen) >= 1500, f"rows {min(seen)}.. were mapped again"
    assert sorted(pq.read_table(out).column("v").to_pylist()) == list(range(1500, 3000))
