"""The engine's cost per call: a no-op function on 16-row batches (what a model-server
client sends), sync on 2 threads or async with 256 calls in flight.

    python benches/python/small_calls.py [--rows 1000000] [--mode sync|async] [--rounds 3]

Prints seconds and calls/s (median). Nothing but forebay runs: it is a ceiling for what an
endpoint job can do per core, and it is how the memory pool's quadratic in small slices was
found (BENCHMARKS.md, session 35).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import forebay


def noop(batch):
    return batch


async def async_noop(batch):
    await asyncio.sleep(0)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--mode", choices=["sync", "async"], default="async")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    forebay.configure(progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "docs.parquet"
        ids = np.arange(args.rows)
        pq.write_table(
            pa.table({"id": ids, "text": [f"document {i}" for i in ids]}),
            path,
            row_group_size=50_000,
        )
        times = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            ds = forebay.read_parquet(str(path))
            if args.mode == "async":
                ds = ds.map_batches(
                    async_noop, batch_format="numpy", batch_size=16, max_concurrency=256
                )
            else:
                ds = ds.map_batches(noop, batch_format="numpy", batch_size=16)
            n = sum(b.num_rows for b in ds.iter_batches(batch_size=10_000))
            assert n == args.rows
            times.append(time.perf_counter() - started)
        seconds = statistics.median(times)
        print(
            f"{args.mode}: {args.rows:,} rows in {seconds:.2f} s, {args.rows / 16 / seconds:,.0f} calls/s"
        )


if __name__ == "__main__":
    main()
