"""Checkpoint filtering on the seed resume workload: forebay vs Ray's method vs peers.

Workload (DESIGN.md): a checkpoint Parquet file of 8 M ids and 1,000 input files of 10,000
ids each (ids 0..9,999,999; the checkpoint holds the first 80 %). Ids are decimal strings
("0".."9999999") or, with --ids uuid, 36-character UUID strings. Methods, each in a fresh
subprocess (so memory is its own), alternating A B A B ... over --rounds rounds:

  forebay         CheckpointFilter.load + ckpt.filter(forebay.read_parquet(inputs)): the
                  scan streamed and filtered on all cores, in order (what the engine does)
  forebay_table   CheckpointFilter.load + read all inputs into one Table, filter it
  ray_numpy       Ray Data's method: checkpoint ids -> numpy array, np.sort; per input file
                  np.searchsorted + equality check, Table.filter
  pyarrow_is_in   checkpoint column as the value set of pyarrow.compute.is_in over all inputs
  polars_anti     polars scan_parquet(inputs).join(scan_parquet(checkpoint), how="anti")
  duckdb_anti     DuckDB: inputs ANTI JOIN checkpoint USING (id), to Arrow

Reported per method: load time (where separable), filter time, total, rows kept (must be
2,000,000), RSS after load minus before, system used-memory rise (peak) and max RSS.

    python benches/python/checkpoint.py --ids string --rounds 5
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

from measure import (
    SystemMemorySampler,
    peak_rss_bytes,
    peak_rss_mb,
    reset_peak_rss,
    rss_bytes,
    run_child,
)

TOTAL_IDS = 10_000_000
CHECKPOINT_IDS = 8_000_000
INPUT_FILES = 1_000
METHODS = ["forebay", "forebay_table", "ray_numpy", "pyarrow_is_in", "polars_anti", "duckdb_anti"]


def id_strings(kind: str):
    import numpy as np
    import pyarrow as pa

    if kind == "string":
        return pa.array(np.arange(TOTAL_IDS).astype(str))
    rng = np.random.default_rng(20261121)
    raw = (
        rng.integers(0, 2**63, size=(TOTAL_IDS, 2), dtype=np.int64)
        .view(np.uint8)
        .reshape(TOTAL_IDS, 16)
    )
    hexes = [r.tobytes().hex() for r in raw]
    return pa.array([f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" for h in hexes])


def generate(root: Path, kind: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = root / kind
    done_marker = data / "_generated"
    if done_marker.exists():
        return data
    (data / "inputs").mkdir(parents=True, exist_ok=True)
    ids = id_strings(kind)
    pq.write_table(pa.table({"id": ids.slice(0, CHECKPOINT_IDS)}), data / "checkpoint.parquet")
    per_file = TOTAL_IDS // INPUT_FILES
    for k in range(INPUT_FILES):
        chunk = ids.slice(k * per_file, per_file)
        pq.write_table(
            pa.table({"id": chunk, "value": pa.array(range(per_file))}),
            data / "inputs" / f"part-{k:04d}.parquet",
        )
    done_marker.write_text("ok")
    return data


# ------------------------------------------------------------------ methods (run in a child)


def run_forebay(data: Path, whole_table: bool) -> dict:
    import forebay

    reset_peak_rss()
    before = rss_bytes()
    t0 = time.perf_counter()
    ckpt = forebay.CheckpointFilter.load(str(data / "checkpoint.parquet"), "id")
    t1 = time.perf_counter()
    after = rss_bytes()
    peak_during_load = peak_rss_bytes() - before
    kept = 0
    if whole_table:
        kept = ckpt.filter(forebay.read_parquet(str(data / "inputs")).to_arrow()).num_rows
    else:
        for batch in ckpt.filter(forebay.read_parquet(str(data / "inputs"))):
            kept += batch.num_rows
    t2 = time.perf_counter()
    return {
        "load_s": t1 - t0,
        "filter_s": t2 - t1,
        "kept": kept,
        "ids": len(ckpt),
        "rss_load_bytes": after - before,
        "index_bytes": ckpt.memory_bytes,
        "load_peak_bytes": peak_during_load,
    }


def run_ray_numpy(data: Path) -> dict:
    import numpy as np
    import pyarrow.parquet as pq

    before = rss_bytes()
    t0 = time.perf_counter()
    ids = pq.read_table(data / "checkpoint.parquet", columns=["id"]).column("id")
    checkpointed = np.sort(ids.to_numpy(zero_copy_only=False))
    del ids
    t1 = time.perf_counter()
    after = rss_bytes()
    kept = 0
    for f in sorted((data / "inputs").glob("*.parquet")):
        t = pq.read_table(f)
        block_ids = t.column("id").to_numpy(zero_copy_only=False)
        pos = np.searchsorted(checkpointed, block_ids)
        pos[pos == len(checkpointed)] = 0
        done = checkpointed[pos] == block_ids
        kept += t.filter(~done).num_rows
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "filter_s": t2 - t1, "kept": kept, "rss_load_bytes": after - before}


def run_pyarrow_is_in(data: Path) -> dict:
    import pyarrow.compute as pc
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    before = rss_bytes()
    t0 = time.perf_counter()
    checkpointed = (
        pq.read_table(data / "checkpoint.parquet", columns=["id"]).column("id").combine_chunks()
    )
    t1 = time.perf_counter()
    after = rss_bytes()
    inputs = pads.dataset(data / "inputs").to_table()
    kept = inputs.filter(pc.invert(pc.is_in(inputs.column("id"), value_set=checkpointed))).num_rows
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "filter_s": t2 - t1, "kept": kept, "rss_load_bytes": after - before}


def run_polars(data: Path) -> dict:
    import polars as pl

    t0 = time.perf_counter()
    out = (
        pl.scan_parquet(str(data / "inputs" / "*.parquet"))
        .join(pl.scan_parquet(str(data / "checkpoint.parquet")), on="id", how="anti")
        .collect()
    )
    t1 = time.perf_counter()
    return {"load_s": None, "filter_s": t1 - t0, "kept": out.height}


def run_duckdb(data: Path) -> dict:
    import duckdb

    con = duckdb.connect()
    t0 = time.perf_counter()
    out = con.sql(
        f"SELECT i.* FROM read_parquet('{data}/inputs/*.parquet') i "
        f"ANTI JOIN read_parquet('{data}/checkpoint.parquet') c USING (id)"
    ).arrow()
    kept = out.num_rows if hasattr(out, "num_rows") else out.read_all().num_rows
    t1 = time.perf_counter()
    return {"load_s": None, "filter_s": t1 - t0, "kept": kept}


def run_method(method: str, data: Path) -> dict:
    runner = {
        "forebay": lambda: run_forebay(data, whole_table=False),
        "forebay_table": lambda: run_forebay(data, whole_table=True),
        "ray_numpy": lambda: run_ray_numpy(data),
        "pyarrow_is_in": lambda: run_pyarrow_is_in(data),
        "polars_anti": lambda: run_polars(data),
        "duckdb_anti": lambda: run_duckdb(data),
    }[method]
    out = runner()
    out["total_s"] = (out["load_s"] or 0) + out["filter_s"]
    out["max_rss_mb"] = peak_rss_mb()
    out["method"] = method
    return out


# ------------------------------------------------------------------ driver


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ids", choices=["string", "uuid"], default="string")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data-dir", default="bench-data/checkpoint")
    ap.add_argument("--methods", nargs="*", default=METHODS)
    ap.add_argument("--json", help="write raw results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()

    data = Path(args.data_dir) / args.ids
    if args.child:
        print(json.dumps(run_method(args.child, data)))
        return 0

    data = generate(Path(args.data_dir), args.ids)
    results = {m: [] for m in args.methods}
    for r in range(args.rounds):
        for m in args.methods:
            with SystemMemorySampler() as sampler:
                res = run_child(__file__, m, "--ids", args.ids, "--data-dir", args.data_dir)
            res["system_rise_mb"] = sampler.rise_mb
            if res["kept"] != TOTAL_IDS - CHECKPOINT_IDS:
                raise SystemExit(
                    f"{m} kept {res['kept']} rows, expected {TOTAL_IDS - CHECKPOINT_IDS}"
                )
            results[m].append(res)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    med = lambda m, k: (
        statistics.median(x[k] for x in results[m]) if results[m][0].get(k) is not None else None
    )
    base = med("forebay", "total_s") if "forebay" in results else None
    print(
        f"\ncheckpoint filter, {args.ids} ids: 8 M checkpointed, 1,000 x 10,000 input ids; "
        f"medians of {args.rounds} ({dt.date.today()})"
    )
    print(
        f"{'method':<15}{'load s':>9}{'filter s':>10}{'total s':>9}{'vs forebay':>12}"
        f"{'RSS after load':>16}{'B/id':>7}{'sys rise MB':>13}{'max RSS MB':>12}"
    )
    for m in args.methods:
        load, filt, total = med(m, "load_s"), med(m, "filter_s"), med(m, "total_s")
        rss_load = med(m, "rss_load_bytes")
        fmt = lambda v, w, p=3: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"
        print(
            f"{m:<15}{fmt(load, 9)}{fmt(filt, 10)}{fmt(total, 9)}"
            f"{fmt(total / base if base else None, 11, 2)}x"
            f"{fmt(rss_load / 1e6 if rss_load is not None else None, 13, 1)} MB"
            f"{fmt(rss_load / CHECKPOINT_IDS if rss_load is not None else None, 7, 1)}"
            f"{fmt(med(m, 'system_rise_mb'), 13, 0)}{fmt(med(m, 'max_rss_mb'), 12, 0)}"
        )
    if "forebay" in results:
        print(
            f"forebay: index memory_bytes {med('forebay', 'index_bytes') / CHECKPOINT_IDS:.2f} B/id; "
            f"RSS after load - before {med('forebay', 'rss_load_bytes') / CHECKPOINT_IDS:.2f} B/id; "
            f"peak RSS rise while loading {med('forebay', 'load_peak_bytes') / 1e6:.0f} MB = "
            f"{med('forebay', 'load_peak_bytes') / med('forebay', 'rss_load_bytes'):.2f}x the loaded index"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
