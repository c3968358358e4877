"""Issue 38's poison-row line at its own size: 5 rows of 100,000 raise in
``map_batches(on_error="dead_letter")`` of a checkpointed ``write_parquet``; each trial kills
the job (SIGKILL) three times at random moments, then runs it to the end, and checks that the
output holds the 99,995 other rows exactly once and the dead letters exactly the 5, with
their error type.

    python benches/python/poison_at_scale.py [--trials 10]

(The tests do the same with 24,000 rows, 4 trials; this is the size the issue names.)
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS, FILES = 100_000, 10
POISON = {17, 20_000, 20_001, 55_555, 99_999}


def poisoned(batch):
    """A model that raises on the poison ids (20 ms a batch, so that kills land mid-run)."""
    time.sleep(0.02)
    hit = POISON.intersection(batch["id"].tolist())
    if hit:
        raise ValueError(f"cannot embed {sorted(hit)}")
    return {"id": batch["id"], "y": batch["x"] + 1}


def job(inputs: str, out: str, checkpoint: str) -> None:
    import forebay

    forebay.configure(progress=False)
    print("started", flush=True)
    forebay.read_parquet(inputs).map_batches(
        poisoned, batch_format="numpy", batch_size=1_000, on_error="dead_letter"
    ).write_parquet(out, checkpoint=forebay.Checkpoint("id", checkpoint))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        job(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    rng = random.Random(38)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "in").mkdir()
        per_file = ROWS // FILES
        for f in range(FILES):
            ids = np.arange(f * per_file, (f + 1) * per_file)
            pq.write_table(
                pa.table({"id": ids, "x": ids * 2}),
                root / "in" / f"part-{f}.parquet",
                row_group_size=2_000,
            )
        command = [sys.executable, __file__, "--child"]
        command += [str(root / "in"), str(root / "out"), str(root / "checkpoint")]
        for trial in range(args.trials):
            shutil.rmtree(root / "out", ignore_errors=True)
            shutil.rmtree(root / "checkpoint", ignore_errors=True)
            kills = 0
            for _ in range(3):
                proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
                assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
                time.sleep(rng.uniform(0.2, 2.2))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    kills += 1
                proc.communicate()
            subprocess.run(command, check=True, capture_output=True)
            outputs = list((root / "out").glob("*.parquet"))  # data; dead letters below
            ids = pa.concat_tables(pq.read_table(f) for f in outputs)["id"].to_pylist()
            dead = pa.concat_tables(
                pq.read_table(f) for f in (root / "out" / "_dead_letter").rglob("*.parquet")
            )
            exact = (
                len(ids) == len(set(ids)) == ROWS - len(POISON)
                and set(ids) == set(range(ROWS)) - POISON
                and sorted(dead["id"].to_pylist()) == sorted(POISON)
                and set(dead["_error_type"].to_pylist()) == {"ValueError"}
            )
            print(
                f"trial {trial}: {kills} kills, {len(ids):,} rows ({len(set(ids)):,} distinct), "
                f"dead letters {sorted(dead['id'].to_pylist())}, exact {exact}",
                flush=True,
            )
            assert exact


if __name__ == "__main__":
    main()
