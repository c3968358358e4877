"""Killed runs leave no shared memory behind (issue 34): start a `compute="processes"` job,
wait for its object store in /dev/shm, kill it (SIGKILL and SIGTERM alternately), N times;
then start one more run and count the stores of the dead runs still there.

    python benches/python/kill_stores.py --kills 40

A SIGKILLed run cannot remove its own store (the next run does); a SIGTERMed one stops as
Ctrl-C stops it and removes it.
"""

from __future__ import annotations

import argparse
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

JOB = textwrap.dedent(
    """
    import sys, time, forebay

    def slow(batch):
        time.sleep(0.05)
        return batch

    forebay.configure(progress=False)
    ds = forebay.read_parquet(sys.argv[1], batch_size=100).map_batches(
        slow, compute="processes", concurrency=2
    )
    print("started", flush=True)
    ds.write_parquet(sys.argv[2], checkpoint=forebay.Checkpoint("id", sys.argv[3]))
    """
)


def stores_of(pid: int) -> list[Path]:
    return list(Path("/dev/shm").glob(f"forebay-store-{pid}-*"))


def start(root: Path) -> subprocess.Popen:
    for name in ("out", "ckpt"):
        shutil.rmtree(root / name, ignore_errors=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(root / "job.py"),
            str(root / "data"),
            str(root / "out"),
            str(root / "ckpt"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 30
    while not stores_of(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "job.py").write_text(JOB)
        (root / "data").mkdir()
        for part in range(3):
            ids = np.arange(part * 1000, (part + 1) * 1000)
            table = pa.table({"id": ids, "text": [f"row {i}" for i in ids]})
            pq.write_table(table, root / "data" / f"part-{part}.parquet", row_group_size=250)
        killed: list[tuple[int, str, int | None, bool]] = []
        for i in range(args.kills):
            sig = signal.SIGKILL if i % 2 == 0 else signal.SIGTERM
            proc = start(root)
            time.sleep(0.2)
            proc.send_signal(sig)
            proc.communicate(timeout=60)
            killed.append((proc.pid, sig.name, proc.returncode, bool(stores_of(proc.pid))))
        for name in ("SIGKILL", "SIGTERM"):
            runs = [k for k in killed if k[1] == name]
            left = sum(1 for k in runs if k[3])
            codes = sorted({k[2] for k in runs if k[2] is not None})
            print(
                f"{name}: {len(runs)} runs, exit codes {codes}, stores left after the kill: {left}"
            )
        survivor = start(root)
        remaining = [k for k in killed if stores_of(k[0])]
        print(f"stores of dead runs left once the next run started: {len(remaining)}")
        _, err = survivor.communicate(timeout=120)
        print(f"next run exit code: {survivor.returncode}")
        if survivor.returncode != 0 or remaining:
            sys.exit(err or "stores of dead runs were left behind")


if __name__ == "__main__":
    main()
