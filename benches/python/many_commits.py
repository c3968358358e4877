"""A job that commits 10,000 times, killed at 99 %, then resumed: how many commit records the
resume reads, and how long it takes, with the run folding its records every 256 commits
(the default) against never folding during the run (what forebay did before session 33:
records were folded only by the next run's recovery).

    python benches/python/many_commits.py --commits 10000 [--s3] [--modes fold,no-fold]

The job: 1 M rows (int64 id, ~20 B payload) in 10 files of 10 row groups,
``read_parquet(batch_size=rows/commits).map_batches(f).write_parquet(rows_per_file=...)``
with a checkpoint: one commit per batch. The driver is SIGKILLed right after its 99 %-th
commit is published (the protocol's fault hook, ``FOREBAY_CRASH_AT``). With ``--s3`` the
output and checkpoint live on a moto server on 127.0.0.1, and the requests the resume sends
to it are counted from the server's log: the objects it opens (GETs of a key) and lists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
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

            self.log = Path(tempfile.gettempdir()) / "many_commits_moto.log"
            self.moto = moto_s3(self.log)
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

    def log_offset(self) -> int:
        return self.log.stat().st_size if self.s3 else 0

    def requests_since(self, offset: int) -> dict:
        """The S3 requests the server logged since ``offset``, by kind."""
        if not self.s3:
            return {}
        with open(self.log, "rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()
        kinds: dict[str, int] = {}
        for line in (re.sub(r"\x1b\[[0-9;]*m", "", raw) for raw in lines):
            if '"' not in line:
                continue
            method, target = ([*line.split('"')[1].split(), "", ""])[:2]
            if method == "GET":
                kind = (
                    "LIST" if "list-type" in target or target.rstrip("/").count("/") < 2 else "GET"
                )
            else:
                kind = method
            kinds[kind] = kinds.get(kind, 0) + 1
        return kinds


def one(storage: Storage, inputs: Path, name: str, commits: int, fold_every: int) -> dict:
    out, ckpt = storage.paths(name)
    config = {"input": str(inputs), "output": out, "checkpoint": ckpt, "batch": ROWS // commits}
    if storage.s3:
        config["storage_options"] = storage.options
    env = {**os.environ, "FOREBAY_FOLD_EVERY": str(fold_every)}
    script = [sys.executable, "-c", JOB, json.dumps(config)]
    # The protocol's own fault hook SIGKILLs the run right after its 99 %-th commit is
    # published: exact, and no listing of 10,000 objects to poll (moto's server fails some
    # listings that run while objects are deleted).
    killed_at = commits * 99 // 100
    run = subprocess.run(
        script, env={**env, "FOREBAY_CRASH_AT": f"published:{killed_at}"}, stdout=subprocess.PIPE
    )
    assert run.returncode == -signal.SIGKILL, f"the run was not killed: {run.returncode}"
    left = storage.count(ckpt + "/_forebay_commits", ".json")
    offset = storage.log_offset()
    resumed = subprocess.run(script, env=env, stdout=subprocess.PIPE, text=True, check=True)
    requests = storage.requests_since(offset)
    report = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert storage.count(out, ".parquet") >= killed_at
    return {"records left": left, "requests": requests, **report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--s3", action="store_true")
    parser.add_argument("--modes", default="fold,no-fold", help="comma-separated subset")
    args = parser.parse_args()
    modes = {"fold": ("folding every 256", 256), "no-fold": ("no fold in the run", 10**9)}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp)
        make_input(root / "in")
        storage = Storage(root, args.s3)
        for label, fold_every in (modes[m] for m in args.modes.split(",")):
            got = one(storage, root / "in", f"b{fold_every}", args.commits, fold_every)
            r = got["resume"]
            print(
                f"{label}: {got['records left']} records left by the kill; the resume rolled "
                f"forward {r['commits_recovered']}, wrote {got['rows']} rows in "
                f"{got['seconds']:.2f} s"
                + (f"; its requests to the server: {got['requests']}" if args.s3 else "")
            )
        if args.s3:
            storage.moto.__exit__(None, None, None)
        shutil.rmtree(root / "in", ignore_errors=True)


if __name__ == "__main__":
    main()
