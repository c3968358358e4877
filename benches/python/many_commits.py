"""A job that commits 10,000 times, killed at 99 %, then resumed: how many commit records the
resume reads, and how long it takes, with the run folding its records every 256 commits
(the default) against never folding during the run (what forebay did before session 33:
records were folded only by the next run's recovery).

    python benches/python/many_commits.py --commits 10000 [--s3]

The job: 1 M rows (int64 id, ~20 B payload) in 10 files of 10 row groups,
``read_parquet(batch_size=rows/commits).map_batches(f).write_parquet(rows_per_file=...)``
with a checkpoint: one commit per batch. The driver is SIGKILLed once 99 % of the data
files are published. With ``--s3`` the output and checkpoint live on a moto server on
127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS, FILES = 1_000_000, 10

JOB = textwrap.dedent(
    """
    import json, sys, time
    import forebay

    def add(batch):
        return batch

    config = json.loads(sys.argv[1])
    forebay.configure(progress=False)
    options = config.get("storage_options")
    started = time.monotonic()
    stats = (
        forebay.read_parquet(config["input"], batch_size=config["batch"])
        .map_batches(add)
        .write_parquet(
            config["output"], rows_per_file=config["batch"], storage_options=options,
            checkpoint=forebay.Checkpoint("id", config["checkpoint"], storage_options=options),
        )
    )
    print(json.dumps({"seconds": time.monotonic() - started, "rows": stats["rows"],
                      "resume": stats["resume"]}), flush=True)
    """
)


def make_input(root: Path) -> None:
    root.mkdir()
    per_file = ROWS // FILES
    for f in range(FILES):
        ids = np.arange(f * per_file, (f + 1) * per_file, dtype=np.int64)
        table = pa.table({"id": ids, "payload": pa.array(ids.astype(str)).cast(pa.string())})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=per_file // 10)


class Storage:
    """Where output and checkpoint live, and how to count what is there."""

    def __init__(self, root: Path, s3: bool):
        self.root, self.s3, self.server = root, s3, None
        if s3:
            sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
            from conftest import S3_CREDENTIALS, moto_s3  # the tests' moto server

            self.moto = moto_s3(Path(tempfile.gettempdir()) / "many_commits_moto.log")
            self.client, self.endpoint = self.moto.__enter__()
            self.options = {**S3_CREDENTIALS, "aws_endpoint": self.endpoint}

    def paths(self, name: str) -> tuple[str, str]:
        if self.s3:
            self.client.create_bucket(Bucket=name)
            return f"s3://{name}/out", f"s3://{name}/ckpt"
        return str(self.root / name / "out"), str(self.root / name / "ckpt")

    def count(self, uri: str, suffix: str) -> int:
        if self.s3:
            bucket, prefix = uri.removeprefix("s3://").split("/", 1)
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix
            )
            return sum(
                o["Key"].endswith(suffix) and "_forebay_staging" not in o["Key"]
                for page in pages
                for o in page.get("Contents", [])
            )
        path = Path(uri)
        return sum(1 for p in path.glob(f"*{suffix}")) if path.exists() else 0


def one(storage: Storage, inputs: Path, name: str, commits: int, fold_every: int) -> dict:
    out, ckpt = storage.paths(name)
    config = {"input": str(inputs), "output": out, "checkpoint": ckpt, "batch": ROWS // commits}
    if storage.s3:
        config["storage_options"] = storage.options
    env = {**os.environ, "FOREBAY_FOLD_EVERY": str(fold_every)}
    script = [sys.executable, "-c", JOB, json.dumps(config)]
    run = subprocess.Popen(script, env=env, stdout=subprocess.PIPE, text=True)
    while storage.count(out, ".parquet") < commits * 99 // 100:
        assert run.poll() is None, "the job ended before the kill"
        time.sleep(0.2 if storage.s3 else 0.05)
    run.send_signal(signal.SIGKILL)
    run.wait()
    left = storage.count(ckpt + "/_forebay_commits", ".json")
    resumed = subprocess.run(script, env=env, stdout=subprocess.PIPE, text=True, check=True)
    report = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert storage.count(out, ".parquet") >= commits * 99 // 100
    return {"records left": left, **report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--s3", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp)
        make_input(root / "in")
        storage = Storage(root, args.s3)
        for label, fold_every in (("folding every 256", 256), ("no fold in the run", 10**9)):
            got = one(storage, root / "in", f"b{fold_every}", args.commits, fold_every)
            r = got["resume"]
            print(
                f"{label}: {got['records left']} records left by the kill; the resume rolled "
                f"forward {r['commits_recovered']}, wrote {got['rows']} rows in "
                f"{got['seconds']:.2f} s"
            )
        if args.s3:
            storage.moto.__exit__(None, None, None)
        shutil.rmtree(root / "in", ignore_errors=True)


if __name__ == "__main__":
    main()
