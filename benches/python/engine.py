"""Engine benchmarks: forebay pipelines vs the systems people use for the same jobs.

    python benches/python/engine.py iter --scale-factor 1 [--rounds 5] [--batch-size 65536]
    python benches/python/engine.py gil [--rounds 3]
    python benches/python/engine.py sleep [--rounds 3]
    python benches/python/engine.py overcap --scale-factor 5 [--memory-limit 400MiB]

Scenarios:
  iter     iterate all 16 columns (or --columns) of TPC-H lineitem in 65,536-row batches
           (or --batch-size: 256 is Ray Data's and forebay's default) (prefetch 4); the consumer does nothing: forebay vs polars (collect_batches) vs pyarrow
           (dataset.to_batches) vs Ray Data (iter_batches over ray.data.read_parquet, and
           "forebay-ray": over forebay.ray.read_parquet, forebay's reader in Ray's read tasks).
  gil      a function that holds the GIL (pure Python over the l_comment strings) in
           map_batches: forebay threads vs forebay processes vs Ray Data with an actor pool.
  sleep    a function that sleeps 25 ms per 10,000-row batch (a stand-in for a GPU model):
           wall time from read_parquet to the last batch vs the function's own total time,
           forebay vs Ray Data (one actor).
  overcap  stream data 10x the memory limit through a map step to a consumer slower than
           the source; system-wide used memory must stay within the limit + 10 %.

Every measurement runs in a fresh subprocess (engines alternate, rotating which goes first:
A B C, B C A, ...), after the parent read the input files once so that every run finds them
in the page cache (see measure.warm_page_cache); the child imports its libraries first, then samples system-wide used memory (MemTotal -
MemAvailable less the kernel's per-CPU free lists, every 10 ms, so helper processes such as
Ray's count) and reports its rise over the run, with the run's time. Medians over rounds. Data comes from tpchgen-cli.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

from measure import (
    SystemMemorySampler,
    alternate,
    median_of,
    peak_rss_mb,
    process_cpu_seconds,
    tpch_lineitem,
)

HERE = Path(__file__).resolve().parent
BATCH = 65_536


def lineitem(data_dir: Path, sf: float) -> list[str]:
    return sorted(str(p) for p in tpch_lineitem(data_dir, sf).glob("*.parquet"))


# ---------------------------------------------------------------- children


def start_ray() -> None:
    import ray

    # More logical CPUs than cores, or Ray's actor pools starve its read tasks on 2 cores.
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="ERROR")


def child_iter(
    engine: str, files: list[str], columns: list[str] | None, batch_size: int = BATCH
) -> dict:
    """Time a run whose consumer does nothing but count rows; then, untimed, run again to
    find the largest batch's bytes for the budget. (Sizing a batch inside the timed loop is
    not iterating: polars' `estimated_size()` on 16 columns costs ~0.5 ms a batch, ~15 % of
    an SF5 run, pyarrow's `nbytes` a tenth of that.)"""
    if engine == "forebay":
        import forebay

        forebay.configure(progress=False)

        def batches():
            return forebay.read_parquet(files, columns=columns).iter_batches(
                batch_size=batch_size, prefetch_batches=4, batch_format="pyarrow"
            )

        def rows_of(b):
            return b.num_rows

        def bytes_of(b):
            return b.nbytes

    elif engine == "polars":
        import polars as pl

        def batches():
            scan = pl.scan_parquet(files)
            if columns:
                scan = scan.select(columns)
            return scan.collect_batches(chunk_size=batch_size)

        def rows_of(df):
            return df.height

        def bytes_of(df):
            return df.estimated_size()

    elif engine == "pyarrow":
        import pyarrow.dataset as pds

        def batches():
            dataset = pds.dataset(files, format="parquet")
            return dataset.to_batches(columns=columns, batch_size=batch_size)

        def rows_of(b):
            return b.num_rows

        def bytes_of(b):
            return b.nbytes

    elif engine in ("ray", "forebay-ray"):
        import ray.data

        start_ray()
        if engine == "forebay-ray":
            import forebay.ray

            read = forebay.ray.read_parquet
        else:
            read = ray.data.read_parquet

        def batches():
            return read(files, columns=columns).iter_batches(
                batch_size=batch_size, prefetch_batches=4, batch_format="pyarrow"
            )

        def rows_of(b):
            return b.num_rows

        def bytes_of(b):
            return b.nbytes

    else:
        raise SystemExit(f"unknown engine {engine}")
    with SystemMemorySampler() as mem:
        cpu_before = process_cpu_seconds()
        started = time.perf_counter()
        rows = sum(rows_of(b) for b in batches())
        seconds = time.perf_counter() - started
        cpu = process_cpu_seconds() - cpu_before
    rss_mb = peak_rss_mb()
    largest = max(bytes_of(b) for b in batches())
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "rise_mb": mem.rise_mb,
        "rss_mb": rss_mb,
        "rows": rows,
        "batch_mb": largest / 1e6,
    }


def count_vowels_py(texts: list[str]) -> list[int]:
    return [sum(1 for ch in t if ch in "aeiou") for t in texts]


def child_gil(engine: str, files: list[str], rows: int) -> dict:
    import pyarrow as pa

    def vowels(batch):
        return pa.table(
            {
                "l_orderkey": batch["l_orderkey"],
                "vowels": count_vowels_py(batch["l_comment"].to_pylist()),
            }
        )

    if engine.startswith("forebay"):
        import forebay

        forebay.configure(progress=False)
        compute = engine.split("-")[1]

        def run():
            ds = forebay.read_parquet(files, columns=["l_orderkey", "l_comment"]).limit(rows)
            out = ds.map_batches(vowels, batch_size=10_000, compute=compute, concurrency=2)
            return sum(b.num_rows for b in out.iter_batches(batch_size=None))

    elif engine == "ray":
        import ray.data

        start_ray()

        class Vowels:
            def __call__(self, batch):
                return vowels(batch)

        def run():
            ds = ray.data.read_parquet(files, columns=["l_orderkey", "l_comment"]).limit(rows)
            out = ds.map_batches(Vowels, batch_size=10_000, batch_format="pyarrow", concurrency=2)
            return sum(
                b.num_rows for b in out.iter_batches(batch_size=None, batch_format="pyarrow")
            )

    else:
        raise SystemExit(f"unknown engine {engine}")
    with SystemMemorySampler() as mem:
        started = time.perf_counter()
        n = run()
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "rise_mb": mem.rise_mb, "rows": n}


SLEEP_S = 0.025


def child_sleep(engine: str, files: list[str], rows: int) -> dict:
    import pyarrow as pa  # noqa: F401

    if engine == "forebay":
        import forebay

        forebay.configure(progress=False)
        own = []

        def model(batch):
            started = time.perf_counter()
            time.sleep(SLEEP_S)
            own.append(time.perf_counter() - started)
            return batch

        def run():
            ds = forebay.read_parquet(files, columns=["l_orderkey", "l_comment"]).limit(rows)
            out = ds.map_batches(model, batch_size=10_000, concurrency=1)
            n = sum(b.num_rows for b in out.iter_batches(batch_size=None))
            return n, sum(own)

    elif engine == "ray":
        import ray.data

        start_ray()

        class Model:
            def __call__(self, batch):
                started = time.perf_counter()
                time.sleep(SLEEP_S)
                batch["own_s"] = [time.perf_counter() - started] + [0.0] * (len(batch) - 1)
                return batch

        def run():
            ds = ray.data.read_parquet(files, columns=["l_orderkey", "l_comment"]).limit(rows)
            out = ds.map_batches(Model, batch_size=10_000, batch_format="pandas", concurrency=1)
            n, own = 0, 0.0
            for b in out.iter_batches(batch_size=None, batch_format="pandas"):
                n += len(b)
                own += float(b["own_s"].sum())
            return n, own

    else:
        raise SystemExit(f"unknown engine {engine}")
    started = time.perf_counter()
    n, own = run()
    wall = time.perf_counter() - started
    return {"seconds": wall, "own_s": own, "rows": n}


def child_overcap(files: list[str], limit: str, consumer_ms: float) -> dict:
    import pyarrow.compute as pc

    import forebay

    forebay.configure(progress=False, memory_limit=limit)

    def touch(batch):  # a map step that allocates its output
        return batch.append_column("price2", pc.multiply(batch["l_extendedprice"], 2))

    with SystemMemorySampler() as mem:
        started = time.perf_counter()
        ds = forebay.read_parquet(files).map_batches(touch, concurrency=2)
        rows = 0
        decoded = 0
        for b in ds.iter_batches(batch_size=BATCH, prefetch_batches=4):
            rows += b.num_rows
            decoded += b.nbytes
            time.sleep(consumer_ms / 1000)  # slower than the source
        seconds = time.perf_counter() - started
    stats = ds.stats()
    return {
        "seconds": seconds,
        "rise_mb": mem.rise_mb,
        "rss_mb": peak_rss_mb(),
        "rows": rows,
        "data_mb": decoded / 1e6,
        "pool_peak_mb": stats["peak_bytes"] / 1e6,
        "limit_mb": stats["memory_limit"] / 1e6,
    }


# ---------------------------------------------------------------- parent


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, engine, *rest = sys.argv[2:]
        if kind == "iter":
            print(
                json.dumps(
                    child_iter(engine, json.loads(rest[0]), json.loads(rest[1]), int(rest[2]))
                )
            )
        elif kind == "gil":
            print(json.dumps(child_gil(engine, json.loads(rest[0]), int(rest[1]))))
        elif kind == "sleep":
            print(json.dumps(child_sleep(engine, json.loads(rest[0]), int(rest[1]))))
        elif kind == "overcap":
            print(json.dumps(child_overcap(json.loads(rest[0]), rest[1], float(rest[2]))))
        return

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("scenario", choices=["iter", "gil", "sleep", "overcap"])
    p.add_argument("--scale-factor", type=float, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--data-dir", default=str(HERE.parents[1] / "bench-data"))
    p.add_argument("--engines", default=None, help="comma-separated subset")
    p.add_argument("--rows", type=int, default=1_200_000, help="rows for gil / sleep")
    p.add_argument("--memory-limit", default="400MiB")
    p.add_argument("--consumer-ms", type=float, default=20.0)
    p.add_argument(
        "--columns", default=None, help="iter: comma-separated columns (default: all 16)"
    )
    p.add_argument("--batch-size", type=int, default=BATCH, help="iter: rows per batch")
    args = p.parse_args()
    files = lineitem(Path(args.data_dir), args.scale_factor)
    today = dt.date.today()

    if args.scenario == "iter":
        engines = (args.engines or "forebay,polars,pyarrow,ray").split(",")
        columns = args.columns.split(",") if args.columns else None
        res = alternate(
            __file__,
            engines,
            args.rounds,
            files,
            "iter",
            json.dumps(files),
            json.dumps(columns),
            str(args.batch_size),
        )
        base = median_of(res["forebay"], "seconds")
        batch_mb = median_of(res["forebay"], "batch_mb")
        print(
            f"\niter_batches, lineitem SF{args.scale_factor:g}, "
            f"{len(columns) if columns else 16} columns, {args.batch_size} rows, "
            f"prefetch 4; medians of {args.rounds} ({today}); batch {batch_mb:.1f} MB, "
            f"budget (4 + 2) x batch + 100 MB = {6 * batch_mb + 100:.0f} MB"
        )
        print(
            f"{'engine':<10}{'seconds':>9}{'vs forebay':>12}{'CPU s':>8}{'sys rise MB':>13}"
            f"{'max RSS MB':>12}"
        )
        for e in engines:
            s = median_of(res[e], "seconds")
            print(
                f"{e:<10}{s:>9.3f}{s / base:>11.2f}x{median_of(res[e], 'cpu_s'):>8.2f}"
                f"{median_of(res[e], 'rise_mb'):>13.0f}{median_of(res[e], 'rss_mb'):>12.0f}"
            )
    elif args.scenario == "gil":
        engines = (args.engines or "forebay-threads,forebay-processes,ray").split(",")
        res = alternate(
            __file__, engines, args.rounds, files, "gil", json.dumps(files), str(args.rows)
        )
        base = median_of(res["forebay-threads"], "seconds")
        print(
            f"\nGIL-holding map_batches (Python over l_comment), {args.rows} rows, concurrency 2, "
            f"batch_size 10,000; medians of {args.rounds} ({today})"
        )
        print(f"{'engine':<20}{'seconds':>9}{'speed-up vs threads':>21}{'sys rise MB':>13}")
        for e in engines:
            s = median_of(res[e], "seconds")
            print(f"{e:<20}{s:>9.3f}{base / s:>20.2f}x{median_of(res[e], 'rise_mb'):>13.0f}")
    elif args.scenario == "sleep":
        engines = (args.engines or "forebay,ray").split(",")
        res = alternate(
            __file__, engines, args.rounds, files, "sleep", json.dumps(files), str(args.rows)
        )
        print(
            f"\nsleep-bound map_batches ({SLEEP_S * 1000:.0f} ms per 10,000 rows), {args.rows} rows, "
            f"one worker; medians of {args.rounds} ({today})"
        )
        print(f"{'engine':<10}{'wall s':>9}{'fn own s':>10}{'overhead':>10}")
        for e in engines:
            wall, own = median_of(res[e], "seconds"), median_of(res[e], "own_s")
            print(f"{e:<10}{wall:>9.3f}{own:>10.3f}{(wall / own - 1) * 100:>9.1f}%")
    else:
        res = alternate(
            __file__,
            ["forebay"],
            args.rounds,
            files,
            "overcap",
            json.dumps(files),
            args.memory_limit,
            str(args.consumer_ms),
        )
        r = res["forebay"]
        print(
            f"\nover the cap: lineitem SF{args.scale_factor:g} through map_batches to a consumer "
            f"sleeping {args.consumer_ms:g} ms per batch; medians of {args.rounds} ({today})"
        )
        print(
            f"limit {median_of(r, 'limit_mb'):.0f} MB, data {median_of(r, 'data_mb'):.0f} MB "
            f"({median_of(r, 'data_mb') / median_of(r, 'limit_mb'):.1f}x), time {median_of(r, 'seconds'):.1f} s, "
            f"pool peak {median_of(r, 'pool_peak_mb'):.0f} MB, system rise {median_of(r, 'rise_mb'):.0f} MB "
            f"(max {max(x['rise_mb'] for x in r):.0f}), max RSS {median_of(r, 'rss_mb'):.0f} MB"
        )


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    main()
