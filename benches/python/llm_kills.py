"""What kills cost a job that pays per call: an LLM-style job (read -> async ``map_batches``
calling a local OpenAI-compatible embeddings server with the real ``openai`` client ->
``write_parquet(checkpoint=...)``) is SIGKILLed ``--kills`` times at random moments and run
again until it finishes. Reported: the rows the server was asked for over the rows the job
needs (1.0: nothing paid twice), the rows lost per kill, and that every row is in the output
once.

The server (tests/python/openai_server.py) runs in this process, so it outlives the job's
processes and counts every request. Input: ``--rows`` rows in row groups of 10,000.
Variants, alternated within each round: ``interval=<s>`` (``Checkpoint(commit_interval=s)``)
and ``by-size`` (``commit_interval=None``: a commit only when a file reaches
``rows_per_file``, forebay's behaviour before commits by time).

    python benches/python/llm_kills.py [--rounds 3] [--kills 8] [--rows 40000]
        [--latency 0.2] [--interval 2] [--interval 30] [--read-batch-size 256]

Kill moments: uniform over the uninterrupted run's duration (measured first, per round),
from 1 s after the job's start; a run that finishes before its kill ends the series early.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from openai_server import ModelServer  # noqa: E402

JOB = """
import json, sys
import openai
import forebay

class Embed:
    def __init__(self, url):
        self.client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0)
    async def __call__(self, batch):
        r = await self.client.embeddings.create(model="m", input=batch["text"].to_pylist())
        return {"id": batch["id"], "dim0": [d.embedding[0] for d in r.data]}
    async def aclose(self):
        await self.client.close()

config = json.loads(sys.argv[1])
forebay.configure(progress=False)
forebay.read_parquet(config["input"], batch_size=config["read_batch_size"]).map_batches(
    Embed, fn_constructor_args=(config["url"],), batch_size=16, max_concurrency=32,
).write_parquet(
    config["output"],
    checkpoint=forebay.Checkpoint("id", config["checkpoint"],
                                  commit_interval=config["interval"]),
)
"""


def output_ids(out: Path) -> list[int]:
    files = [p for p in out.glob("*.parquet") if not p.name.startswith(("_", "."))]
    return [i for p in files for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()]


def start(config: dict, log: Path) -> subprocess.Popen:
    with log.open("w") as err:  # a file, not a pipe: a killed run's is never read
        return subprocess.Popen(
            [sys.executable, "-c", JOB, json.dumps(config)], stdout=subprocess.DEVNULL, stderr=err
        )


def series(
    work: Path,
    server: ModelServer,
    interval: float | None,
    read_batch_size: int,
    kills: int,
    duration: float,
    rng: random.Random,
) -> dict:
    """One job killed ``kills`` times (at most), then run to its end."""
    for name in ("out", "ckpt"):
        (work / name).mkdir(exist_ok=True)
    config = {
        "input": str(work / "in"),
        "output": str(work / "out" / str(interval)),
        "checkpoint": str(work / "ckpt" / str(interval)),
        "url": server.url,
        "interval": interval,
        "read_batch_size": read_batch_size,
    }
    log = work / "stderr.log"
    asked_before = sum(len(r.inputs) for r in server.log)
    killed = 0
    for _ in range(kills):
        job = start(config, log)
        moment = rng.uniform(1.0, duration)
        try:
            job.wait(moment)
            if job.returncode != 0:
                raise RuntimeError(f"a run failed:\n{log.read_text()}")
            break  # finished before its kill
        except subprocess.TimeoutExpired:
            os.kill(job.pid, signal.SIGKILL)
            job.wait()
            killed += 1
    else:
        job = start(config, log)
        if job.wait(3600) != 0:
            raise RuntimeError(f"the last run failed:\n{log.read_text()}")
    asked = sum(len(r.inputs) for r in server.log) - asked_before
    ids = output_ids(Path(config["output"]))
    return {"asked": asked, "killed": killed, "rows_out": len(ids), "distinct": len(set(ids))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--interval", type=float, action="append")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--read-batch-size",
        type=int,
        default=65_536,
        help="read_parquet's batch_size (default forebay's: a commit then holds whole row groups)",
    )
    args = parser.parse_args()
    variants: list[float | None] = [*(args.interval or [2.0]), None]
    rng = random.Random(args.seed)
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp, ModelServer(latency=args.latency) as server:
        inputs = Path(tmp) / "in"
        inputs.mkdir()
        table = pa.table(
            {"id": range(args.rows), "text": [f"document {i}" for i in range(args.rows)]}
        )
        pq.write_table(table, inputs / "a.parquet", row_group_size=10_000)
        for round_ in range(args.rounds):
            # The uninterrupted run's duration, for the kill moments.
            work = Path(tmp) / f"clean-{round_}"
            work.mkdir()
            (work / "in").symlink_to(inputs)
            started = time.perf_counter()
            series(work, server, 2.0, args.read_batch_size, 0, 0.0, rng)
            duration = time.perf_counter() - started
            print(f"round {round_}: an uninterrupted run takes {duration:.1f} s", flush=True)
            order = variants if round_ % 2 == 0 else variants[::-1]
            for interval in order:
                work = Path(tmp) / f"r{round_}-{interval}"
                work.mkdir()
                (work / "in").symlink_to(inputs)
                got = series(
                    work, server, interval, args.read_batch_size, args.kills, duration, rng
                )
                assert got["rows_out"] == got["distinct"] == args.rows, got
                name = "by-size" if interval is None else f"interval={interval:g}"
                results.setdefault(name, []).append(got)
                print(f"  {name}: {got}", flush=True)
    print(
        f"\n{args.rows} rows, {args.latency * 1000:.0f} ms a request, {args.kills} kills, "
        f"read batches of {args.read_batch_size}"
    )
    for name, runs in results.items():
        ratio = statistics.median(r["asked"] / args.rows for r in runs)
        lost = statistics.median(
            (r["asked"] - args.rows) / r["killed"] for r in runs if r["killed"]
        )
        killed = statistics.median(r["killed"] for r in runs)
        print(
            f"  {name:>14}: asked/needed {ratio:.3f} (runs {[round(r['asked'] / args.rows, 3) for r in runs]}), "
            f"rows lost a kill {lost:.0f}, kills {killed:g}; every row once"
        )


if __name__ == "__main__":
    main()
