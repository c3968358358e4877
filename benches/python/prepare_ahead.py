"""How many times `map_batches` converts each batch to the function's format, and on which
thread: a function that releases the GIL should find every batch converted ahead, on the
worker's second thread, once (`python/src/lookahead.rs`).

    .venv/bin/python benches/python/prepare_ahead.py --sleep 0.002 --busy 4

prints, for each of `--runs` runs over 40 batches, the conversions counted and how many of
them ran on the worker thread itself (inline). `--busy N` keeps N other processes spinning,
as a loaded CI machine does.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import forebay
from forebay import _udf

ROWS, BATCH = 20_000, 500


def spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sleep", type=float, default=0.002, help="seconds the function sleeps")
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside the run")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp())
    pq.write_table(pa.table({"id": range(ROWS)}), data / "p.parquet", row_group_size=5_000)

    def wait(batch):
        time.sleep(args.sleep)
        return batch

    prepared: list[int] = []
    called: set[int] = set()
    prepare, run = _udf.Runner.prepare, _udf.Runner.run

    def counting_prepare(self, batch):
        prepared.append(threading.get_native_id())
        return prepare(self, batch)

    def counting_run(self, value):
        called.add(threading.get_native_id())
        return run(self, value)

    _udf.Runner.prepare = counting_prepare  # type: ignore[method-assign]
    _udf.Runner.run = counting_run  # type: ignore[method-assign]

    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    try:
        results = []
        for _ in range(args.runs):
            prepared.clear()
            called.clear()
            forebay.read_parquet(str(data), columns=["id"]).map_batches(
                wait, batch_size=BATCH, batch_format="pandas", concurrency=1
            ).to_arrow()
            inline = sum(1 for t in prepared if t in called)
            results.append((len(prepared), inline))
    finally:
        for p in spinners:
            p.terminate()
    print(f"{ROWS // BATCH} batches; (conversions, of them inline) per run: {results}")


if __name__ == "__main__":
    main()
