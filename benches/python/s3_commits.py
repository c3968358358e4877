"""A checkpointed write to an S3-compatible server: time and requests per commit.

    python benches/python/s3_commits.py [--rounds 3] [--builds SITE_A,SITE_B] [--latency 0.03]

Starts moto's S3 server on 127.0.0.1 (as the tests do), writes 4 local Parquet files of
50,000 rows (row groups of 10,000) and runs, in a fresh process per measurement,

    read_parquet(inputs).write_parquet("s3://.../out", rows_per_file=10_000,
                                       checkpoint=Checkpoint("id", "s3://.../ckpt"))

so every ~10,000 rows is one commit (16 id parts staged, a record, the parts and the data
file published). Prints seconds and the server's requests by method, counted from its log.
`--builds` alternates forebay builds (directories put first on PYTHONPATH, such as unzipped
wheels); by default the installed forebay runs. moto answers one request at a time, so
without latency this measures mostly how many requests a commit makes, not how well they
overlap; `--latency` puts the latency proxy (tests/python/latency_proxy.py, 200 MB/s a
connection) in front of it, where round trips made one after another show.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
from conftest import S3_CREDENTIALS, moto_s3
from latency_proxy import LatencyProxy

JOB = """
import json, sys, time, forebay
forebay.configure(progress=False)
inputs, bucket, run, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
t0 = time.perf_counter()
stats = forebay.read_parquet(inputs).write_parquet(
    f"s3://{bucket}/out-{run}", rows_per_file=10_000, storage_options=options,
    checkpoint=forebay.Checkpoint("id", f"s3://{bucket}/ckpt-{run}", storage_options=options),
)
print(json.dumps({"seconds": round(time.perf_counter() - t0, 3), "files": stats["files"]}))
"""


def requests_by_method(log_lines: list[str]) -> dict[str, int]:
    """Requests in moto's (werkzeug's) log lines, by HTTP method and status class."""
    counts: collections.Counter[str] = collections.Counter()
    for line in log_lines:
        parts = re.sub(r"\x1b\[[0-9;]*m", "", line).split('"')  # without terminal colours
        if len(parts) < 3 or " HTTP/1.1" not in parts[1]:
            continue
        method = parts[1].split()[0]
        status = parts[2].split()[0] if parts[2].split() else "?"
        counts[f"{method} {status[:1]}xx"] += 1
    return dict(sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--builds", default="", help="comma-separated PYTHONPATH entries")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds a round trip")
    args = parser.parse_args()
    builds = [b for b in args.builds.split(",") if b] or [""]

    tmp = Path(tempfile.mkdtemp(prefix="forebay-s3-commits-"))
    log_path = tmp / "moto.log"
    with contextlib.ExitStack() as stack:
        s3, endpoint = stack.enter_context(moto_s3(log_path))
        bucket = "bench-commits"
        s3.create_bucket(Bucket=bucket)
        inputs = tmp / "inputs"
        inputs.mkdir()
        for f in range(4):
            ids = np.arange(f * 50_000, (f + 1) * 50_000)
            table = pa.table({"id": [f"id-{i}" for i in ids], "value": ids})
            pq.write_table(table, inputs / f"part-{f}.parquet", row_group_size=10_000)
        if args.latency > 0:
            proxy = stack.enter_context(
                LatencyProxy(endpoint, latency=args.latency, bandwidth=200e6)
            )
            endpoint = proxy.endpoint
        options = json.dumps({**S3_CREDENTIALS, "aws_endpoint": endpoint})
        for round_ in range(args.rounds):
            for b, build in enumerate(builds):
                env = {**os.environ}
                if build:
                    env["PYTHONPATH"] = build
                seen = len(log_path.read_text().splitlines())
                out = subprocess.run(
                    [sys.executable, "-c", JOB, str(inputs), bucket, f"{round_}-{b}", options],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                result = json.loads(out.stdout)
                result["requests"] = requests_by_method(log_path.read_text().splitlines()[seen:])
                print(f"round {round_ + 1} {build or 'installed'}: {json.dumps(result)}")


if __name__ == "__main__":
    main()
