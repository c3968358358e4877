"""Scan benchmark: forebay vs pyarrow.dataset vs polars vs duckdb on TPC-H lineitem.

    python benches/python/scan.py --scale-factor 5 [--rounds 5] [--data-dir bench-data]

Generates lineitem with the `tpchgen-cli` PyPI package (8 parts), plus a copy clustered by
l_shipdate (written by DuckDB) since tpchgen orders lineitem by order key, which spreads
every ship date over every row group. Scenarios, each engine producing Arrow data (or a
polars DataFrame) for the selected rows:
  (a) 2 of 16 columns   (b) all 16 columns
  (c) l_shipdate >= 1998-09-01 (about 1.5% of rows), on the raw and on the clustered copy
  (d) TPC-H Q1's columns under its filter l_shipdate <= 1998-09-02 (keeps ~98% of rows; the
      filter column is not returned)
  (p) all 16 columns of a copy written by pyarrow with its defaults, as most files users
      have are: every column nullable (OPTIONAL), strings as `string` (not views), decimals
      as FIXED_LEN_BYTE_ARRAY, Snappy
  (h) 2 columns where year = 1995 of a copy hive-partitioned by l_shipdate's year (written
      by DuckDB: year=1992/ .. year=1998/), each engine reading the directory with its own
      hive partitioning (about 1/7 of the rows)
Engines run interleaved (A B C D, A B C D, ...); medians of --rounds runs; ratios are
engine time / forebay time (> 1 means forebay is faster). Then the peak memory of
streaming all 16 columns, each engine in a fresh subprocess: rise of system used memory
(MemTotal - MemAvailable less the kernel's per-CPU free lists, sampled every
10 ms) and the process's max RSS.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from measure import SystemMemorySampler, peak_rss_mb, tpch_lineitem

COLUMNS_2 = ["l_orderkey", "l_extendedprice"]
CUTOFF = dt.date(1998, 9, 1)
# Scenario filters: (column, operator, value).
LATE = ("l_shipdate", ">=", CUTOFF)
Q1 = ("l_shipdate", "<=", dt.date(1998, 9, 2))
HIVE_YEAR = ("year", "=", 1995)
Q1_COLUMNS = [
    "l_returnflag",
    "l_linestatus",
    "l_quantity",
    "l_extendedprice",
    "l_discount",
    "l_tax",
]


def generate(data_dir: Path, sf: float) -> tuple[Path, Path]:
    raw = tpch_lineitem(data_dir, sf)
    clustered = data_dir / f"sf{sf:g}" / "lineitem_by_shipdate"
    if not clustered.exists():
        import duckdb
        import pyarrow.parquet as pq

        first = sorted(raw.glob("*.parquet"))[0]
        rg_rows = pq.ParquetFile(first).metadata.row_group(0).num_rows
        tmp = clustered.with_name(clustered.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        con = duckdb.connect()
        con.execute("SET preserve_insertion_order = true")
        con.execute(
            f"COPY (SELECT * FROM read_parquet('{raw}/*.parquet') ORDER BY l_shipdate) TO '{tmp}' "
            f"(FORMAT parquet, COMPRESSION snappy, ROW_GROUP_SIZE {rg_rows}, FILE_SIZE_BYTES '160MB')"
        )
        tmp.rename(clustered)
    return raw, clustered


def pyarrow_copy(raw: Path) -> Path:
    """``raw`` rewritten once by pyarrow with its default writer settings: nullable columns,
    ``string`` instead of ``string_view``, decimals in fixed-length bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = raw.with_name(raw.name + "_pyarrow")
    if not out.exists():
        tmp = out.with_name(out.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        for path in sorted(raw.glob("*.parquet")):
            table = pq.read_table(path)
            schema = pa.schema(
                pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type)
                for f in table.schema
            )
            pq.write_table(table.cast(schema), tmp / path.name)
        tmp.rename(out)
    return out


def hive_copy(raw: Path) -> Path:
    """lineitem under year=<l_shipdate's year>/ directories (the key not in the files)."""
    out = raw.parent / "lineitem_hive_by_year"
    if not out.exists():
        import duckdb
        import pyarrow.parquet as pq

        first = sorted(raw.glob("*.parquet"))[0]
        rg_rows = pq.ParquetFile(first).metadata.row_group(0).num_rows
        tmp = out.with_name(out.name + ".tmp")
        duckdb.connect().execute(
            f"COPY (SELECT *, year(l_shipdate) AS year FROM read_parquet('{raw}/*.parquet')) "
            f"TO '{tmp}' (FORMAT parquet, PARTITION_BY (year), ROW_GROUP_SIZE {rg_rows})"
        )
        tmp.rename(out)
    return out


def parquet_files(directory: Path) -> list[str]:
    return sorted(str(p) for p in directory.glob("*.parquet"))


# ---------------------------------------------------------------- engines


# Each engine reads `files`: a list of files, or a directory read with hive partitioning.


def run_forebay(files, columns, flt):
    import forebay

    ds = forebay.read_parquet(files, columns=columns, filter=[flt] if flt else None)
    rows = 0
    for batch in ds:
        rows += batch.num_rows
    return rows, ds.metrics()


def compare(left, op, right):
    import operator

    return {">=": operator.ge, "<=": operator.le, "=": operator.eq}[op](left, right)


def run_pyarrow(files, columns, flt):
    import pyarrow as pa
    import pyarrow.dataset as pds

    hive = "hive" if isinstance(files, str) else None
    d = pds.dataset(files, format="parquet", partitioning=hive)
    # pyarrow 26 cannot filter string_view (what tpchgen writes); read those as string.
    schema = pa.schema(
        [f.with_type(pa.string()) if f.type == pa.string_view() else f for f in d.schema]
    )
    d = pds.dataset(files, format="parquet", schema=schema, partitioning=hive)
    expr = compare(pds.field(flt[0]), *flt[1:]) if flt else None
    rows = 0
    for batch in d.to_batches(columns=columns, filter=expr):
        rows += batch.num_rows
    return rows, None


def run_polars(files, columns, flt):
    import polars as pl

    if isinstance(files, str):
        q = pl.scan_parquet(files, hive_partitioning=True)
    else:
        q = pl.scan_parquet(files)
    if flt:
        q = q.filter(compare(pl.col(flt[0]), *flt[1:]))
    if columns:
        q = q.select(columns)
    return q.collect().height, None


def run_duckdb(files, columns, flt):
    import duckdb

    con = duckdb.connect()
    cols = ", ".join(columns) if columns else "*"
    where = ""
    if flt:
        column, op, value = flt
        literal = f"DATE '{value}'" if isinstance(value, dt.date) else repr(value)
        where = f" WHERE {column} {op} {literal}"
    if isinstance(files, str):
        source = f"read_parquet('{files}/**/*.parquet', hive_partitioning = true)"
    else:
        source = "read_parquet([" + ", ".join(f"'{f}'" for f in files) + "])"
    reader = con.sql(f"SELECT {cols} FROM {source}{where}").to_arrow_reader(65536)
    rows = 0
    for batch in reader:
        rows += batch.num_rows
    return rows, None


ENGINES = {
    "forebay": run_forebay,
    "pyarrow": run_pyarrow,
    "polars": run_polars,
    "duckdb": run_duckdb,
}


def bench_scenario(name, files, columns, flt, rounds):
    times = {e: [] for e in ENGINES}
    rows = {}
    metrics = None
    for _ in range(rounds):
        for engine, fn in ENGINES.items():
            start = time.perf_counter()
            n, m = fn(files, columns, flt)
            times[engine].append(time.perf_counter() - start)
            rows.setdefault(engine, n)
            assert rows[engine] == n
            if m is not None:
                metrics = m
    assert len(set(rows.values())) == 1, f"engines disagree on row count: {rows}"
    med = {e: statistics.median(t) for e, t in times.items()}
    print(
        f"{name}: "
        + ", ".join(f"{e} {med[e]:.3f}s ({med[e] / med['forebay']:.2f}x)" for e in ENGINES),
        flush=True,
    )
    return {
        "scenario": name,
        "rows": rows["forebay"],
        "median_s": med,
        "ratio_vs_forebay": {e: med[e] / med["forebay"] for e in ENGINES},
        "all_s": times,
        "forebay_metrics": metrics,
    }


# ---------------------------------------------------------------- memory


def memory_probe(engine: str, files: list[str]) -> dict:
    with SystemMemorySampler() as sampler:
        ENGINES[engine](files, None, None)
    return {"engine": engine, "system_rise_mb": sampler.rise_mb, "max_rss_mb": peak_rss_mb()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale-factor", type=float, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data-dir", default="bench-data")
    ap.add_argument("--memory-probe", help=argparse.SUPPRESS)
    ap.add_argument("--files", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write results here")
    ap.add_argument("--memory-only", action="store_true", help="only the memory probes")
    ap.add_argument(
        "--scenarios",
        default="a,b,c,d,p,m",
        help="which scenarios to time (letters, comma-separated; m: the memory probes)",
    )
    args = ap.parse_args()
    if args.memory_probe:
        print(json.dumps(memory_probe(args.memory_probe, args.files)))
        return 0

    raw, clustered = generate(Path(args.data_dir), args.scale_factor)
    raw_files, clustered_files = parquet_files(raw), parquet_files(clustered)
    wanted = set(args.scenarios.split(","))
    pyarrow_files = parquet_files(pyarrow_copy(raw)) if "p" in wanted else []
    hive_root = str(hive_copy(raw)) if "h" in wanted else ""
    import duckdb
    import polars
    import pyarrow

    import forebay

    print(
        f"lineitem SF{args.scale_factor:g}: {len(raw_files)} files, "
        f"{sum(os.path.getsize(f) for f in raw_files) / 1e9:.2f} GB; cores {os.cpu_count()}; "
        f"forebay {forebay.__version__}, pyarrow {pyarrow.__version__}, polars {polars.__version__}, "
        f"duckdb {duckdb.__version__}; medians of {args.rounds}"
    )
    scenarios = [
        ("a", "(a) 2 of 16 columns", raw_files, COLUMNS_2, None),
        ("b", "(b) all 16 columns", raw_files, None, None),
        ("c", "(c) all columns, l_shipdate >= 1998-09-01, raw layout", raw_files, None, LATE),
        ("c", "(c') same filter, clustered by l_shipdate", clustered_files, None, LATE),
        ("c", "(c'') unfiltered scan of the clustered copy", clustered_files, None, None),
        ("d", "(d) Q1's 6 columns, l_shipdate <= 1998-09-02 (~98%)", raw_files, Q1_COLUMNS, Q1),
        ("p", "(p) all 16 columns, the copy pyarrow wrote", pyarrow_files, None, None),
        ("h", "(h) 2 columns where year = 1995, hive by year", hive_root, COLUMNS_2, HIVE_YEAR),
    ]
    results = (
        []
        if args.memory_only
        else [
            bench_scenario(name, files, columns, flt, args.rounds)
            for letter, name, files, columns, flt in scenarios
            if letter in wanted
        ]
    )
    if results:
        report(results, args.rounds)
    memory = measure_memory(raw_files) if args.memory_only or "m" in wanted else []
    if args.json:
        Path(args.json).write_text(
            json.dumps({"results": results, "memory": memory}, indent=1, default=str)
        )
    return 0


def report(results, rounds):
    print(
        f"\n{'scenario':<58} {'rows':>11} "
        + " ".join(f"{e:>9}" for e in ENGINES)
        + "   (median s; ratio = engine/forebay)"
    )
    for r in results:
        print(
            f"{r['scenario']:<58} {r['rows']:>11,} "
            + " ".join(f"{r['median_s'][e]:9.3f}" for e in ENGINES)
        )
        print(
            f"{'':<58} {'':>11} " + " ".join(f"{r['ratio_vs_forebay'][e]:8.2f}x" for e in ENGINES)
        )
    print("\nforebay bytes read and row groups skipped:")
    for r in results:
        m = r["forebay_metrics"]
        # metrics are those of the last round's dataset, i.e. one scan
        print(
            f"  {r['scenario']:<58} {m['data_bytes'] / 1e6:9.1f} MB/scan, "
            f"row groups pruned {m['row_groups_pruned_by_statistics']}/{m['row_groups_total']}"
        )


def measure_memory(raw_files):
    print("\npeak memory streaming all 16 columns (fresh subprocess each):")
    memory = []
    for engine in ENGINES:
        for _ in range(3):
            out = subprocess.run(
                [sys.executable, __file__, "--memory-probe", engine, "--files", *raw_files],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            memory.append(json.loads(out))
    for engine in ENGINES:
        probes = [m for m in memory if m["engine"] == engine]
        rise = statistics.median(p["system_rise_mb"] for p in probes)
        rss = statistics.median(p["max_rss_mb"] for p in probes)
        print(
            f"  {engine:<8} system used-memory rise {rise:8.0f} MB   max RSS {rss:8.0f} MB   (median of 3)"
        )
    return memory


if __name__ == "__main__":
    sys.exit(main())
