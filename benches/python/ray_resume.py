"""What a resume of a 90 %-done job costs on Ray: by input position (no id loaded) against by
id (shard actors load every committed id, what forebay.ray did before session 33).

A job of FILES files of int64 ids and ~50 B payloads is written with
forebay.ray.write_parquet over its first 90 % of files (the state a preempted run leaves:
those files committed and recorded finished), then resumed over all files. Rounds alternate
the two ways to drop done rows on copies of that state; "by id" is forced the way a user
meets it, with a file of Ray Data's checkpoint layout (one id no input holds) beside
forebay's files. Per round: the resume's wall time and the rise of system-wide used memory
(Ray's worker and actor processes count).

    python benches/python/ray_resume.py --rows 10000000 --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
from measure import SystemMemorySampler

import forebay
import forebay.ray as fray

FILES = 20


def make_inputs(root: Path, rows: int) -> None:
    root.mkdir()
    per_file = rows // FILES
    for f in range(FILES):
        ids = np.arange(f * per_file, (f + 1) * per_file, dtype=np.int64)
        payload = pc.binary_join_element_wise(pa.array(ids.astype(str)), pa.scalar("x" * 40), "")
        pq.write_table(pa.table({"id": ids, "payload": payload}), root / f"part-{f:03d}.parquet")


def add_length(batch: pa.Table) -> pa.Table:
    return batch.append_column("length", pc.binary_length(batch.column("payload")))


def write(files: list[str], out: Path, ckpt: Path) -> dict:
    ds = fray.read_parquet(files).map_batches(add_length, batch_format="pyarrow")
    return fray.write_parquet(ds, out, checkpoint=forebay.Checkpoint("id", str(ckpt)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=4)
    args = parser.parse_args()
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp)
        make_inputs(root / "in", args.rows)
        files = sorted(str(p) for p in (root / "in").glob("*.parquet"))
        done = files[: FILES * 9 // 10]
        started = time.monotonic()
        first = write(done, root / "state" / "out", root / "state" / "ckpt")
        print(f"90 % state: {first['rows']} rows in {time.monotonic() - started:.1f} s")
        results: dict[str, list[tuple[float, float]]] = {"by position": [], "by id": []}
        for r in range(args.rounds):
            for mode in ("by position", "by id") if r % 2 == 0 else ("by id", "by position"):
                work = root / "work"
                shutil.rmtree(work, ignore_errors=True)
                shutil.copytree(root / "state", work)
                if mode == "by id":
                    pq.write_table(pa.table({"id": [-1]}), work / "ckpt" / "ray-ids.parquet")
                with SystemMemorySampler() as memory:
                    t0 = time.monotonic()
                    resumed = write(files, work / "out", work / "ckpt")
                    seconds = time.monotonic() - t0
                report = resumed["resume"]
                assert report["by_position"] == (mode == "by position"), report
                assert resumed["rows"] == args.rows - first["rows"], resumed["rows"]
                results[mode].append((seconds, memory.rise_mb))
                print(
                    f"round {r}, {mode}: {seconds:.2f} s, system memory rise "
                    f"{memory.rise_mb:.0f} MB, ids done {report['ids_done']}"
                )
        for mode, got in results.items():
            print(
                f"{mode}: median {statistics.median(s for s, _ in got):.2f} s, "
                f"memory rise median {statistics.median(m for _, m in got):.0f} MB "
                f"({len(got)} rounds)"
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
