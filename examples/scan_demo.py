"""Main example (run by `make demo`): generate a sample dataset, stream it with column
pruning and a filter, and print throughput.

Until forebay-engine exists this is the reader on its own: 8 files x 1.5 M rows of an
orders-like table, read three ways.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import forebay

FILES = 8
ROWS_PER_FILE = 1_500_000


def generate(directory: str) -> None:
    rng = np.random.default_rng(0)
    for k in range(FILES):
        n = ROWS_PER_FILE
        ids = np.arange(k * n, (k + 1) * n, dtype=np.int64)
        table = pa.table(
            {
                "order_id": ids,
                "customer": rng.integers(0, 100_000, n),
                "quantity": rng.integers(1, 50, n).astype(np.int32),
                "price": rng.random(n) * 1000,
                "status": pa.array(
                    np.array(["open", "shipped", "returned"])[rng.integers(0, 3, n)]
                ),
                "comment": pa.array([f"comment {i % 5000}" for i in range(n)]),
                "day": pa.array(
                    np.datetime64("2024-01-01") + (ids // 50_000).astype("timedelta64[D]"),
                    pa.date32(),
                ),
            }
        )
        pq.write_table(table, os.path.join(directory, f"part-{k}.parquet"), row_group_size=250_000)


def timed(label: str, dataset: forebay.Dataset) -> None:
    start = time.perf_counter()
    rows = 0
    for batch in dataset:
        rows += batch.num_rows
    seconds = time.perf_counter() - start
    m = dataset.metrics()
    print(
        f"{label:<44} {rows:>11,} rows  {seconds:6.2f} s  {rows / seconds / 1e6:7.1f} M rows/s  "
        f"{m['data_bytes'] / 1e6:8.1f} MB read  row groups skipped {m['row_groups_pruned_by_statistics']}/{m['row_groups_total']}"
    )


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="forebay-demo-") as directory:
        print(f"generating {FILES} files x {ROWS_PER_FILE:,} rows in {directory} ...", flush=True)
        generate(directory)
        total = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
        print(f"dataset: {total / 1e6:.0f} MB on disk\n")
        timed("all 7 columns", forebay.read_parquet(directory))
        timed(
            "2 columns (order_id, price)",
            forebay.read_parquet(directory, columns=["order_id", "price"]),
        )
        timed(
            "2 columns where day >= 2024-07-01",
            forebay.read_parquet(
                directory,
                columns=["order_id", "price"],
                filter=[("day", ">=", __import__("datetime").date(2024, 7, 1))],
            ),
        )
        timed(
            "status as dictionary, status == 'returned'",
            forebay.read_parquet(
                directory,
                columns=["status", "quantity"],
                dictionary_columns=["status"],
                filter=[("status", "==", "returned")],
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
