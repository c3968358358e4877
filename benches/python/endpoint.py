"""Batch inference against a model server: an async ``map_batches`` function posting batches
to an HTTP server on 127.0.0.1 that answers after 50 ms +- 10 ms, runs at most 256 requests
at once (more wait for a slot), and answers 1 % of requests with 429 (the client backs off
and retries: the user's code, as the issue asks).

    python benches/python/endpoint.py [--rows 800000] [--batch-size 16] [--rounds 3]
                                      [--engines forebay,asyncio,ray]

The server's capacity is 256 requests / 50 ms = 5,120 requests/s, x rows per request. Each
engine runs in a fresh process, engines alternated by round:
* ``forebay``: ``read_parquet(...).map_batches(Embed, max_concurrency=256, batch_size=...)``
  (one event loop) ``.write_parquet(...)``;
* ``asyncio``: no engine: a hand-written asyncio loop keeping 256 requests in flight over the
  rows already in memory (what this machine can drive at all: client and server share its
  2 cores);
* ``ray``: Ray Data's documented way: a callable class with ``async def __call__`` in
  ``map_batches`` (``concurrency=2`` actors, ``RAY_DATA_DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY``
  set to 128 each, so that it too has 256 requests in flight), ``.write_parquet(...)``.
Prints rows/s (median) and ratios to the capacity, to the asyncio loop and to Ray. The
default 800,000 rows (50,000 requests, ~11 s a run at capacity) make a run long enough for
its start (the process, imports, the first connections: ~0.3 s for every engine) not to
weigh: with 200,000 rows even the asyncio loop reaches only 83 % of the capacity, with
800,000 it reaches 92-93 %.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
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

HERE = Path(__file__).resolve()
LATENCY, JITTER, SLOTS, REJECT = 0.05, 0.01, 256, 0.01
#: forebay's workers (event loops), each with SLOTS / WORKERS calls in flight.
WORKERS = int(os.environ.get("ENDPOINT_FOREBAY_WORKERS", "1"))

SERVER = textwrap.dedent(
    f"""
    import asyncio, random, sys
    from aiohttp import web

    slots = asyncio.Semaphore({SLOTS})
    served = 0

    async def embed(request):
        global served
        body = await request.json()
        if random.random() < {REJECT}:
            return web.json_response({{"error": "slow down"}}, status=429)
        async with slots:
            await asyncio.sleep({LATENCY} + random.uniform(-{JITTER}, {JITTER}))
        served += 1
        return web.json_response({{"dims": [len(t) for t in body["texts"]]}})

    async def count(request):
        return web.json_response({{"served": served}})

    app = web.Application()
    app.router.add_post("/embed", embed)
    app.router.add_get("/served", count)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]),
                print=lambda *a: print("ready", flush=True), access_log=None)
    """
)


async def post(session, url: str, texts: list[str]) -> list[int]:
    """The user's call: POST a batch; on 429 back off and try again."""
    import asyncio

    delay = 0.05
    while True:
        async with session.post(url, json={"texts": texts}) as response:
            if response.status == 429:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            response.raise_for_status()
            return (await response.json())["dims"]


class Embed:
    """A client of the server, as a user writes it (forebay and Ray take the same class)."""

    def __init__(self, url: str):
        self.url, self.session = url, None

    async def __call__(self, batch):
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(60)
            )
        dims = await post(self.session, self.url, [str(t) for t in batch["text"]])
        return {"id": batch["id"], "dim": np.asarray(dims)}

    async def aclose(self):
        if self.session is not None:
            await self.session.close()


def child(engine: str, path: str, url: str, batch_size: int) -> dict:
    rows = pq.ParquetFile(path).metadata.num_rows
    out = tempfile.mkdtemp(prefix=f"endpoint-{engine}-")  # forebay and Ray write the output
    started = time.perf_counter()
    if engine == "forebay":
        import forebay

        forebay.configure(progress=False)
        ds = forebay.read_parquet(path).map_batches(
            Embed,
            fn_constructor_args=(url,),
            batch_format="numpy",
            batch_size=batch_size,
            concurrency=WORKERS,
            max_concurrency=SLOTS // WORKERS,
        )
        got = ds.write_parquet(out)["rows"]
    elif engine == "asyncio":
        import asyncio

        import aiohttp

        texts = pq.read_table(path, columns=["text"])["text"].to_pylist()
        chunks = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]

        async def drive() -> int:
            done = 0
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                queue = iter(chunks)

                async def lane() -> None:
                    nonlocal done
                    for chunk in queue:
                        dims = await post(s, url, chunk)
                        done += len(dims)  # after the await: `done +=` reads it first

                await asyncio.gather(*(lane() for _ in range(SLOTS)))
            return done

        got = asyncio.run(drive())
    elif engine == "ray":
        import ray

        # More logical CPUs than cores: with 2, the 2 actors hold both and no read task runs.
        ray.init(num_cpus=8, include_dashboard=False, logging_level="ERROR")
        ds = ray.data.read_parquet(path).map_batches(
            Embed,
            fn_constructor_args=(url,),
            batch_format="numpy",
            batch_size=batch_size,
            concurrency=2,
        )
        ds.write_parquet(out)
        got = pq.read_table(out).num_rows
    else:
        raise ValueError(engine)
    seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    assert got == rows, f"{engine}: {got} rows of {rows}"
    return {"seconds": seconds, "rows_per_s": rows / seconds}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=800_000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default="forebay,asyncio,ray")
    args = parser.parse_args()
    engines = args.engines.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "docs.parquet"
        ids = np.arange(args.rows)
        pq.write_table(
            pa.table({"id": ids, "text": [f"document {i}" for i in ids]}),
            path,
            row_group_size=50_000,
        )
        (Path(tmp) / "server.py").write_text(SERVER)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, str(Path(tmp) / "server.py"), str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}/embed"
        env = {**os.environ, "RAY_DATA_DEFAULT_ASYNC_BATCH_UDF_MAX_CONCURRENCY": str(SLOTS // 2)}
        results: dict[str, list[dict]] = {e: [] for e in engines}
        try:
            for r in range(args.rounds):
                order = engines[r % len(engines) :] + engines[: r % len(engines)]
                for engine in order:
                    out = subprocess.run(
                        [
                            sys.executable,
                            str(HERE),
                            "--child",
                            engine,
                            str(path),
                            url,
                            str(args.batch_size),
                        ],
                        capture_output=True,
                        text=True,
                        env=env,
                        check=False,
                    )
                    if out.returncode != 0:
                        raise RuntimeError(f"{engine} failed:\n{out.stderr[-3000:]}")
                    # The last line that is our JSON (Ray prints on stdout too).
                    line = next(
                        x for x in reversed(out.stdout.splitlines()) if x.startswith('{"seconds"')
                    )
                    result = json.loads(line)
                    results[engine].append(result)
                    print(f"round {r} {engine}: {result['rows_per_s']:,.0f} rows/s", flush=True)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=10)
    capacity = SLOTS / LATENCY * args.batch_size
    print(
        f"\nrows {args.rows:,}, {args.batch_size} rows a request; server capacity "
        f"{capacity:,.0f} rows/s ({SLOTS} slots / {LATENCY * 1000:.0f} ms)"
    )
    medians = {e: statistics.median(x["rows_per_s"] for x in v) for e, v in results.items()}
    for engine, rate in medians.items():
        line = f"{engine:8} {rate:12,.0f} rows/s  {rate / capacity:6.1%} of capacity"
        if engine != "forebay" and "forebay" in medians:
            line += f"  forebay / {engine} = {medians['forebay'] / rate:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
