"""What a kill half way keeps on Ray (issue 42): the issue's job (10 files, 100k rows) read
with forebay.ray.read_parquet and written with forebay.ray.write_parquet at default settings,
a "model" step of 0.1 ms a row; the driver is SIGKILLed once the model has seen half of the
rows, then the committed rows are counted.

    python benches/python/ray_kill_half.py --cpus 2 4 --rounds 5

Prints, per round, the rows the model had seen, the rows committed, and the read tasks and
commits of a full run (the same job, not killed).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

FILES, ROWS_PER_FILE = 10, 10_000
ROWS = FILES * ROWS_PER_FILE

DRIVER = textwrap.dedent(
    """
    import json, os, sys, time, ray, forebay, forebay.ray as fray, pyarrow.compute as pc
    from forebay.ray._write import _forebay_source
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    inputs, out, ckpt, progress = sys.argv[2:6]
    def infer(batch):
        time.sleep(batch.num_rows * 1e-4)
        name = os.path.join(progress, f"{os.getpid()}-{time.monotonic_ns()}")
        with open(name, "w") as f:
            f.write(str(batch.num_rows))
        return batch.append_column("double", pc.multiply(batch.column("value"), 2))
    ds = fray.read_parquet(inputs)
    tasks = len(_forebay_source(ds).get_read_tasks(1))
    result = fray.write_parquet(ds.map_batches(infer, batch_format="pyarrow"), out,
                                checkpoint=forebay.Checkpoint("id", ckpt))
    print(json.dumps({"tasks": tasks, "commits": result["files"]}))
    """
)


def make_inputs(root: Path) -> None:
    root.mkdir()
    for f in range(FILES):
        ids = np.arange(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        table = pa.table({"id": ids, "value": ids, "text": [f"row {i}" for i in ids]})
        pq.write_table(table, root / f"part-{f}.parquet")


def one_round(address: str, inputs: Path, work: Path, kill: bool) -> dict:
    out, ckpt, progress = work / "out", work / "ckpt", work / "progress"
    progress.mkdir(parents=True)
    args = [sys.executable, "-c", DRIVER, address, str(inputs), str(out), str(ckpt)]
    driver = subprocess.Popen([*args, str(progress)], stdout=subprocess.PIPE, text=True)
    seen = 0
    while kill and seen < ROWS // 2 and driver.poll() is None:
        time.sleep(0.01)
        seen = sum(int(p.read_text() or 0) for p in progress.iterdir())
    if kill:
        driver.send_signal(signal.SIGKILL)
    stdout, _ = driver.communicate()
    committed = sum(pq.ParquetFile(p).metadata.num_rows for p in out.glob("*.parquet"))
    report = json.loads(stdout.strip().splitlines()[-1]) if not kill else {}
    return {"seen": seen, "committed": committed, **report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_inputs(root / "in")
        kept: dict[int, list[float]] = {c: [] for c in args.cpus}
        for cpus in args.cpus:  # one cluster at a time
            # Started here: drivers are children and inherit the cluster's address and token.
            ray.init(num_cpus=cpus, include_dashboard=False, logging_level="ERROR")
            address = ray.get_runtime_context().gcs_address
            try:
                full = one_round(address, root / "in", root / f"full-{cpus}", kill=False)
                print(
                    f"{cpus} CPUs, full run: {full['tasks']} read tasks, {full['commits']} commits"
                )
                for r in range(args.rounds):
                    got = one_round(address, root / "in", root / f"r{r}-{cpus}", kill=True)
                    kept[cpus].append(got["committed"] / ROWS)
                    print(
                        f"round {r}, {cpus} CPUs: killed with {got['seen']} rows seen by the "
                        f"model, {got['committed']} committed"
                    )
            finally:
                ray.shutdown()
        for cpus, fractions in kept.items():
            print(
                f"{cpus} CPUs: committed at the kill, median {statistics.median(fractions):.1%}, "
                f"min {min(fractions):.1%} ({len(fractions)} rounds)"
            )


if __name__ == "__main__":
    main()
