"""Training ingest benchmarks (issue 39): a shuffled training stream vs the peers.

    python benches/python/training.py throughput --scale-factor 5 [--rounds 5]
    python benches/python/training.py quality [--rounds 1]

(The quality scenario needs scipy, and Hugging Face ``datasets`` for its peer:
``.venv/bin/pip install scipy datasets``; neither is a dependency of forebay or its tests.)

Scenarios:
  throughput  one epoch of TPC-H lineitem (all 16 columns) in batches of --batch-size rows,
              the consumer doing nothing: forebay's iter_batches (no shuffle, the reference),
              forebay's training_stream in file order and shuffled (window --window-rows),
              Ray Data's iter_batches with randomize_block_order and a local shuffle buffer of
              3 x forebay's window (forebay holds up to three windows: the one consumed, the
              one read ahead and its shuffled copy), polars' iteration (no shuffle).
  quality     a dataset sorted by label and file (16 files x 262,144 rows, row groups of
              65,536; a ``label`` of 100 values increasing with the row): one epoch per
              engine (forebay shuffled, file order, Ray's and Hugging Face's buffer
              shuffles at 3 x forebay's window), scored by shuffle_quality.py.

Every run is a fresh subprocess after the files were read once (measure.alternate: engines
alternate, rotating which goes first); memory is the rise of system-wide used memory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np
from measure import (
    SystemMemorySampler,
    alternate,
    median_of,
    peak_rss_mb,
    process_cpu_seconds,
    tpch_lineitem,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
QUALITY_FILES = 16
QUALITY_ROWS_PER_FILE = 262_144
QUALITY_ROW_GROUP = 65_536
QUALITY_LABELS = 100


def quality_dataset(data_dir: Path) -> Path:
    """The sorted dataset of the quality scenario, written the first time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = data_dir / "training-sorted"
    if out.exists():
        return out
    tmp = out.with_suffix(".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    rows = QUALITY_FILES * QUALITY_ROWS_PER_FILE
    rng = np.random.default_rng(0)
    for f in range(QUALITY_FILES):
        pos = np.arange(f * QUALITY_ROWS_PER_FILE, (f + 1) * QUALITY_ROWS_PER_FILE)
        table = pa.table(
            {
                "pos": pos,
                "file": np.full(len(pos), f, np.int16),
                "row_group": (pos // QUALITY_ROW_GROUP).astype(np.int32),
                "label": (pos * QUALITY_LABELS // rows).astype(np.int16),
                "features": pa.FixedSizeListArray.from_arrays(
                    rng.standard_normal(len(pos) * 16, np.float32), 16
                ),
            }
        )
        pq.write_table(table, tmp / f"part-{f:02}.parquet", row_group_size=QUALITY_ROW_GROUP)
    tmp.rename(out)
    return out


def utf8_copy(directory: Path) -> list[str]:
    """The files of ``directory`` with their ``string_view`` columns as ``string`` (written
    once beside it): tpchgen-cli writes views, which Ray Data's local shuffle cannot take
    (pyarrow has no ``take`` for them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = directory.with_name(directory.name + "-utf8")
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        for path in sorted(directory.glob("*.parquet")):
            source = pq.ParquetFile(path)
            schema = pa.schema(
                [
                    f.with_type(pa.string()) if f.type == pa.string_view() else f
                    for f in source.schema_arrow
                ]
            )
            with pq.ParquetWriter(tmp / path.name, schema) as writer:
                for rg in range(source.num_row_groups):
                    writer.write_table(source.read_row_group(rg).cast(schema))
        tmp.rename(out)
    return sorted(str(f) for f in out.glob("*.parquet"))


def effective_window_rows(files: list[str], args: dict) -> int:
    """The rows of forebay's shuffle window (its default when --window-rows is not given)."""
    import forebay

    stream = forebay.read_parquet(files, columns=args.get("columns")).training_stream(
        args["batch_size"], window_rows=args["window_rows"]
    )
    return stream.window_blocks * stream.block_rows


# ---------------------------------------------------------------- children


def batches_of(engine: str, files: list[str], batch_size: int, window_rows: int, columns):
    """The batches of one epoch, as pyarrow RecordBatches (or dicts for HF)."""
    if engine.startswith("forebay"):
        import forebay

        ds = forebay.read_parquet(files, columns=columns)
        if engine == "forebay-iter":
            return ds.iter_batches(batch_size=batch_size)
        # "forebay-shuffle", or with other sizes: "forebay-shuffle-b4096-w1048576".
        name, *sizes = engine.split("-b")
        block_rows = None
        if sizes:
            block, _, window = sizes[0].partition("-w")
            block_rows, window_rows = int(block), int(window or window_rows)
        seed = None if name == "forebay-order" else 1
        stream = ds.training_stream(
            batch_size, seed=seed, window_rows=window_rows, block_rows=block_rows
        )
        return iter(stream)
    if engine == "polars":
        import polars as pl

        lf = pl.scan_parquet(files)
        if columns:
            lf = lf.select(columns)
        return (df.to_arrow().to_batches()[0] for df in lf.collect_batches(chunk_size=batch_size))
    if engine == "ray":
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False
        ds = ray.data.read_parquet(files, columns=columns).randomize_block_order(seed=1)
        return ds.iter_batches(
            batch_size=batch_size,
            batch_format="pyarrow",
            local_shuffle_buffer_size=3 * window_rows,
            local_shuffle_seed=1,
        )
    if engine == "hf":
        import datasets

        datasets.disable_progress_bars()
        ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
        if columns:
            ds = ds.select_columns(columns)
        ds = ds.shuffle(seed=1, buffer_size=3 * window_rows).with_format("arrow")
        return ds.iter(batch_size=batch_size)
    raise ValueError(engine)


def child(kind: str, engine: str, files: list[str], args: dict) -> dict:
    import pyarrow as pa

    batch_size, window_rows = args["batch_size"], args["window_rows"]
    columns = args.get("columns")
    if engine.startswith("forebay"):
        import forebay

        forebay.configure(memory_limit=args["memory_limit"])
    kept = []
    with SystemMemorySampler() as memory:
        start = time.perf_counter()
        cpu_start = process_cpu_seconds()
        rows = 0
        for batch in batches_of(engine, files, batch_size, window_rows, columns):
            if isinstance(batch, pa.Table):
                batch = (
                    pa.RecordBatch.from_struct_array(
                        batch.combine_chunks().to_struct_array().combine_chunks()
                    )
                    if batch.num_rows
                    else None
                )
                if batch is None:
                    continue
            rows += batch.num_rows
            if kind == "quality":
                kept.append(batch.select(["pos", "file", "row_group", "label"]))
        wall = time.perf_counter() - start
        cpu = process_cpu_seconds() - cpu_start
    result = {
        "rows": rows,
        "wall_s": round(wall, 3),
        "rows_per_s": round(rows / wall),
        # This process's threads only (not Ray's workers).
        "cpu_s": round(cpu, 2),
        "mem_rise_mb": round(memory.rise_mb, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    if kind == "quality":
        import shuffle_quality

        columns_out = shuffle_quality.collect(kept, batch_size)
        row_groups = np.full(
            QUALITY_FILES * QUALITY_ROWS_PER_FILE // QUALITY_ROW_GROUP, QUALITY_ROW_GROUP
        )
        quality = shuffle_quality.quality(
            columns_out, QUALITY_FILES * QUALITY_ROWS_PER_FILE, row_groups
        )
        result.update({k: (round(v, 6) if isinstance(v, float) else v) for k, v in quality.items()})
    return result


# ---------------------------------------------------------------- parent


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, engine, files_json, args_json = sys.argv[2:6]
        print(json.dumps(child(kind, engine, json.loads(files_json), json.loads(args_json))))
        return
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("scenario", choices=["throughput", "quality"])
    p.add_argument("--scale-factor", type=float, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--window-rows", type=int, default=None, help="default: forebay's (64 blocks)")
    p.add_argument("--memory-limit", default="1GiB")
    p.add_argument("--engines", default=None, help="comma-separated subset")
    p.add_argument("--data-dir", type=Path, default=ROOT / "bench-data")
    a = p.parse_args()
    args = {
        "batch_size": a.batch_size,
        "window_rows": a.window_rows,
        "memory_limit": a.memory_limit,
    }
    if a.scenario == "throughput":
        files = utf8_copy(tpch_lineitem(a.data_dir, a.scale_factor))
        engines = ["forebay-iter", "forebay-order", "forebay-shuffle", "ray", "polars"]
    else:
        files = sorted(str(f) for f in quality_dataset(a.data_dir).glob("*.parquet"))
        engines = ["forebay-shuffle", "forebay-order", "ray", "hf"]
    if a.engines:
        engines = a.engines.split(",")
    args["window_rows"] = effective_window_rows(files, args)
    script = str(Path(__file__).resolve())
    results = alternate(
        script, engines, a.rounds, files, a.scenario, json.dumps(files), json.dumps(args)
    )
    print(f"# {a.scenario} {dt.datetime.now():%Y-%m-%d %H:%M} {vars(a)}")
    keys = [k for k in results[engines[0]][0] if k != "rows"]
    print("| engine | rows | " + " | ".join(keys) + " |")
    print("|---|---:|" + "---:|" * len(keys))
    for e in engines:
        cells = [f"{median_of(results[e], k):,.6g}" for k in keys]
        print(f"| {e} | {results[e][0]['rows']:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
