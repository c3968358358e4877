"""Resumable batch jobs: the seed workload against its peers, and what a resume reads.

    python benches/python/resume.py seed [--rounds 5] [--engines forebay,duckdb,polars,daft,ray]
    python benches/python/resume.py resume90 [--rounds 3]

Scenarios:
  seed      1,000 Parquet files x 10,000 string ids "0".."9999999" (plus an int column) and a
            checkpoint file holding ids "0".."7999999" (the data of checkpoint.py). The job:
            read -> drop done ids -> an identity Python class in map_batches (batch_size
            1000) -> write Parquet. forebay: write_parquet(checkpoint=forebay.Checkpoint(
            "id", <the checkpoint file>)) (its own commit records and id parts are written
            too, and deleted on success); DuckDB: COPY (... WHERE id NOT IN (...)) TO;
            Polars: anti-join + sink_parquet; Daft: anti-join + write_parquet; Ray Data 2.60:
            CheckpointConfig over a directory holding the checkpoint file, read_parquet ->
            map_batches(identity class) -> write_parquet (8 logical CPUs: on 2 cores Ray's
            actor pool otherwise starves its read tasks); forebay-ray: the same Ray job with
            forebay.ray.read_parquet and forebay.ray.checkpoint_config (the index in 2
            sharded actors instead of a sorted numpy array per filter actor); forebay-ray-write:
            forebay.ray.read_parquet -> map_batches(identity class) -> forebay.ray.write_parquet(
            checkpoint=forebay.Checkpoint(<that directory>)) (exactly-once commits; done ids
            dropped in the read tasks through 2 shard actors). Each output is then checked
            (outside the timing) to hold exactly the ids 8,000,000..9,999,999, each once.
  resume90  the same inputs through forebay with its own checkpoint: a full run, then a run
            killed once 90 % of its rows are committed (SIGKILL) and resumed; reported: the
            input bytes each run fetched, every byte the process read (/proc/self/io rchar:
            the checkpoint's files too), and time. The same killed state resumed by id (a
            copy of it with a one-id file beside forebay's own: a checkpoint known only by
            id loads every done id and probes each row, as every resume did before input
            positions), and the same resume with an id-only checkpoint (ids 0..8,999,999 in
            one file: every input is read and filtered by id) for comparison.

Every measurement runs in a fresh subprocess (engines alternate: A B C, A B C, ...); the child
imports its libraries first, then samples system-wide used memory (MemTotal - MemAvailable
less the kernel's per-CPU free lists, every 10 ms, so helper processes such as Ray's count)
and reports its rise over the run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from checkpoint import CHECKPOINT_IDS, TOTAL_IDS, generate
from measure import (
    SystemMemorySampler,
    median_of,
    peak_rss_mb,
    run_child,
    wait_for_ray_exit,
)

HERE = Path(__file__).resolve().parent
BATCH_SIZE = 1000


class Identity:
    """The user's model in the seed workload: returns its batch (a class, as Ray requires for
    actor pools; constructed once per worker)."""

    def __call__(self, batch):
        return batch


# ---------------------------------------------------------------- seed workload (children)


def child_seed(engine: str, data: Path, out: Path) -> dict:
    inputs = data / "inputs"
    ckpt_file = data / "checkpoint.parquet"
    if engine == "forebay":
        import forebay

        forebay.configure(progress=False)
        state = Path(str(ckpt_file) + ".forebay")
        shutil.rmtree(state, ignore_errors=True)
        with SystemMemorySampler() as mem:
            t0 = time.perf_counter()
            stats = (
                forebay.read_parquet(str(inputs))
                .map_batches(Identity, batch_size=BATCH_SIZE)
                .write_parquet(
                    str(out),
                    checkpoint=forebay.Checkpoint("id", str(ckpt_file), delete_on_success=True),
                )
            )
            seconds = time.perf_counter() - t0
        extra = {"files_written": stats["files"]}
    elif engine == "duckdb":
        import duckdb

        con = duckdb.connect()
        with SystemMemorySampler() as mem:
            t0 = time.perf_counter()
            out.mkdir(parents=True)
            con.execute(
                f"COPY (SELECT * FROM read_parquet('{inputs}/*.parquet') WHERE id NOT IN "
                f"(SELECT id FROM read_parquet('{ckpt_file}'))) TO '{out}/part-0.parquet' "
                "(FORMAT parquet)"
            )
            seconds = time.perf_counter() - t0
        extra = {}
    elif engine == "polars":
        import polars as pl

        with SystemMemorySampler() as mem:
            t0 = time.perf_counter()
            out.mkdir(parents=True)
            pl.scan_parquet(f"{inputs}/*.parquet").join(
                pl.scan_parquet(ckpt_file), on="id", how="anti"
            ).sink_parquet(out / "part-0.parquet")
            seconds = time.perf_counter() - t0
        extra = {}
    elif engine == "daft":
        import daft

        with SystemMemorySampler() as mem:
            t0 = time.perf_counter()
            daft.read_parquet(f"{inputs}/*.parquet").join(
                daft.read_parquet(str(ckpt_file)), on="id", how="anti"
            ).write_parquet(str(out))
            seconds = time.perf_counter() - t0
        extra = {}
    elif engine in ("ray", "forebay-ray", "forebay-ray-write"):
        import ray
        from ray.data.checkpoint import CheckpointConfig

        ckpt_dir = out.with_name(out.name + "-ray-checkpoint")
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        ckpt_dir.mkdir(parents=True)
        shutil.copy(ckpt_file, ckpt_dir / "checkpoint.parquet")
        with SystemMemorySampler() as mem:
            t0 = time.perf_counter()
            ray.init(
                num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="ERROR"
            )
            ctx = ray.data.DataContext.get_current()
            ctx.enable_progress_bars = False
            if engine == "ray":
                ctx.checkpoint_config = CheckpointConfig(
                    id_column="id", checkpoint_path=str(ckpt_dir), delete_checkpoint_on_success=True
                )
                source = ray.data.read_parquet(str(inputs))
            elif engine == "forebay-ray-write":
                import forebay
                import forebay.ray

                forebay.ray.write_parquet(
                    forebay.ray.read_parquet(str(inputs)).map_batches(
                        Identity, batch_size=BATCH_SIZE, batch_format="pyarrow", concurrency=2
                    ),
                    out,
                    checkpoint=forebay.Checkpoint("id", str(ckpt_dir), delete_on_success=True),
                    num_filter_actors=2,
                )
                source = None
            else:
                import forebay.ray

                ctx.checkpoint_config = forebay.ray.checkpoint_config(
                    "id", str(ckpt_dir), num_actors=2, delete_checkpoint_on_success=True
                )
                source = forebay.ray.read_parquet(str(inputs))
            if source is not None:
                source.map_batches(
                    Identity, batch_size=BATCH_SIZE, batch_format="pyarrow", concurrency=2
                ).write_parquet(str(out))
            seconds = time.perf_counter() - t0
            ray.shutdown()
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        extra = {}
    else:
        raise ValueError(engine)
    return {"seconds": seconds, "rise_mb": mem.rise_mb, "rss_mb": peak_rss_mb(), **extra}


def ids_exactly(out: Path, first: int, end: int) -> tuple[bool, int]:
    """Whether the Parquet files under ``out`` hold exactly the ids ``first..end-1``, each
    once; and how many rows they hold."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # What readers read: hidden files and directories (a killed run's `_forebay_staging_*`,
    # left alone by a run with a checkpoint elsewhere, as in resume90's copy) are not output.
    files = sorted(
        p
        for p in out.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(out).parts)
    )
    if not files:
        return end == first, 0
    ids = pa.chunked_array([pq.read_table(f, columns=["id"]).column("id") for f in files])
    as_int = pc.cast(ids, pa.int64()).combine_chunks()
    if len(as_int) != end - first:
        return False, len(as_int)
    ordered = as_int.take(pc.sort_indices(as_int))
    expected = pa.array(range(first, end), pa.int64())
    return bool(pc.all(pc.equal(ordered, expected)).as_py()), len(as_int)


# ---------------------------------------------------------------- resume at 90 % (children)


def child_run(data: Path, out: Path, ckpt: str, resume_ckpt_kind: str) -> dict:
    """One forebay run of the job; reports what it fetched (read_parquet's metrics)."""
    import forebay

    forebay.configure(progress=False)
    rchar = process_bytes_read()
    with SystemMemorySampler() as mem:
        t0 = time.perf_counter()
        ds = forebay.read_parquet(str(data / "inputs"))
        stats = ds.map_batches(Identity, batch_size=BATCH_SIZE).write_parquet(
            str(out), rows_per_file=100_000, checkpoint=forebay.Checkpoint("id", ckpt)
        )
        seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "rise_mb": mem.rise_mb,
        "process_bytes_read": process_bytes_read() - rchar,
        "rows": stats["rows"],
        "bytes_read": stats["resume"]["bytes_read"],
        "resume": stats["resume"],
        "kind": resume_ckpt_kind,
    }


def process_bytes_read() -> int:
    """Bytes this process read through system calls (input, checkpoint, anything)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def known_only_by_id(ckpt: Path) -> None:
    """Make a checkpoint known only by id: an id file forebay's commits did not write (one
    id no input holds) beside its own, so a resume loads every done id and probes by id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["not-an-input-id"]}), ckpt / "foreign-ids.parquet")


def committed_rows(out: Path) -> int:
    import pyarrow.parquet as pq

    if not out.exists():
        return 0
    return sum(pq.ParquetFile(p).metadata.num_rows for p in out.glob("part-*.parquet"))


def killed_at(data: Path, out: Path, ckpt: str, fraction: float) -> int:
    """Runs the job in a child and SIGKILLs it once ``fraction`` of the rows are committed;
    returns the rows committed."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", "run", str(data), str(out), ckpt, "own"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    target = int(fraction * TOTAL_IDS)
    while committed_rows(out) < target and child.poll() is None:
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    return committed_rows(out)


def make_id_checkpoint(data: Path, path: Path, upto: int) -> None:
    """An id-only checkpoint: one Parquet file of ids "0".."upto-1"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.exists():
        return
    ids = pq.read_table(data / "checkpoint.parquet").column("id")
    extra = [
        pq.read_table(data / "inputs" / f"part-{k:04d}.parquet", columns=["id"]).column("id")
        for k in range(CHECKPOINT_IDS // 10_000, upto // 10_000)
    ]
    table = pa.table({"id": pa.chunked_array([*ids.chunks, *(c for e in extra for c in e.chunks)])})
    pq.write_table(table, path)


# ---------------------------------------------------------------- parent


def seed(args: argparse.Namespace, data: Path, work: Path) -> None:
    engines = (args.engines or "forebay,duckdb,polars,daft,ray").split(",")
    results: dict[str, list[dict]] = {e: [] for e in engines}
    for r in range(args.rounds):
        for e in engines:
            if e in ("ray", "forebay-ray", "forebay-ray-write") and r >= args.ray_rounds:
                continue
            out = work / f"out-{e}"
            shutil.rmtree(out, ignore_errors=True)
            wait_for_ray_exit()
            res = run_child(__file__, "seed", e, str(data), str(out))
            res.update(run_child(__file__, "check", str(out), str(CHECKPOINT_IDS), str(TOTAL_IDS)))
            shutil.rmtree(out, ignore_errors=True)
            results[e].append(res)
            print(f"  round {r + 1} {e}: {json.dumps(res)}", file=sys.stderr)
    base = median_of(results["forebay"], "seconds")
    print(
        f"\nseed workload: 1,000 files x 10,000 string ids, 8 M done; read -> filter -> "
        f"identity map_batches({BATCH_SIZE}) -> write; medians of {args.rounds} "
        f"(Ray: {min(args.rounds, args.ray_rounds)}) ({dt.date.today()})"
    )
    print(
        f"{'engine':<10}{'seconds':>9}{'vs forebay':>12}{'sys rise MB':>13}{'max RSS MB':>12}"
        f"{'output exact':>14}"
    )
    for e in engines:
        rs = results[e]
        s = median_of(rs, "seconds")
        exact = all(x["exact"] for x in rs)
        print(
            f"{e:<10}{s:>9.2f}{s / base:>11.2f}x{median_of(rs, 'rise_mb'):>13.0f}"
            f"{median_of(rs, 'rss_mb'):>12.0f}{exact!s:>14}"
        )


def resume90(args: argparse.Namespace, data: Path, work: Path) -> None:
    id_ckpt = work / "ids-0-8999999.parquet"
    run_child(__file__, "make-ids", str(data), str(id_ckpt), "9000000")
    rows: dict[str, list[dict]] = {
        "full": [],
        "resume-own": [],
        "resume-own-by-id": [],
        "resume-ids": [],
    }
    for r in range(args.rounds):
        # A full run with forebay's checkpoint.
        out, ckpt = work / "r-out", work / "r-ckpt"
        for p in (out, ckpt):
            shutil.rmtree(p, ignore_errors=True)
        rows["full"].append(run_child(__file__, "run", str(data), str(out), str(ckpt), "full"))
        # Killed at 90 %, then resumed with forebay's checkpoint.
        for p in (out, ckpt):
            shutil.rmtree(p, ignore_errors=True)
        committed = killed_at(data, out, str(ckpt), 0.9)
        # The same killed state, to resume by id.
        out_by_id, ckpt_by_id = work / "r-out-by-id", work / "r-ckpt-by-id"
        for src, dst in ((out, out_by_id), (ckpt, ckpt_by_id)):
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
        known_only_by_id(ckpt_by_id)
        pairs = [("resume-own", out, ckpt), ("resume-own-by-id", out_by_id, ckpt_by_id)]
        for kind, o, c in pairs if r % 2 == 0 else pairs[::-1]:
            res = run_child(__file__, "run", str(data), str(o), str(c), kind)
            res["committed_before"] = committed
            res["exact"] = run_child(__file__, "check", str(o), "0", str(TOTAL_IDS))["exact"]
            rows[kind].append(res)
        # The same resume from an id-only checkpoint: every input is read, filtered by id.
        out2 = work / "r-out-ids"
        shutil.rmtree(out2, ignore_errors=True)
        shutil.rmtree(Path(str(id_ckpt) + ".forebay"), ignore_errors=True)
        res = run_child(__file__, "run", str(data), str(out2), str(id_ckpt), "ids")
        rows["resume-ids"].append(res)
        for k in rows:
            print(f"  round {r + 1} {k}: {json.dumps(rows[k][-1])}", file=sys.stderr)
    full_bytes = median_of(rows["full"], "bytes_read")
    print(
        f"\nresume of a 90 %-complete run (SIGKILL once 9,000,000 of 10,000,000 rows were "
        f"committed), 1,000 input files; medians of {args.rounds} ({dt.date.today()})"
    )
    full_rchar = median_of(rows["full"], "process_bytes_read")
    print(
        f"{'run':<18}{'rows written':>14}{'input bytes':>14}{'of full':>9}"
        f"{'process read':>14}{'of full':>9}{'seconds':>9}{'sys rise MB':>13}"
    )
    for k, rs in rows.items():
        b = median_of(rs, "bytes_read")
        c = median_of(rs, "process_bytes_read")
        print(
            f"{k:<18}{median_of(rs, 'rows'):>14,.0f}{b:>14,.0f}{b / full_bytes * 100:>8.1f}%"
            f"{c:>14,.0f}{c / full_rchar * 100:>8.1f}%"
            f"{median_of(rs, 'seconds'):>9.2f}{median_of(rs, 'rise_mb'):>13.0f}"
        )
    exact = all(x["exact"] for k in ("resume-own", "resume-own-by-id") for x in rows[k])
    print(f"resumed outputs hold every id exactly once: {exact}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, *rest = sys.argv[2:]
        if kind == "seed":
            print(json.dumps(child_seed(rest[0], Path(rest[1]), Path(rest[2]))))
        elif kind == "make-ids":
            make_id_checkpoint(Path(rest[0]), Path(rest[1]), int(rest[2]))
            print(json.dumps({}))
        elif kind == "check":
            # In a child: the parent's allocator would otherwise return these arrays' memory
            # to the system during the next measurement and hide part of its rise.
            exact, rows = ids_exactly(Path(rest[0]), int(rest[1]), int(rest[2]))
            print(json.dumps({"exact": exact, "rows": rows}))
        elif kind == "run":
            print(json.dumps(child_run(Path(rest[0]), Path(rest[1]), rest[2], rest[3])))
        return

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("scenario", choices=["seed", "resume90"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ray-rounds", type=int, default=1, help="Ray takes minutes a run")
    p.add_argument("--data-dir", default=str(HERE.parents[1] / "bench-data" / "checkpoint"))
    p.add_argument("--engines", default=None, help="comma-separated subset")
    args = p.parse_args()
    data = generate(Path(args.data_dir), "string")
    work = Path(args.data_dir) / "resume-work"
    work.mkdir(parents=True, exist_ok=True)
    if args.scenario == "seed":
        seed(args, data, work)
    else:
        resume90(args, data, work)


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    main()
