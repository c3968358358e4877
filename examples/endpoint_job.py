"""Batch inference against a model server, interrupted and resumed.

    python examples/endpoint_job.py [--rows 50000] [--dir DIR]

1. Starts a local embeddings server with an OpenAI-compatible route (``POST /v1/embeddings``,
   ``{"model", "input": [texts]}`` -> ``{"data": [{"index", "embedding"}]}``) that answers
   after 50 ms +- 10 ms, runs at most 256 requests at once and answers 1 % of requests with
   429. It logs every text it is asked to embed.
2. Runs the job: ``map_batches`` with an async client (aiohttp; 256 requests in flight on one
   event loop; forebay retries the 429s, ``max_retries=3``) and ``write_parquet`` with a
   checkpoint.
3. Kills the job with SIGKILL part way (a preempted node), then runs it again.
4. Verifies every document is in the output exactly once, and that the server was never
   asked again for a document whose embedding the killed run had committed (those calls
   cost money).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SERVER = textwrap.dedent(
    """
    import asyncio, random, sys
    from aiohttp import web

    log = open(sys.argv[1], "a", buffering=1)
    slots = asyncio.Semaphore(256)

    async def embeddings(request):
        body = await request.json()
        if random.random() < 0.01:
            return web.json_response({"error": {"message": "rate limited"}}, status=429)
        for text in body["input"]:
            log.write(text + "\\n")
        async with slots:
            await asyncio.sleep(0.05 + random.uniform(-0.01, 0.01))
        data = [
            {"index": i, "embedding": [len(t) / 100, t.count(" ") / 10]}
            for i, t in enumerate(body["input"])
        ]
        return web.json_response({"data": data, "model": body["model"]})

    app = web.Application()
    app.router.add_post("/v1/embeddings", embeddings)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None,
                print=lambda *a: print("ready", flush=True))
    """
)

JOB = textwrap.dedent(
    """
    import json, sys
    import aiohttp
    import numpy as np
    import forebay

    class Embed:
        '''An async client of an OpenAI-compatible embeddings server.'''

        def __init__(self, url):
            self.url, self.session = url, None

        async def __call__(self, batch):
            if self.session is None:
                self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            texts = [str(t) for t in batch["text"]]
            async with self.session.post(
                self.url, json={"model": "demo", "input": texts}
            ) as response:
                response.raise_for_status()  # a 429: forebay backs off and retries
                data = (await response.json())["data"]
            vectors = [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]
            return {"id": batch["id"], "embedding": np.asarray(vectors, dtype=np.float32)}

        async def aclose(self):
            if self.session is not None:
                await self.session.close()

    if __name__ == "__main__":
        config = json.loads(sys.argv[1])
        forebay.configure(progress=False)
        ds = forebay.read_parquet(config["input"]).map_batches(
            Embed, fn_constructor_args=(config["url"],), batch_format="numpy",
            batch_size=16, max_concurrency=256, call_timeout=30, max_retries=3,
        )
        print("started", flush=True)
        stats = ds.write_parquet(
            config["output"], rows_per_file=2_000,
            checkpoint=forebay.Checkpoint("id", config["checkpoint"]),
        )
        print(json.dumps({"rows": stats["rows"], "resume": stats["resume"]}), flush=True)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def committed(out: Path) -> list[str]:
    return [
        i
        for f in sorted(out.glob("*.parquet"))
        for i in pq.read_table(f, columns=["id"])["id"].to_pylist()
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="forebay-endpoint-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        ids = [f"doc-{i}" for i in range(args.rows)]
        texts = [f"document {i} " * (1 + i % 5) for i in range(args.rows)]
        (work / "in").mkdir(exist_ok=True)
        pq.write_table(
            pa.table({"id": ids, "text": texts}), work / "in" / "docs.parquet", row_group_size=4_000
        )
        (work / "server.py").write_text(SERVER)
        (work / "job.py").write_text(JOB)
        log, port = work / "asked.log", free_port()
        server = subprocess.Popen(
            [sys.executable, str(work / "server.py"), str(log), str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            config = json.dumps(
                {
                    "input": str(work / "in"),
                    "output": str(work / "out"),
                    "checkpoint": str(work / "ckpt"),
                    "url": f"http://127.0.0.1:{port}/v1/embeddings",
                }
            )
            job = [sys.executable, str(work / "job.py"), config]
            victim = subprocess.Popen(job, stdout=subprocess.PIPE, text=True)
            assert victim.stdout is not None and victim.stdout.readline().strip() == "started"
            # Kill as soon as a file is committed (or after 30 s).
            deadline = time.monotonic() + 30
            while not committed(work / "out") and time.monotonic() < deadline:
                time.sleep(0.02)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            done_before = set(committed(work / "out"))
            asked_before = len(log.read_text().splitlines())
            print(f"killed: {len(done_before):,} of {args.rows:,} documents committed")
            started = time.perf_counter()
            rerun = subprocess.run(job, capture_output=True, text=True, check=True)
            seconds = time.perf_counter() - started
            result = json.loads(rerun.stdout.strip().splitlines()[-1])
            asked_again = set(log.read_text().splitlines()[asked_before:])
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=10)
        out = committed(work / "out")
        by_id = dict(zip(ids, texts, strict=True))
        resent = [i for i in done_before if by_id[i] in asked_again]
        print(f"rerun: {result['rows']:,} documents in {seconds:.1f} s")
        print(f"output: {len(out):,} rows, {len(set(out)):,} distinct ids")
        print(f"committed before the kill and asked for again: {len(resent)}")
        assert len(out) == len(set(out)) == args.rows, "every document exactly once"
        assert not resent, "no committed document is sent to the server again"
        print("OK")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
