"""The benchmark rigs answer as S3 does: a benchmark's ratio is only as good as its server.

``benches/python/lite_s3.py`` (the cheap in-memory S3 server of ``remote.py --server lite``)
is checked here request by request with boto3 (S3's own client), then end to end: forebay
reads a dataset uploaded to it, through the latency proxy, and gets what is on disk.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

import forebay
from conftest import S3_CREDENTIALS, moto_s3
from latency_proxy import LatencyProxy

LITE_S3 = Path(__file__).resolve().parents[2] / "benches" / "python" / "lite_s3.py"


@pytest.fixture(scope="module")
def lite(tmp_path_factory):
    log = tmp_path_factory.mktemp("lite") / "lite.log"
    with moto_s3(log, [sys.executable, str(LITE_S3)]) as (client, endpoint):
        client.create_bucket(Bucket="rig")
        yield client, endpoint


def test_objects_round_trip_whole_ranged_and_multipart(lite, tmp_path):
    client, _ = lite
    body = bytes(range(256)) * 40_000  # 10 MB: past the multipart threshold set below
    path = tmp_path / "blob"
    path.write_bytes(body)
    client.upload_file(
        str(path),
        "rig",
        "multi/blob",
        Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20),
    )
    client.put_object(Bucket="rig", Key="plain/small", Body=b"hello world")

    assert client.get_object(Bucket="rig", Key="plain/small")["Body"].read() == b"hello world"
    assert client.head_object(Bucket="rig", Key="multi/blob")["ContentLength"] == len(body)
    assert client.get_object(Bucket="rig", Key="multi/blob")["Body"].read() == body
    for wanted, expected in [
        ("bytes=10-19", body[10:20]),
        ("bytes=9999990-", body[9_999_990:]),
        ("bytes=-7", body[-7:]),
        ("bytes=-20000000", body),  # a suffix longer than the object is the whole object
        ("bytes=5-99999999", body[5:]),
    ]:
        got = client.get_object(Bucket="rig", Key="multi/blob", Range=wanted)
        assert got["Body"].read() == expected, wanted
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206, wanted
    with pytest.raises(ClientError) as past_the_end:
        client.get_object(Bucket="rig", Key="plain/small", Range="bytes=11-20")
    assert past_the_end.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416
    with pytest.raises(ClientError, match="NoSuchKey"):
        client.get_object(Bucket="rig", Key="plain/missing")
    with pytest.raises(ClientError, match="NoSuchBucket"):
        client.get_object(Bucket="no-such-bucket", Key="x")


def test_listing_pages_and_groups_by_delimiter(lite):
    client, _ = lite
    keys = [f"list/k{i:02d}" for i in range(7)] + ["list/sub/a", "list/sub/b", "listed"]
    for key in keys:
        client.put_object(Bucket="rig", Key=key, Body=key.encode())
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket="rig", Prefix="list/", PaginationConfig={"PageSize": 3}
    )
    listed = [o["Key"] for page in pages for o in page.get("Contents", [])]
    assert listed == sorted(k for k in keys if k.startswith("list/"))
    top = client.list_objects_v2(Bucket="rig", Prefix="list/", Delimiter="/")
    assert [o["Key"] for o in top["Contents"]] == [f"list/k{i:02d}" for i in range(7)]
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["list/sub/"]
    sizes = {o["Key"]: o["Size"] for o in top["Contents"]}
    assert sizes["list/k03"] == len(b"list/k03")


def test_forebay_reads_through_the_proxy_what_is_on_disk(lite, tmp_path):
    client, endpoint = lite
    expected = []
    for k in range(3):
        table = pa.table({"id": pa.array(range(k * 50_000, (k + 1) * 50_000)), "k": [k] * 50_000})
        path = tmp_path / f"part-{k}.parquet"
        pq.write_table(table, path, row_group_size=20_000)
        client.upload_file(str(path), "rig", f"data/part-{k}.parquet")
        expected.append(table)
    with LatencyProxy(endpoint, latency=0.01, bandwidth=200e6) as proxy:
        got = forebay.read_parquet(
            "s3://rig/data/", storage_options={**S3_CREDENTIALS, "aws_endpoint": proxy.endpoint}
        ).to_arrow()
    assert got.sort_by("id").equals(pa.concat_tables(expected))
