"""Async functions in ``map_batches``: calls in flight on an event loop per worker, with
timeouts, retries and poison rows; against a model server (aiohttp on 127.0.0.1), killed
and resumed, no row of a committed file is sent twice."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay

ROWS = 3_000


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": np.arange(ROWS)}), path, row_group_size=1_000)
    return path


def run(ds, **kwargs) -> pa.Table:
    return pa.concat_tables(list(ds.iter_batches(batch_size=None, **kwargs)))


class InFlight:
    """Counts calls running at once."""

    def __init__(self):
        self.now = 0
        self.most = 0

    async def __call__(self, batch):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.002 + (int(batch["id"][0]) % 7) / 1000)
        finally:
            self.now -= 1
        return {"id": batch["id"], "y": batch["id"] * 2}


def test_an_async_function_keeps_max_concurrency_calls_in_flight_and_loses_nothing(data):
    seen = InFlight()

    async def double(batch):
        return await seen(batch)

    ds = forebay.read_parquet(str(data)).map_batches(
        double, batch_format="numpy", batch_size=10, max_concurrency=32
    )
    out = run(ds, preserve_order=True)
    assert out["id"].to_pylist() == list(range(ROWS)), "every row once, in order"
    assert out["y"].to_pylist() == [2 * i for i in range(ROWS)]
    assert seen.most == 32


def test_a_class_with_an_async_call_and_an_async_generator(data):
    class Model:
        def __init__(self, factor):
            self.factor = factor

        async def __call__(self, batch):
            await asyncio.sleep(0)
            return {"id": batch["id"], "y": batch["id"] * self.factor}

    ds = forebay.read_parquet(str(data)).map_batches(
        Model, batch_format="numpy", batch_size=100, fn_constructor_args=(3,)
    )
    assert sorted(run(ds)["y"].to_pylist()) == [3 * i for i in range(ROWS)]

    async def halves(batch):
        n = len(batch)
        yield batch.slice(0, n // 2)
        await asyncio.sleep(0)
        yield batch.slice(n // 2)

    ds = forebay.read_parquet(str(data)).map_batches(halves, batch_size=100)
    assert sorted(run(ds)["id"].to_pylist()) == list(range(ROWS))


def test_an_exception_is_reraised_with_its_type(data):
    async def fails(batch):
        await asyncio.sleep(0)
        if 1500 in batch["id"].to_pylist():
            raise LookupError("row 1500 has no embedding")
        return batch

    ds = forebay.read_parquet(str(data)).map_batches(fails, batch_size=100)
    with pytest.raises(LookupError, match="row 1500 has no embedding"):
        run(ds)


def test_a_call_that_fails_is_retried_then_succeeds(data):
    attempts: dict[int, int] = {}

    async def flaky(batch):
        first = int(batch["id"][0].as_py())
        attempts[first] = attempts.get(first, 0) + 1
        if attempts[first] < 3:
            raise ConnectionResetError("the server hung up")
        return batch

    ds = forebay.read_parquet(str(data)).map_batches(flaky, batch_size=500, max_retries=2)
    assert sorted(run(ds)["id"].to_pylist()) == list(range(ROWS))
    assert set(attempts.values()) == {3}
    ds = forebay.read_parquet(str(data)).map_batches(flaky, batch_size=500, max_retries=1)
    attempts.clear()
    with pytest.raises(ConnectionResetError):
        run(ds)


def test_a_call_past_its_timeout_is_cancelled_and_raises(data):
    async def stalls(batch):
        if 2000 in batch["id"].to_pylist():
            await asyncio.sleep(3600)  # a stalled connection
        return batch

    ds = forebay.read_parquet(str(data)).map_batches(stalls, batch_size=100, call_timeout=0.2)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"call_timeout=0\.2 s"):
        run(ds)
    assert time.monotonic() - started < 30, "a stalled call does not stall the run"


def test_poison_rows_of_an_async_function_are_isolated(data):
    poison = {5, 1234, 2999}

    async def embed(batch):
        await asyncio.sleep(0.001)
        if poison.intersection(batch["id"].tolist()):
            raise ValueError("too long")
        return batch

    ds = forebay.read_parquet(str(data)).map_batches(
        embed, batch_format="numpy", batch_size=64, on_error="skip"
    )
    assert sorted(run(ds)["id"].to_pylist()) == sorted(set(range(ROWS)) - poison)
    stage = next(s for s in ds.stats()["stages"] if s["name"] == "map_batches(embed)")
    assert sorted(e["row"] for e in stage["errored"]) == sorted(poison)


def test_stopping_early_cancels_the_calls_in_flight(data):
    async def slow(batch):
        await asyncio.sleep(0.05)
        return batch

    ds = forebay.read_parquet(str(data)).map_batches(slow, batch_size=10, max_concurrency=50)
    started = time.monotonic()
    for _ in ds.iter_batches(batch_size=None):
        break
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"compute": "processes"}, ValueError, "runs on compute='threads'"),
        ({"max_concurrency": 0}, ValueError, "max_concurrency"),
        ({"call_timeout": 0}, ValueError, "call_timeout must be more than 0"),
        ({"call_timeout": "1"}, TypeError, "call_timeout must be a number"),
    ],
)
def test_wrong_async_arguments_are_clear_errors(data, kwargs, error, message):
    async def f(batch):
        return batch

    with pytest.raises(error, match=message):
        forebay.read_parquet(str(data)).map_batches(f, **kwargs)


def test_max_concurrency_is_for_async_functions(data):
    with pytest.raises(ValueError, match="apply to async functions"):
        forebay.read_parquet(str(data)).map_batches(lambda b: b, max_concurrency=8)


# ---------------------------------------------------------------- a model server, killed

SERVER = textwrap.dedent(
    """
    import asyncio, json, random, sys
    from aiohttp import web

    log = open(sys.argv[1], "a", buffering=1)

    async def embed(request):
        body = await request.json()
        log.write(json.dumps(body["ids"]) + "\\n")  # every row asked for, as it arrives
        await asyncio.sleep(0.03 + random.random() * 0.02)
        return web.json_response({"dims": [len(str(i)) for i in body["ids"]]})

    app = web.Application()
    app.router.add_post("/embed", embed)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=lambda *a: print("ready", flush=True))
    """
)

JOB = textwrap.dedent(
    """
    import json, sys
    import aiohttp
    import forebay

    class Embed:
        def __init__(self, url):
            self.url, self.session = url, None

        async def __call__(self, batch):
            if self.session is None:
                self.session = aiohttp.ClientSession()
            ids = batch["id"].tolist()
            async with self.session.post(self.url, json={"ids": ids}) as response:
                response.raise_for_status()
                dims = (await response.json())["dims"]
            return {"id": batch["id"], "dim": dims}

        async def aclose(self):  # awaited when the worker stops
            if self.session is not None:
                await self.session.close()

    if __name__ == "__main__":
        config = json.loads(sys.argv[1])
        forebay.configure(progress=False)
        ds = forebay.read_parquet(config["input"]).map_batches(
            Embed, fn_constructor_args=(config["url"],), batch_format="numpy",
            batch_size=20, max_concurrency=8,
        )
        print("started", flush=True)
        ds.write_parquet(
            config["output"], rows_per_file=500,
            checkpoint=forebay.Checkpoint(config.get("id_column", "id"), config["checkpoint"]),
        )
        print("done", flush=True)
    """
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _committed(out: Path) -> list[int]:
    files = [p for p in out.glob("*.parquet")] if out.exists() else []
    return [i for f in files for i in pq.read_table(f, columns=["id"])["id"].to_pylist()]


def _requested(log: Path, since: int) -> tuple[list[int], int]:
    lines = log.read_text().splitlines()
    return [i for line in lines[since:] for i in json.loads(line)], len(lines)


@pytest.mark.parametrize("id_column", ["id", None])
def test_killed_and_resumed_no_committed_row_is_sent_to_the_server_again(tmp_path, id_column):
    n = 8_000
    pq.write_table(pa.table({"id": np.arange(n)}), tmp_path / "in.parquet", row_group_size=1_000)
    log, port = tmp_path / "requests.log", _free_port()
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "job.py").write_text(JOB)
    server = subprocess.Popen(
        [sys.executable, str(tmp_path / "server.py"), str(log), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "ready"
        config = {
            "input": str(tmp_path / "in.parquet"),
            "output": str(tmp_path / "out"),
            "checkpoint": str(tmp_path / "ckpt"),
            "url": f"http://127.0.0.1:{port}/embed",
            "id_column": id_column,
        }
        rng = random.Random(20261127)
        seen, partial = 0, 0
        # 5 kills a mode in CI; TEST_ENDPOINT_KILLS=30 for the count (BENCHMARKS.md).
        for _ in range(int(os.environ.get("TEST_ENDPOINT_KILLS", "5"))):
            job = subprocess.Popen(
                [sys.executable, str(tmp_path / "job.py"), json.dumps(config)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert job.stdout.readline().strip() == "started"
            # Kill after the first commit (whenever a loaded machine gets there), a random
            # moment later: with calls in flight and files committed.
            deadline = time.monotonic() + 60
            while not _committed(tmp_path / "out") and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.8))
            job.send_signal(signal.SIGKILL)
            job.communicate(timeout=60)
            committed = set(_committed(tmp_path / "out"))
            partial += 0 < len(committed) < n
            _, seen = _requested(log, seen)
            # The next run (killed or not) must not ask for a committed row.
            job = subprocess.Popen(
                [sys.executable, str(tmp_path / "job.py"), json.dumps(config)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            _, err = job.communicate(timeout=120)
            assert job.returncode == 0, err
            asked, seen = _requested(log, seen)
            again = committed.intersection(asked)
            assert not again, f"{len(again)} committed rows sent to the model again"
            ids = _committed(tmp_path / "out")
            assert sorted(ids) == list(range(n)), "every row's output exactly once"
            for name in ("out", "ckpt"):
                import shutil

                shutil.rmtree(tmp_path / name)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=10)
    assert partial >= 3, "most kills must land between commits"
    assert os.path.getsize(log) > 0


def test_the_endpoint_example_runs_killed_and_resumed():
    """examples/endpoint_job.py (an OpenAI-compatible server, a job killed and resumed) runs
    as written and checks itself."""
    example = Path(__file__).resolve().parents[2] / "examples" / "endpoint_job.py"
    run = subprocess.run(
        [sys.executable, str(example), "--rows", "12000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().endswith("OK")
    assert "asked for again: 0" in run.stdout
