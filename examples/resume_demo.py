"""The job forebay exists for, interrupted and resumed.

    python examples/resume_demo.py [--rows 1000000] [--dir DIR]

1. Generates a dataset: Parquet files of documents, each with a string id.
2. Runs a batch "inference" job on it: map_batches computes a 64-dimensional embedding of
   each document's text with numpy (in 2 worker processes), write_parquet writes the
   embeddings with a checkpoint.
3. Kills the job with SIGKILL half way through (as an OOM killer or a preempted node would).
4. Runs the same job again: it recovers the checkpoint, skips the input it had finished
   without reading it, and writes the rest.
5. Verifies that every input id is in the output exactly once, and prints the times, what
   the resume skipped, and the memory used.
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
import threading
import time
from pathlib import Path
from typing import Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

FILES = 16
DIM = 64


class Embed:
    """A stand-in for a model: byte histograms of each text, projected to DIM dimensions
    and normalised (vectorised numpy; constructed once per worker, like loading weights)."""

    def __init__(self, seed: int = 0):
        self.projection = np.random.default_rng(seed).standard_normal((256, DIM)).astype(np.float32)

    def __call__(self, batch: pa.Table) -> pa.Table:
        text = batch.column("text").combine_chunks().cast(pa.large_string())
        offsets = np.frombuffer(text.buffers()[1], dtype=np.int64)[
            text.offset : text.offset + len(text) + 1
        ]
        data = np.frombuffer(text.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
        rows = np.repeat(np.arange(len(text)), np.diff(offsets))
        counts = np.zeros((len(text), 256), dtype=np.float32)
        np.add.at(counts, (rows, data), 1.0)
        vectors = counts @ self.projection
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True) + 1e-9
        flat = pa.array(vectors.reshape(-1))
        return pa.table(
            {"id": batch.column("id"), "embedding": pa.FixedSizeListArray.from_arrays(flat, DIM)}
        )


def job(data: Path, out: Path, checkpoint: Path) -> None:
    """The user's script: read, embed, write with a checkpoint."""
    import forebay

    forebay.configure(progress=False)
    stats = (
        forebay.read_parquet(str(data), columns=["id", "text"])
        .map_batches(Embed, batch_size=10_000, compute="processes", concurrency=2)
        .write_parquet(
            str(out), rows_per_file=50_000, checkpoint=forebay.Checkpoint("id", str(checkpoint))
        )
    )
    print(json.dumps(stats), flush=True)


def generate(data: Path, rows: int) -> None:
    data.mkdir(parents=True)
    rng = np.random.default_rng(1)
    words = np.array(
        [
            "the",
            "a",
            "data",
            "plane",
            "batch",
            "inference",
            "resume",
            "exactly",
            "once",
            "parquet",
            "arrow",
        ]
    )
    per_file = rows // FILES
    for f in range(FILES):
        ids = np.arange(f * per_file, (f + 1) * per_file)
        picks = rng.integers(0, len(words), size=(per_file, 12))
        text = pc.binary_join_element_wise(*[pa.array(words[picks[:, i]]) for i in range(12)], " ")
        table = pa.table({"id": pa.array([f"doc-{i:08d}" for i in ids]), "text": text})
        pq.write_table(table, data / f"part-{f:03d}.parquet", row_group_size=25_000)


def used_memory() -> int:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"] - per_cpu_free_pages()


def per_cpu_free_pages() -> int:
    """Free pages parked on the kernel's per-CPU lists: MemAvailable leaves them out, and
    since Linux 6.7 those lists can hold hundreds of MB for tens of seconds after a process
    frees memory (benches/python/measure.py explains)."""
    pages = 0
    with open("/proc/zoneinfo") as f:
        for line in f:
            field = line.split()
            if len(field) == 2 and field[0] == "count:":
                pages += int(field[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """System-wide used memory's rise over a run (worker processes count)."""

    def __enter__(self) -> Self:
        self.base = self.peak = used_memory()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, used_memory())
            time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    @property
    def rise_mb(self) -> float:
        return (self.peak - self.base) / 1e6


def start_job(data: Path, out: Path, checkpoint: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--job", str(data), str(out), str(checkpoint)],
        stdout=subprocess.PIPE,
        text=True,
    )


def committed_rows(out: Path) -> int:
    files = [p for p in out.glob("part-*.parquet")] if out.exists() else []
    return sum(pq.ParquetFile(p).metadata.num_rows for p in files)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--dir",
        default=None,
        help="work directory, emptied first and kept afterwards (default: a temporary one, "
        "removed after a successful run)",
    )
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="forebay-demo-"))
    shutil.rmtree(root, ignore_errors=True)
    data, out, checkpoint = root / "documents", root / "embeddings", root / "checkpoint"

    started = time.perf_counter()
    generate(data, args.rows)
    input_bytes = sum(p.stat().st_size for p in data.glob("*.parquet"))
    total = (args.rows // FILES) * FILES
    print(
        f"generated {total:,} documents in {FILES} files ({input_bytes / 1e6:.1f} MB) "
        f"in {time.perf_counter() - started:.1f} s  [{root}]"
    )

    # Run 1: killed half way.
    started = time.perf_counter()
    victim = start_job(data, out, checkpoint)
    while committed_rows(out) < total // 2 and victim.poll() is None:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_after = time.perf_counter() - started
    done = committed_rows(out)
    print(f"run 1: SIGKILLed after {killed_after:.1f} s, {done:,} rows committed")

    # Run 2: the same script again.
    started = time.perf_counter()
    with PeakMemory() as memory:
        resumed = start_job(data, out, checkpoint)
        output, _ = resumed.communicate()
    took = time.perf_counter() - started
    if resumed.returncode != 0:
        sys.exit(f"the resumed run failed (exit {resumed.returncode}); work directory: {root}")
    stats = json.loads(output.strip().splitlines()[-1])
    resume = stats["resume"]
    print(
        f"run 2: resumed in {took:.1f} s: recovered {resume['commits_recovered']} commit(s), "
        f"{resume['ids_done_before']:,} rows were done; skipped {resume['files_skipped']} of "
        f"{FILES} files and {resume['row_groups_skipped']} row groups unread, read "
        f"{resume['bytes_read'] / 1e6:.1f} of {input_bytes / 1e6:.1f} MB; wrote "
        f"{stats['rows']:,} rows in {stats['files']} files; memory rise {memory.rise_mb:.0f} MB"
    )

    # Every id exactly once.
    ids = pq.read_table(out, columns=["id"]).column("id")
    unique = pc.count_distinct(ids).as_py()
    expected = {f"doc-{i:08d}" for i in range(total)}
    ok = len(ids) == unique == total and set(ids.to_pylist()) == expected
    print(
        f"verified: {len(ids):,} rows, {unique:,} distinct ids, every input id exactly once: {ok}"
    )
    if not ok:
        sys.exit(f"kept the work directory for inspection: {root}")
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--job":
        job(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        main()
