"""Shared fixtures: where Apache's parquet-testing files live, table comparison, and an S3
server (moto) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

REPO = Path(__file__).resolve().parents[2]

# Every Ray cluster the tests start (the shared fixture's, the drivers' own in subprocesses,
# the README's snippets) starts fewer processes; on 2 cores each costs ~2 CPU-seconds:
# - Ray prestarts a worker per logical CPU for each new job, most of them never used;
# - Ray Data's read_parquet starts 32 footer-reading actors; 2 read the tests' few files.
# Workers still start on demand, so what the tests check is unchanged.
os.environ.setdefault("RAY_enable_worker_prestart", "0")
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "2")


def parquet_testing_dir() -> Path:
    """Apache parquet-testing data: $FOREBAY_PARQUET_TESTING or ../shared beside the repo."""
    env = os.environ.get("FOREBAY_PARQUET_TESTING")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "parquet-testing" / "data")
    for c in candidates:
        if c.is_dir():
            return c
    pytest.fail(f"parquet-testing data not found (looked in {[str(c) for c in candidates]})")


def _canonical_type(t: pa.DataType) -> pa.DataType:
    """Map equivalent Arrow types onto one representative (string_view ~ large_string ~ string...)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view():
        return pa.large_string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or t == pa.binary_view():
        return pa.large_binary()
    if pa.types.is_dictionary(t):
        return _canonical_type(t.value_type)
    if (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or getattr(pa.types, "is_list_view", lambda _: False)(t)
    ):
        return pa.large_list(pa.field("item", _canonical_type(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field("item", _canonical_type(t.value_type)), t.list_size)
    if pa.types.is_map(t):
        return pa.map_(_canonical_type(t.key_type), _canonical_type(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _canonical_type(f.type)) for f in t])
    return t


def canonical(table: pa.Table) -> pa.Table:
    """Table with canonical types, no schema metadata, one chunk per column."""
    table = table.combine_chunks()
    columns = []
    fields = []
    for field, column in zip(table.schema, table.columns, strict=True):
        target = _canonical_type(field.type)
        if column.type != target:
            if pa.types.is_dictionary(column.type):
                column = pc.cast(column, column.type.value_type)
            column = column.cast(target)
        columns.append(column)
        fields.append(pa.field(field.name, target))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _same_value(a, b) -> bool:
    """Equality of Python values from to_pylist, with NaN equal to NaN (at any depth)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_tables_equal(actual: pa.Table, expected: pa.Table, context: str = "") -> None:
    a, e = canonical(actual), canonical(expected)
    assert a.schema.names == e.schema.names, (
        f"{context}: columns {a.schema.names} != {e.schema.names}"
    )
    assert a.schema.types == e.schema.types, f"{context}: types {a.schema} != {e.schema}"
    assert a.num_rows == e.num_rows, f"{context}: {a.num_rows} rows != {e.num_rows}"
    for name in a.schema.names:
        ca, ce = a.column(name), e.column(name)
        if ca.equals(ce):
            continue
        # Arrow's equals() treats NaN != NaN; fall back to value-wise comparison.
        la, le = ca.to_pylist(), ce.to_pylist()
        assert _same_value(la, le), (
            f"{context}: column {name} differs:\n{ca.slice(0, 5)}\nvs\n{ce.slice(0, 5)}"
        )


S3_CREDENTIALS = {
    "aws_allow_http": "true",
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "aws_region": "us-east-1",
}


def start_moto_server(log_path: Path, server: list[str] | None = None):
    """Start moto's S3-compatible server on a free 127.0.0.1 port (``server``: the command
    before moto.server's arguments, ``python -m moto.server`` unless given).

    Returns ``(process, endpoint, log file)``; the caller terminates the process. The port is
    free when chosen but another test process (pytest runs two) can take it before moto binds
    it: a server that exits at start is started again on a new port.
    """
    for attempt in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        log = open(log_path, "w")  # noqa: SIM115 - handed to the caller, who closes it
        proc = subprocess.Popen(
            [
                *(server or [sys.executable, "-m", "moto.server"]),
                "-H",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
                return proc, endpoint, log
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.2)
        proc.kill()
        proc.wait()
        log.close()
        if attempt == 2 or "in use" not in log_path.read_text():
            break
    pytest.fail(f"moto server did not start: {log_path.read_text()}")


@contextlib.contextmanager
def moto_s3(log_path: Path, server: list[str] | None = None) -> Iterator[tuple[Any, str]]:
    """A moto S3 server for the block's duration: ``(boto3 client, endpoint)``; its log goes
    to ``log_path`` (``server``: as in `start_moto_server`)."""
    boto3 = pytest.importorskip("boto3")
    proc, endpoint, log = start_moto_server(log_path, server)
    try:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        yield client, endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster for a module's Ray tests (stopped after it: an idle cluster's
    processes would take CPU from the tests that follow)."""
    import ray

    # More logical CPUs than cores: on 2 cores Ray's actor pools otherwise starve its tasks.
    ray.init(
        num_cpus=8,
        object_store_memory=256 << 20,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        # Workers import the test modules' functions (slow_identity) by name.
        runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


# Files whose tests start Ray clusters. `make test` runs pytest in two processes (xdist), a
# file at a time each; these files run one after another in one process, so two Ray clusters
# never run at once: each is CPU-bound start-up of worker processes, and beside each other
# they only slow each other down (with the README's snippet in the other process, its
# cluster took 90 s instead of 42 and pytest was no shorter). They go first: together they
# are the longest chain (~10 of pytest's ~11 minutes, BENCHMARKS.md "Fast feedback").
RAY_FILES = {"test_ray.py", "test_ray_edges.py", "test_readme.py"}


def pytest_collection_modifyitems(config, items) -> None:
    items.sort(key=lambda item: item.path.name not in RAY_FILES)  # stable: files keep order


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: pytest without xdist ignores it
def pytest_xdist_make_scheduler(config, log):
    """xdist's `--dist loadfile` with the Ray files as one unit of work.

    (Not `--dist loadgroup` with xdist_group marks: xdist 3.8 groups by rewriting an item's
    `_nodeid`, which pytest 9.2 no longer reads, so the groups were silently ignored.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class RayFilesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "ray" if Path(file).name in RAY_FILES else file

    return RayFilesTogether(config, log)
