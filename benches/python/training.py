"""Training ingest benchmarks (issue 39): a shuffled training stream vs the peers.

    python benches/python/training.py throughput --scale-factor 5 [--rounds 5]
    python benches/python/training.py throughput --dataset tokens [--rounds 5]
    python benches/python/training.py quality [--rounds 1]

(The quality scenario needs scipy, and Hugging Face ``datasets`` for its peer:
``.venv/bin/pip install scipy datasets``; neither is a dependency of forebay or its tests.
The ``mosaic`` engine, MosaicML Streaming, needs torch: it runs in an interpreter of its own,
given by ``--mosaic-python`` (e.g. a venv made with ``python3 -m venv /tmp/mds-venv &&
/tmp/mds-venv/bin/pip install torch mosaicml-streaming pyarrow numpy scipy``); the dataset is
converted to MDS once, beside it, by that interpreter.)

Scenarios:
  throughput  one epoch of TPC-H lineitem (all 16 columns) in batches of --batch-size rows,
              the consumer doing nothing: forebay's iter_batches (no shuffle, the reference),
              forebay's training_stream in file order and shuffled (window --window-rows),
              Ray Data's iter_batches with randomize_block_order and a local shuffle buffer of
              3 x forebay's window (forebay holds up to three windows: the one consumed, the
              one read ahead and its shuffled copy), polars' iteration (no shuffle), and
              (``--engines ...,mosaic``) MosaicML Streaming's StreamingDataset over an MDS
              copy, with its default shuffle (py1e), through a torch DataLoader of 2 workers.
              With --dataset tokens, the same over rows of ~4 KB instead (issue 39's "4 KB-row
              dataset of the same size"): 1,048,576 pre-tokenized sequences of 1,024 int32
              token ids (a ``list<int32>``, as tokenized text is stored) with an id and a
              label, 4 GiB decoded like lineitem SF5's ~4.2 GB, in 32 files of 2 row groups
              written by pyarrow with its defaults (Snappy, 1 MiB pages); written once.
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


TOKENS_FILES = 32
TOKENS_ROWS_PER_FILE = 32_768
TOKENS_PER_ROW = 1024
TOKENS_VOCABULARY = 50_257


def tokens_dataset(data_dir: Path) -> list[str]:
    """The 4 KB-row dataset of ``--dataset tokens`` (token ids drawn from a Zipf-like law over
    a GPT-2-sized vocabulary, so that they compress as real ones do), written the first time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = data_dir / "training-tokens"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        # Rank r of the vocabulary drawn with weight 1 / (r + 10): a heavy head, a long tail.
        weights = 1.0 / (np.arange(TOKENS_VOCABULARY) + 10.0)
        cdf = np.cumsum(weights / weights.sum())
        for f in range(TOKENS_FILES):
            n = TOKENS_ROWS_PER_FILE
            ids = np.searchsorted(cdf, rng.random(n * TOKENS_PER_ROW)).astype(np.int32)
            first = f * n
            table = pa.table(
                {
                    "id": np.arange(first, first + n, dtype=np.int64),
                    "label": rng.integers(0, 100, n, dtype=np.int16),
                    "input_ids": pa.ListArray.from_arrays(
                        np.arange(0, (n + 1) * TOKENS_PER_ROW, TOKENS_PER_ROW, dtype=np.int32),
                        ids,
                    ),
                }
            )
            pq.write_table(table, tmp / f"part-{f:02}.parquet", row_group_size=n // 2)
        tmp.rename(out)
    return sorted(str(f) for f in out.glob("*.parquet"))


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


def mds_copy(files: list[str]) -> str:
    """An MDS copy of ``files`` (MosaicML Streaming's format), written once beside them by
    the interpreter running the ``mosaic`` engine: integer and float columns as scalars,
    lists of one length as ndarrays, strings as ``str``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from streaming import MDSWriter

    first = Path(files[0]).parent
    out = first.with_name(first.name + "-mds")
    if out.exists():
        return str(out)
    schema = pq.read_schema(files[0])
    columns = {}
    for field in schema:
        t = field.type
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            columns[field.name] = str(t.to_pandas_dtype().__name__)
        elif pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
            length = pq.read_table(files[0], columns=[field.name]).column(0)[0]
            columns[field.name] = f"ndarray:{t.value_type.to_pandas_dtype().__name__}:{len(length)}"
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            columns[field.name] = "str"
        else:
            raise ValueError(f"mosaic: no MDS encoding chosen for {field.name}: {t}")
    tmp = out.with_suffix(".tmp")
    with MDSWriter(out=str(tmp), columns=columns, size_limit=1 << 27) as writer:
        for path in files:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=8192):
                arrays = {}
                for name, encoding in columns.items():
                    column = batch.column(name)
                    if encoding.startswith("ndarray"):
                        width = int(encoding.rsplit(":", 1)[1])
                        arrays[name] = column.flatten().to_numpy().reshape(-1, width)
                    elif encoding == "str":
                        arrays[name] = column.to_pylist()
                    else:
                        arrays[name] = column.to_numpy()
                for i in range(batch.num_rows):
                    writer.write({name: values[i] for name, values in arrays.items()})
    tmp.rename(out)
    return str(out)


def effective_window_rows(files: list[str], args: dict) -> int:
    """The rows of forebay's shuffle window (its default when --window-rows is not given)."""
    import forebay

    stream = forebay.read_parquet(files, columns=args.get("columns")).training_stream(
        args["batch_size"], window_rows=args["window_rows"]
    )
    return stream.window_blocks * stream.block_rows


# ---------------------------------------------------------------- children


def batches_of(
    engine: str, files: list[str], batch_size: int, window_rows: int, columns, peer_rows: int
):
    """The batches of one epoch, as pyarrow RecordBatches (or dicts for HF)."""
    if engine.startswith("forebay"):
        import forebay

        ds = forebay.read_parquet(files, columns=columns)
        if engine == "forebay-iter":
            return ds.iter_batches(batch_size=batch_size)
        # "forebay-shuffle" or "forebay-order", with options: "-b4096" (block rows),
        # "-w1048576" (window rows), "-lanes12" (lanes), "-c256" (lane chunk), "-ranks4"
        # (rank 0 of 4).
        _, name, *options = engine.split("-")
        settings = {"b": None, "w": window_rows, "lanes": None, "c": None, "ranks": 1}
        for option in options:
            key = option.rstrip("0123456789")
            settings[key] = int(option[len(key) :])
        if settings["lanes"] and not any(o.startswith("w") for o in options):
            settings["w"] = None  # the lanes' own default: a window per lane a rank takes
        stream = ds.training_stream(
            batch_size,
            seed=None if name == "order" else 1,
            window_rows=settings["w"],
            block_rows=settings["b"],
            lanes=settings["lanes"],
            lane_chunk=settings["c"],
            world_size=settings["ranks"],
            rank=0,
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
            local_shuffle_buffer_size=peer_rows,
            local_shuffle_seed=1,
        )
    if engine == "mosaic":
        import torch
        from streaming import StreamingDataset

        ds = StreamingDataset(
            local=mds_copy(files), shuffle=True, shuffle_seed=1, batch_size=batch_size
        )
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=2)
        return iter(loader)
    if engine == "hf":
        import datasets

        datasets.disable_progress_bars()
        ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
        if columns:
            ds = ds.select_columns(columns)
        ds = ds.shuffle(seed=1, buffer_size=peer_rows).with_format("arrow")
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
        peer_rows = args.get("peer_buffer_rows", 3 * window_rows)
        for batch in batches_of(engine, files, batch_size, window_rows, columns, peer_rows):
            if isinstance(batch, dict):  # MosaicML Streaming: a dict of tensors or lists
                batch = pa.RecordBatch.from_pydict(
                    {
                        k: np.asarray(v)
                        for k, v in batch.items()
                        if kind == "quality" and k in ("pos", "file", "row_group", "label")
                    }
                    or {"rows": np.zeros(len(next(iter(batch.values()))))}
                )
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
    p.add_argument(
        "--dataset",
        choices=["lineitem", "tokens"],
        default="lineitem",
        help="throughput's data: TPC-H lineitem at --scale-factor, or rows of ~4 KB",
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--window-rows", type=int, default=None, help="default: forebay's (64 blocks)")
    p.add_argument(
        "--peer-buffer-rows",
        type=int,
        default=None,
        help="Ray's and HF's shuffle buffer (default: 3 x forebay's window)",
    )
    p.add_argument("--memory-limit", default="1GiB")
    p.add_argument("--engines", default=None, help="comma-separated subset")
    p.add_argument("--data-dir", type=Path, default=ROOT / "bench-data")
    p.add_argument(
        "--mosaic-python",
        default=None,
        help="the interpreter (with torch and mosaicml-streaming) that runs the mosaic engine",
    )
    a = p.parse_args()
    args = {
        "batch_size": a.batch_size,
        "window_rows": a.window_rows,
        "memory_limit": a.memory_limit,
    }
    if a.scenario == "throughput":
        files = (
            tokens_dataset(a.data_dir)
            if a.dataset == "tokens"
            else utf8_copy(tpch_lineitem(a.data_dir, a.scale_factor))
        )
        engines = ["forebay-iter", "forebay-order", "forebay-shuffle", "ray", "polars"]
    else:
        files = sorted(str(f) for f in quality_dataset(a.data_dir).glob("*.parquet"))
        engines = ["forebay-shuffle", "forebay-order", "ray", "hf"]
    if a.engines:
        engines = a.engines.split(",")
    args["window_rows"] = effective_window_rows(files, args)
    args["peer_buffer_rows"] = a.peer_buffer_rows or 3 * args["window_rows"]
    script = str(Path(__file__).resolve())
    pythons = {}
    if "mosaic" in engines:
        if not a.mosaic_python:
            p.error("the mosaic engine needs --mosaic-python (see the module docs)")
        pythons["mosaic"] = a.mosaic_python
    results = alternate(
        script,
        engines,
        a.rounds,
        files,
        a.scenario,
        json.dumps(files),
        json.dumps(args),
        pythons=pythons,
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
