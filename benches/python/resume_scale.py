"""Resume at scale (issue 37): what a resume costs at 50, 90 and 99 % done, on a large job.

    python benches/python/resume_scale.py --rows 200000000 --ids int
    python benches/python/resume_scale.py --rows 50000000 --ids string
    python benches/python/resume_scale.py --work-left 2000000 --ids int


The job: ``--rows`` rows in ``--files`` Parquet files (an int64 or string id and a 48-byte
incompressible payload; row groups of 1/8 of a file), generated with numpy and pyarrow and
deleted afterwards. ``forebay.read_parquet(in).map_batches(f).write_parquet(out,
checkpoint=forebay.Checkpoint("id", ckpt))`` with ``f`` a Python function returning its
batch (the shape of an inference job, without the model). A full run first, then for each
kill point a run SIGKILLed once that share of the rows is committed, then its resume.

With ``--work-left N``, each kill point gets a job of its own, sized so that N rows are left
after the kill: N / (1 - point) rows in files of ``--rows-per-file``. The resumes then do the
same work, and differ only in the ids done before them (N, 9 N, 99 N at 50, 90 and 99 %):
what their memory shows is what the done ids cost.

Reported per run, each in a fresh subprocess: wall time, every byte the process read
(``/proc/self/io`` rchar: input, checkpoint, everything), the rise of system-wide used
memory and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from measure import SystemMemorySampler, peak_rss_mb

#: Output files (and commits) of a full run: fine enough for a kill at 99 % to leave work.
OUTPUT_FILES = 1000


def generate(root: Path, rows: int, files: int, ids: str) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    per_file = rows // files
    rng = np.random.default_rng(37)
    for f in range(files):
        first = f * per_file
        id_values = np.arange(first, first + per_file, dtype=np.int64)
        id_array = pa.array(id_values) if ids == "int" else pa.array(id_values.astype(str))
        payload = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(48), per_file, [None, pa.py_buffer(rng.bytes(48 * per_file))]
        )
        pq.write_table(
            pa.table({"id": id_array, "payload": payload}),
            root / f"part-{f:05d}.parquet",
            row_group_size=per_file // 8,
        )


def identity(batch):
    return batch


def child_run(inputs: str, out: str, ckpt: str, rows_per_file: str) -> dict:
    import forebay

    forebay.configure(progress=False)
    rchar = process_bytes_read()
    with SystemMemorySampler() as memory:
        started = time.perf_counter()
        stats = (
            forebay.read_parquet(inputs)
            .map_batches(identity, batch_format="pyarrow")
            .write_parquet(
                out,
                rows_per_file=int(rows_per_file),
                checkpoint=forebay.Checkpoint("id", ckpt),
            )
        )
        seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "rows": stats["rows"],
        "process_read": process_bytes_read() - rchar,
        "rise_mb": memory.rise_mb,
        "rss_mb": peak_rss_mb(),
        "resume": {k: v for k, v in stats["resume"].items() if not isinstance(v, (list, dict))},
    }


def process_bytes_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def child(inputs: Path, out: Path, ckpt: Path, rows: int) -> list[str]:
    rows_per_file = str(rows // OUTPUT_FILES)
    return [sys.executable, __file__, "--child", str(inputs), str(out), str(ckpt), rows_per_file]


def run(inputs: Path, out: Path, ckpt: Path, rows: int) -> dict:
    done = subprocess.run(
        child(inputs, out, ckpt, rows),
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def committed_files(out: Path) -> int:
    return sum(1 for _ in out.glob("part-*.parquet")) if out.exists() else 0


def killed_at(
    inputs: Path, out: Path, ckpt: Path, rows: int, fraction: float, full_files: int
) -> int:
    """A run SIGKILLed once ``fraction`` of the output files a full run writes (of about
    rows / OUTPUT_FILES rows) are committed; returns the files committed."""
    victim = subprocess.Popen(child(inputs, out, ckpt, rows), stdout=subprocess.DEVNULL)
    target = max(1, round(fraction * full_files))
    while committed_files(out) < target and victim.poll() is None:
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    return committed_files(out)


def line(label: str, got: dict, full: dict) -> str:
    return (
        f"| {label} | {got['rows']:,} | {got['seconds']:.1f} | {got['process_read'] / 1e9:.2f} "
        f"| {got['process_read'] / full['process_read'] * 100:.1f} % | {got['rise_mb']:.0f} "
        f"| {got['rss_mb']:.0f} |"
    )


def same_work_left(args: argparse.Namespace, root: Path) -> None:
    """A job per kill point, each leaving ``args.work_left`` rows to its resume."""
    table = [
        "| kill point | job rows | ids done before the resume | rows written | s "
        "| GB read | sys rise MB | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for fraction in args.kill:
        rows = round(args.work_left / (1 - fraction))
        files = max(1, rows // args.rows_per_file)
        rows = files * args.rows_per_file
        shutil.rmtree(root, ignore_errors=True)
        try:
            generate(root / "in", rows, files, args.ids)
            # A full run first: how many files (commits) the job makes.
            run(root / "in", root / "out", root / "ckpt", rows)
            full_files = committed_files(root / "out")
            for name in ("out", "ckpt"):
                shutil.rmtree(root / name)
            done = killed_at(root / "in", root / "out", root / "ckpt", rows, fraction, full_files)
            resumed = run(root / "in", root / "out", root / "ckpt", rows)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(
            f"{fraction:.0%} of {rows:,} rows ({files} files): {done} files committed; "
            f"resume {json.dumps(resumed)}",
            flush=True,
        )
        table.append(
            f"| {fraction:.0%} | {rows:,} | {rows - resumed['rows']:,} | {resumed['rows']:,} "
            f"| {resumed['seconds']:.1f} | {resumed['process_read'] / 1e9:.2f} "
            f"| {resumed['rise_mb']:.0f} | {resumed['rss_mb']:.0f} |"
        )
    print("\n".join(table))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child_run(*sys.argv[2:6])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000_000)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--ids", choices=["int", "string"], default="int")
    parser.add_argument("--kill", type=float, nargs="+", default=[0.5, 0.9, 0.99])
    parser.add_argument("--dir", default="/var/tmp/forebay-resume-scale")
    parser.add_argument(
        "--work-left", type=int, default=None, help="rows left after each kill (a job each)"
    )
    parser.add_argument("--rows-per-file", type=int, default=1_000_000)
    args = parser.parse_args()
    root = Path(args.dir)
    if args.work_left is not None:
        same_work_left(args, root)
        return
    shutil.rmtree(root, ignore_errors=True)
    try:
        started = time.monotonic()
        generate(root / "in", args.rows, args.files, args.ids)
        size = sum(p.stat().st_size for p in (root / "in").iterdir())
        print(
            f"input: {args.rows:,} rows, {args.ids} ids, {args.files} files, {size / 1e9:.2f} GB, "
            f"generated in {time.monotonic() - started:.0f} s",
            flush=True,
        )
        table = ["| run | rows written | s | GB read | of full | sys rise MB | peak RSS MB |"]
        table.append("|---|---:|---:|---:|---:|---:|---:|")
        full = run(root / "in", root / "out", root / "ckpt", args.rows)
        full_files = committed_files(root / "out")
        print(f"full: {full_files} files, {json.dumps(full)}", flush=True)
        table.append(line("full run", full, full))
        for fraction in args.kill:
            for name in ("out", "ckpt"):
                shutil.rmtree(root / name, ignore_errors=True)
            files = killed_at(
                root / "in", root / "out", root / "ckpt", args.rows, fraction, full_files
            )
            resumed = run(root / "in", root / "out", root / "ckpt", args.rows)
            print(
                f"killed at {fraction}: {files} of {full_files} files; resume "
                f"{json.dumps(resumed)}",
                flush=True,
            )
            table.append(line(f"resume after a kill at {fraction:.0%}", resumed, full))
        print("\n".join(table))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
