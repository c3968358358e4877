"""Reading Parquet from an object store with real latency: forebay, pyarrow and polars through
a proxy that adds latency and limits bandwidth per connection (tests/python/latency_proxy.py)
in front of a moto S3 server on 127.0.0.1.

    python benches/python/remote.py [--latency 0.03,0.08] [--bandwidth 200e6] [--rounds 3]
                                    [--scale-factor 1] [--engines forebay,pyarrow,polars]
                                    [--scenarios two,all,small,hive,capped] [--cap-mib 256]
                                    [--server moto|ranged|lite]

Scenarios: ``two`` = lineitem (8 files) l_orderkey and l_extendedprice; ``all`` = all 16
columns; ``filtered`` = ``two`` where l_shipdate >= 1998-09-01 (~1.5 % of the rows, spread
over every row group); ``hive`` = ``two`` of lineitem's files uploaded under ``part=0`` ..
``part=7/`` directories, filtered to ``part in (2, 5)`` (each engine's hive partitioning: 2 of
the 8 files are read); ``small`` = 1,000 files of ~100 KB; ``capped`` = forebay alone
streaming all 16 columns with ``iter_batches`` under ``configure(memory_limit=--cap-mib)``,
to set the system-wide memory rise (measured for every run) against the cap: the rise during
the read (from the moment the engine's library is imported, as engine.py measures it: the
cap bounds what a run adds) and over the whole child process (interpreter and imports
included). Each engine reads in a fresh process, engines alternated by round; the proxy
counts each run's requests, bytes and peak requests in flight. Prints seconds of the read
(median; the clock starts after the engine's imports, once the process is idle: numpy's
OpenBLAS threads spin ~0.1 s after an import), forebay's ratio to the faster peer, and bytes
fetched against the bytes of the selected column chunks (footers included). The proxy runs
in this process, whose objects are frozen out of the garbage collector before each run: a
full collection stalled the proxy ~50 ms every few runs (seen as every third run of forebay's
two columns at 30 ms taking 0.28 s instead of 0.22).

``--server ranged`` puts ranged_moto.py behind the proxy instead of stock moto: the same
server, answering a ranged GET by reading only the range (stock moto reads the whole object
for each, ~5 ms of CPU a request on lineitem's 29 MB files, on the reader's own cores).
``--server lite`` puts lite_s3.py there: objects in memory, ~0.4 ms of CPU a request where
moto's request handling alone costs ~1.8 ms. The server runs on the reader's 2 cores where
S3's runs on its own machines, so the cheaper the server, the closer the rig is to the link
it models (latency and bandwidth, the proxy's).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from measure import (
    SystemMemorySampler,
    peak_rss_bytes,
    peak_rss_mb,
    reset_peak_rss,
    rss_bytes,
    run_child,
    tpch_lineitem,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
from conftest import S3_CREDENTIALS, moto_s3
from latency_proxy import LatencyProxy

HERE = Path(__file__).resolve().parent
BUCKET = "remote-bench"
TWO = ["l_orderkey", "l_extendedprice"]


LATE = dt.date(1998, 9, 1)


#: The filter of the ``hive`` scenario, on its partition key.
PARTS = [2, 5]


def child(engine: str, uri: str, columns: list[str] | None, endpoint: str, kind: str) -> dict:
    """One read; ``kind``: ``plain``, ``filtered`` (l_shipdate) or ``hive`` (a partition key)."""
    filters: list | None = {
        "filtered": [("l_shipdate", ">=", LATE)],
        "hive": [("part", "in", PARTS)],
    }.get(kind)
    # The clock covers the read, not the imports: each engine's library is imported first
    # (pyarrow and numpy are already, at the top of this script), then the process waits
    # (in SystemMemorySampler) for numpy's OpenBLAS threads to stop spinning, as every other
    # benchmark here does.
    if engine.startswith("forebay"):
        import forebay  # noqa: F401
    elif engine == "pyarrow":
        import pyarrow.fs  # noqa: F401
    elif engine == "polars":
        import polars  # noqa: F401
    # The read's own memory: the system-wide rise from here, once the imports are done, as
    # engine.py measures it (a cap bounds what a run adds, not the interpreter). The parent
    # also reports the rise over the whole child process.
    with SystemMemorySampler() as memory:
        reset_peak_rss()
        rss_before = rss_bytes()
        result = read(engine, uri, columns, endpoint, kind, filters)
    result["read_rise_mb"] = round(memory.rise_mb)
    # The reader process's own share of it (the rest is the rig: the proxy's queues, the
    # server).
    result["read_rss_growth_mb"] = round((peak_rss_bytes() - rss_before) / 1e6)
    return result


def read(
    engine: str,
    uri: str,
    columns: list[str] | None,
    endpoint: str,
    kind: str,
    filters: list | None,
) -> dict:
    """The timed read of one engine; child() has imported its library, so the imports here
    are lookups in sys.modules."""
    started = time.perf_counter()
    if engine.startswith("forebay-capped-"):
        import forebay

        cap_mib = int(engine.removeprefix("forebay-capped-"))
        forebay.configure(progress=False, memory_limit=cap_mib << 20)
        dataset = forebay.read_parquet(
            uri, columns=columns, storage_options={**S3_CREDENTIALS, "aws_endpoint": endpoint}
        )
        rows = sum(batch.num_rows for batch in dataset.iter_batches())
        return {
            "seconds": round(time.perf_counter() - started, 3),
            "rows": rows,
            "peak_rss_mb": round(peak_rss_mb()),
        }
    if engine == "forebay":
        import forebay

        forebay.configure(progress=False)
        table = forebay.read_parquet(
            uri,
            columns=columns,
            filter=filters,
            storage_options={**S3_CREDENTIALS, "aws_endpoint": endpoint},
        ).to_arrow()
    elif engine == "pyarrow":
        import pyarrow.fs

        fs = pyarrow.fs.S3FileSystem(
            endpoint_override=endpoint.removeprefix("http://"),
            scheme="http",
            access_key=S3_CREDENTIALS["aws_access_key_id"],
            secret_key=S3_CREDENTIALS["aws_secret_access_key"],
            region=S3_CREDENTIALS["aws_region"],
        )
        table = pq.read_table(
            uri.removeprefix("s3://"),
            columns=columns,
            filesystem=fs,
            filters=filters,
        )
    elif engine == "polars":
        import polars as pl

        options = {
            "aws_endpoint_url": endpoint,
            "aws_allow_http": "true",
            "aws_access_key_id": S3_CREDENTIALS["aws_access_key_id"],
            "aws_secret_access_key": S3_CREDENTIALS["aws_secret_access_key"],
            "aws_region": S3_CREDENTIALS["aws_region"],
        }
        if kind == "hive":
            frame = pl.scan_parquet(
                uri + "**/*.parquet", storage_options=options, hive_partitioning=True
            ).filter(pl.col("part").is_in(PARTS))
        else:
            frame = pl.scan_parquet(uri + "*.parquet", storage_options=options)
        if kind == "filtered":
            frame = frame.filter(pl.col("l_shipdate") >= LATE)
        if columns is not None:
            frame = frame.select(columns)
        table = frame.collect().to_arrow()
    else:
        raise SystemExit(f"unknown engine {engine}")
    return {"seconds": round(time.perf_counter() - started, 3), "rows": table.num_rows}


def moto_cpu_seconds() -> float:
    """CPU seconds the moto server (a child process of this one) has used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        server = b"moto.server" in cmdline or b"ranged_moto" in cmdline or b"lite_s3" in cmdline
        if server and int(fields[1]) == os.getpid():
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return total


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def upload(client, local: list[Path], prefix: str) -> None:
    for path in local:
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")


def small_files(directory: Path, count: int = 1_000) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for k in range(count):
        n = 6_000
        table = pa.table(
            {
                "id": np.arange(k * n, (k + 1) * n),
                "value": rng.random(n),
                "tag": rng.integers(0, 1000, n),
            }
        )
        path = directory / f"part-{k:04d}.parquet"
        pq.write_table(table, path)
        paths.append(path)
    return paths


def selected_bytes(paths: list[Path], columns: list[str] | None) -> int:
    """The bytes an ideal reader fetches: the selected column chunks and each footer."""
    total = 0
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        total += meta.serialized_size + 8
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if columns is None or chunk.path_in_schema in columns:
                    total += chunk.total_compressed_size
    return total


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        engine, uri, columns, endpoint, kind = sys.argv[2:7]
        print(json.dumps(child(engine, uri, json.loads(columns), endpoint, kind)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", default="0.03,0.08", help="seconds, comma-separated")
    parser.add_argument("--bandwidth", type=float, default=200e6, help="bytes/s per connection")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale-factor", type=float, default=1)
    parser.add_argument("--engines", default="forebay,pyarrow,polars")
    parser.add_argument("--scenarios", default="two,all,small")
    parser.add_argument("--cap-mib", type=int, default=256, help="memory cap of `capped`")
    parser.add_argument(
        "--server",
        choices=["moto", "ranged", "lite"],
        default="moto",
        help="the S3 server behind the proxy: stock moto (a ranged GET reads the whole object) "
        "or ranged_moto.py (reads only the range, as S3's cost follows the bytes) or lite_s3.py "
        "(objects in memory, ~20x less CPU a request than moto)",
    )
    parser.add_argument("--data-dir", default=str(HERE.parents[1] / "bench-data"))
    args = parser.parse_args()

    lineitem = sorted(tpch_lineitem(Path(args.data_dir), args.scale_factor).glob("*.parquet"))
    # The server's log and the small files live here only for the run, however it ends.
    with tempfile.TemporaryDirectory(prefix="forebay-remote-") as scratch:
        return run_scenarios(args, lineitem, Path(scratch))


def run_scenarios(args: argparse.Namespace, lineitem: list[Path], tmp: Path) -> int:
    engines = args.engines.split(",")
    latencies = [float(x) for x in args.latency.split(",")]
    scenarios = {
        "two": (f"s3://{BUCKET}/lineitem/", TWO, lineitem),
        "all": (f"s3://{BUCKET}/lineitem/", None, lineitem),
        "capped": (f"s3://{BUCKET}/lineitem/", None, lineitem),
        "filtered": (f"s3://{BUCKET}/lineitem/", TWO, lineitem),
        "hive": (f"s3://{BUCKET}/hive/", TWO, [lineitem[p] for p in PARTS]),
    }
    wanted = args.scenarios.split(",")
    server = None
    if args.server in ("ranged", "lite"):
        script = {"ranged": "ranged_moto.py", "lite": "lite_s3.py"}[args.server]
        server = [sys.executable, str(HERE / script)]
    with moto_s3(tmp / "moto.log", server) as (client, endpoint):
        client.create_bucket(Bucket=BUCKET)
        upload(client, lineitem, "lineitem")
        if "hive" in wanted:
            for part, path in enumerate(lineitem):
                upload(client, [path], f"hive/part={part}")
        if "small" in wanted:
            small = small_files(tmp / "small")
            upload(client, small, "small")
            scenarios["small"] = (f"s3://{BUCKET}/small/", None, small)
        for latency in latencies:
            with LatencyProxy(endpoint, latency=latency, bandwidth=args.bandwidth) as proxy:
                for name in wanted:
                    uri, columns, local = scenarios[name]
                    ideal = selected_bytes(
                        local, [*columns, "l_shipdate"] if name == "filtered" else columns
                    )
                    in_run = engines
                    if name == "capped":
                        in_run = [f"forebay-capped-{args.cap_mib}"]
                    runs: dict[str, list[dict]] = {e: [] for e in in_run}
                    for r in range(args.rounds):
                        order = in_run[r % len(in_run) :] + in_run[: r % len(in_run)]
                        for engine in order:
                            proxy.reset_stats()
                            # The proxy runs in this process: a full collection of its
                            # objects (boto3's, pyarrow's: tens of ms) would stall it in the
                            # middle of a run, every few runs. Frozen objects are not scanned.
                            gc.collect()
                            gc.freeze()
                            before = (
                                moto_cpu_seconds(),
                                cpu_seconds(resource.RUSAGE_SELF),
                                cpu_seconds(resource.RUSAGE_CHILDREN),
                            )
                            with SystemMemorySampler() as memory:
                                result = run_child(
                                    __file__,
                                    engine,
                                    uri,
                                    json.dumps(columns),
                                    proxy.endpoint,
                                    name if name in ("filtered", "hive") else "plain",
                                )
                            result["rise_mb"] = round(memory.rise_mb)
                            # CPU of the engine's process, and of the rig on the same cores:
                            # the S3 server, and this process (the proxy, the sampler).
                            result["engine_cpu_s"] = round(
                                cpu_seconds(resource.RUSAGE_CHILDREN) - before[2], 2
                            )
                            result["server_cpu_s"] = round(moto_cpu_seconds() - before[0], 2)
                            result["proxy_cpu_s"] = round(
                                cpu_seconds(resource.RUSAGE_SELF) - before[1], 2
                            )
                            stats = proxy.stats()
                            result.update(
                                requests=sum(stats["requests"].values()),
                                mb=round(stats["bytes_down"] / 1e6, 1),
                                peak_in_flight=stats["peak_in_flight"],
                            )
                            runs[engine].append(result)
                            print(f"  {latency}s {name} {engine}: {result}", file=sys.stderr)
                    report(latency, name, runs, ideal)
    return 0


def report(latency: float, name: str, runs: dict[str, list[dict]], ideal: int) -> None:
    med = {e: statistics.median(r["seconds"] for r in rs) for e, rs in runs.items()}
    print(f"\n{name} at {latency * 1000:.0f} ms (selected column chunks {ideal / 1e6:.1f} MB)")
    print(
        "| engine | seconds (median) | requests | MB fetched | fetched/selected | peak in flight "
        "| memory rise MB (max): read / process | CPU s: engine / S3 server / proxy (medians) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for engine, rs in runs.items():
        requests = statistics.median(r["requests"] for r in rs)
        mb = statistics.median(r["mb"] for r in rs)
        peak = max(r["peak_in_flight"] for r in rs)
        rise = f"{max(r['read_rise_mb'] for r in rs)} / {max(r['rise_mb'] for r in rs)}"
        cpu = " / ".join(
            f"{statistics.median(r[k] for r in rs):.2f}"
            for k in ("engine_cpu_s", "server_cpu_s", "proxy_cpu_s")
        )
        print(
            f"| {engine} | {med[engine]:.3f} | {requests:.0f} | {mb:.1f} | "
            f"{mb * 1e6 / ideal:.2f} | {peak} | {rise} | {cpu} |"
        )
    peers = [e for e in med if e != "forebay"]
    if "forebay" in med and peers:
        best = min(peers, key=lambda e: med[e])
        print(f"forebay vs the faster peer ({best}): {med[best] / med['forebay']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
