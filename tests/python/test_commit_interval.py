"""Commits by time: with a checkpoint, a writer whose rows come slowly (a paid endpoint
answering) commits what it holds once ``Checkpoint.commit_interval`` has passed, so that a
kill loses at most about that much work, not a whole ``rows_per_file`` file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay


def published_ids(out: Path) -> list[int]:
    """The ids a reader of ``out`` sees (staging directories are hidden from readers)."""
    files = [p for p in out.glob("*.parquet") if not p.name.startswith(("_", "."))]
    return [i for p in files for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()]


@pytest.mark.parametrize("interval", [0.5, None])
def test_a_writer_waiting_for_rows_commits_what_it_has_when_its_interval_ends(tmp_path, interval):
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"id": list(range(400))}), src / "a.parquet", row_group_size=400)
    release = threading.Event()

    def model(batch: pa.Table) -> pa.Table:
        if batch.column("id")[0].as_py() >= 100:  # the endpoint stalls after 100 rows
            assert release.wait(60), "the test never released the model"
        return batch

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    ds = forebay.read_parquet(str(src), batch_size=50).map_batches(
        model, batch_size=50, concurrency=1
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            ds.write_parquet(
                str(out),
                checkpoint=forebay.Checkpoint("id", str(ckpt), commit_interval=interval),
            )
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    writer = threading.Thread(target=run)
    writer.start()
    try:
        deadline = time.monotonic() + (20 if interval else 3)
        while time.monotonic() < deadline and not published_ids(out):
            time.sleep(0.05)
        seen_while_stalled = sorted(published_ids(out))
    finally:
        release.set()
        writer.join(60)
    assert not writer.is_alive() and not errors, errors
    if interval is None:
        assert seen_while_stalled == []  # one file, committed when the input ends
    else:
        assert seen_while_stalled == list(range(100))
    assert sorted(published_ids(out)) == list(range(400))


JOB = textwrap.dedent(
    """
    import asyncio, json, os, sys
    import forebay

    async def model(batch):
        with open(sys.argv[2], "a") as log:  # what the endpoint was asked (and paid) for
            log.write("".join(f"{i}\\n" for i in batch["id"].to_pylist()))
        await asyncio.sleep(0.05)
        return batch

    if __name__ == "__main__":
        config = json.loads(sys.argv[1])
        forebay.configure(progress=False)
        # A commit holds what whole source batches became: batches of 100 rows, not the
        # default's whole row groups.
        forebay.read_parquet(config["input"], batch_size=100).map_batches(
            model, batch_size=20, max_concurrency=4
        ).write_parquet(
            config["output"],
            checkpoint=forebay.Checkpoint(
                "id", config["checkpoint"], commit_interval=config["interval"]
            ),
        )
    """
)


def requested(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


@pytest.mark.parametrize("interval", [0.5, None])
def test_a_killed_run_loses_at_most_its_last_interval_and_the_rerun_asks_for_the_rest(
    tmp_path, interval
):
    src = tmp_path / "in"
    src.mkdir()
    total = 10_000
    pq.write_table(pa.table({"id": list(range(total))}), src / "a.parquet", row_group_size=2000)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    config = json.dumps(
        {"input": str(src), "output": str(out), "checkpoint": str(ckpt), "interval": interval}
    )
    first_log, rerun_log = tmp_path / "first.log", tmp_path / "rerun.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen([sys.executable, str(job), config, str(first_log)], env=env)
    try:
        deadline = time.monotonic() + 120
        # Killed once it has been answered for 1,000 rows and a second more.
        while len(requested(first_log)) < 1000 and first.poll() is None:
            assert time.monotonic() < deadline, "the job never got going"
            time.sleep(0.02)
        time.sleep(1.0)
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.wait(30)
    assert first.returncode == -signal.SIGKILL, "the job finished before the kill: too fast"
    committed = published_ids(out)
    subprocess.run(
        [sys.executable, str(job), config, str(rerun_log)], env=env, check=True, timeout=300
    )
    assert sorted(published_ids(out)) == list(range(total))  # every row once
    # The rerun asks for exactly the rows no commit held.
    assert sorted(requested(rerun_log)) == sorted(set(range(total)) - set(committed))
    if interval is None:
        assert committed == []  # one file of up to 1,048,576 rows: nothing was committed
    else:
        # At most about the last interval's answers (and those in flight) were lost.
        assert len(committed) >= 1000 - 200, (len(committed), len(requested(first_log)))


def test_commit_interval_must_be_a_finite_number_of_seconds(tmp_path):
    with pytest.raises(ValueError, match="commit_interval must be more than 0"):
        forebay.Checkpoint("id", str(tmp_path), commit_interval=0)
    with pytest.raises(TypeError, match="commit_interval must be a number of seconds"):
        forebay.Checkpoint("id", str(tmp_path), commit_interval="30")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        forebay.Checkpoint("id", str(tmp_path), commit_interval=float("inf"))
    assert forebay.Checkpoint("id", str(tmp_path)).commit_interval == 30.0


def test_a_rerun_with_another_fingerprint_is_refused_naming_the_step(tmp_path):
    """A checkpoint knows the transform its rows came from: a rerun with another model is
    refused, not resumed into an output that would mix two models."""
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"id": list(range(100))}), src / "a.parquet")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def embed(batch: pa.Table) -> pa.Table:
        return batch

    def write(fingerprint: str | None) -> None:
        forebay.read_parquet(str(src)).map_batches(embed, fingerprint=fingerprint).write_parquet(
            str(out), checkpoint=forebay.Checkpoint("id", str(ckpt))
        )

    write("model-a")
    write("model-a")  # the same transform: resumes (here: finds the job done)
    for other in ("model-b", None):
        with pytest.raises(forebay.ForebayError) as caught:
            write(other)
        message = str(caught.value)
        assert "map step 0 (map_batches(embed))" in message, message
        assert '"model-a" when the checkpoint' in message, message
    assert sorted(published_ids(out)) == list(range(100))
    with pytest.raises(TypeError, match="fingerprint must be a non-empty str"):
        forebay.read_parquet(str(src)).map_batches(embed, fingerprint=3)  # type: ignore[arg-type]
