"""Faults of a remote store, injected by a proxy in front of a moto server
(``latency_proxy.py``): throttling (503 SlowDown), a connection reset mid-body, a stalled
response. Each run ends with the right result or a clear error, within the deadline the
storage options set (``timeout``, ``max_retries``, ``retry_timeout``), never a hang."""

from __future__ import annotations

import io
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay
from conftest import S3_CREDENTIALS, assert_tables_equal, moto_s3
from latency_proxy import LatencyProxy

pytest.importorskip("boto3")
pytest.importorskip("moto")

FILES = 2
ROWS = 20_000


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    with moto_s3(log_path) as (client, endpoint):
        client.create_bucket(Bucket="faults")
        tables = []
        for k in range(FILES):
            ids = np.arange(k * ROWS, (k + 1) * ROWS)
            table = pa.table({"id": ids, "text": [f"row {i}" for i in ids]})
            buf = io.BytesIO()
            pq.write_table(table, buf, row_group_size=ROWS // 4)
            client.put_object(Bucket="faults", Key=f"data/part-{k}.parquet", Body=buf.getvalue())
            tables.append(table)
        with LatencyProxy(endpoint, latency=0.005) as proxy:
            yield proxy, pa.concat_tables(tables)


def options_via(proxy: LatencyProxy, **extra: str) -> dict[str, str]:
    return {**S3_CREDENTIALS, "aws_endpoint": proxy.endpoint, **extra}


def test_the_proxy_forwards_and_counts(remote):
    proxy, expected = remote
    proxy.reset_stats()
    table = forebay.read_parquet("s3://faults/data/", storage_options=options_via(proxy)).to_arrow()
    assert_tables_equal(table, expected)
    stats = proxy.stats()
    assert stats["requests"].get("GET", 0) >= FILES, stats
    assert stats["bytes_down"] > 0 and stats["peak_in_flight"] >= 1, stats


def test_throttling_is_retried_to_the_right_result(remote):
    proxy, expected = remote
    ds = forebay.read_parquet("s3://faults/data/", storage_options=options_via(proxy))
    proxy.reset_stats()
    proxy.fail_next(3)
    assert_tables_equal(ds.to_arrow(), expected)
    assert proxy.stats()["injected"] == {"503": 3}


def test_a_reset_mid_body_is_retried_to_the_right_result(remote):
    proxy, expected = remote
    ds = forebay.read_parquet("s3://faults/data/", storage_options=options_via(proxy))
    proxy.reset_stats()
    proxy.reset_next()
    assert_tables_equal(ds.to_arrow(), expected)
    assert proxy.stats()["injected"] == {"reset": 1}


def test_a_stalled_response_ends_at_the_request_timeout_and_is_retried(remote):
    proxy, expected = remote
    ds = forebay.read_parquet("s3://faults/data/", storage_options=options_via(proxy, timeout="2s"))
    proxy.reset_stats()
    proxy.stall_next()
    started = time.monotonic()
    assert_tables_equal(ds.to_arrow(), expected)
    took = time.monotonic() - started
    assert proxy.stats()["injected"] == {"stall": 1}
    # The stall costs one request timeout (2 s), not object_store's default 30 s, and the
    # retry brings the right bytes.
    assert 1.5 < took < 25, took


def test_a_store_that_keeps_failing_is_a_clear_error_within_the_retry_deadline(remote):
    proxy, _ = remote
    opts = options_via(proxy, max_retries="2", retry_timeout="5s")
    ds = forebay.read_parquet("s3://faults/data/", storage_options=opts)
    proxy.fail_next(1_000)
    started = time.monotonic()
    try:
        with pytest.raises(forebay.StorageError, match="503") as raised:
            ds.to_arrow()
    finally:
        proxy.clear_faults()
    assert time.monotonic() - started < 30
    assert "s3://faults/data/part-" in str(raised.value)


def test_a_checkpointed_write_through_faults_commits_every_row_once(remote, tmp_path):
    proxy, expected = remote
    opts = options_via(proxy)
    proxy.fail_next(2)
    stats = (
        forebay.read_parquet("s3://faults/data/", storage_options=opts)
        .map_batches(lambda t: t)
        .write_parquet(
            "s3://faults/out/",
            storage_options=opts,
            rows_per_file=10_000,
            checkpoint=forebay.Checkpoint("id", "s3://faults/ckpt/", storage_options=opts),
        )
    )
    assert stats["rows"] == expected.num_rows
    back = forebay.read_parquet("s3://faults/out/", storage_options=opts).to_arrow()
    assert sorted(back.column("id").to_pylist()) == list(range(FILES * ROWS))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [("max_retries", "lots", "whole number"), ("retry_timeout", "soon", "duration")],
)
def test_bad_retry_options_are_refused(remote, key, value, message):
    proxy, _ = remote
    with pytest.raises(forebay.ParquetError, match=message):
        forebay.read_parquet(
            "s3://faults/data/", storage_options=options_via(proxy, **{key: value})
        )
