"""Reading over S3 from an S3-compatible server (moto) started on 127.0.0.1 by the test.
Requests are counted twice: by forebay's own I/O metrics and, independently, from the
server's access log."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay
from conftest import S3_CREDENTIALS, assert_tables_equal, moto_s3

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

FILES = 3
ROW_GROUPS = 4
ROWS_PER_GROUP = 2_000


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    with moto_s3(log_path) as (client, endpoint):
        expected = upload_parts(client)
        yield {"aws_endpoint": endpoint, **S3_CREDENTIALS}, expected, log_path


def upload_parts(client) -> pa.Table:
    """The test files, in the bucket ``forebay-test``; returns their rows."""
    client.create_bucket(Bucket="forebay-test")
    tables = []
    for k in range(FILES):
        n = ROW_GROUPS * ROWS_PER_GROUP
        ids = np.arange(k * n, (k + 1) * n)
        t = pa.table(
            {"id": ids, "value": ids * 0.5, "name": [f"n{i}" for i in ids], "other": ids % 7}
        )
        buf = io.BytesIO()
        pq.write_table(t, buf, row_group_size=ROWS_PER_GROUP)
        client.put_object(Bucket="forebay-test", Key=f"data/part-{k}.parquet", Body=buf.getvalue())
        tables.append(t)
    return pa.concat_tables(tables)


def s3_client(options: dict):
    """A boto3 client of the test's moto server (options as the ``s3`` fixture gives them)."""
    return boto3.client(
        "s3",
        endpoint_url=options["aws_endpoint"],
        region_name=S3_CREDENTIALS["aws_region"],
        aws_access_key_id=S3_CREDENTIALS["aws_access_key_id"],
        aws_secret_access_key=S3_CREDENTIALS["aws_secret_access_key"],
    )


def data_gets(log_path, since: int) -> list[str]:
    raw = log_path.read_text().splitlines()[since:]
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in raw]
    return [line for line in lines if re.search(r'"GET /forebay-test/data/part-\d\.parquet', line)]


def test_s3_read_equals_local_and_counts_requests(s3):
    options, expected, log_path = s3
    log_start = len(log_path.read_text().splitlines())
    ds = forebay.read_parquet(
        "s3://forebay-test/data/", columns=["id", "value"], storage_options=options
    )
    assert len(ds.files) == FILES
    actual = ds.to_arrow()
    assert_tables_equal(actual, expected.select(["id", "value"]))
    m = ds.metrics()
    # one footer read per file, even though the schema was read before the scan
    assert m["footer_requests"] == FILES, m
    # The first file's footer alone was read to learn the schema: its 2 selected column
    # chunks per row group are coalesced into one request per row group. The other files
    # are small: the scan's footer request fetched each whole, and nothing more.
    assert m["data_requests"] == ROW_GROUPS, m
    assert m["list_requests"] == 1
    time.sleep(0.5)  # let the server flush its log
    gets = data_gets(log_path, log_start)
    assert len(gets) == m["footer_requests"] + m["data_requests"], gets


def test_fetch_ahead_changes_when_data_is_requested_not_what_is_read(s3):
    options, expected, _ = s3
    read = {
        units: forebay.read_parquet(
            "s3://forebay-test/data/",
            columns=["id", "name"],
            storage_options=options,
            fetch_ahead=units,
            prefetch=1,
        )
        for units in (0, 1, 32)
    }
    for units, ds in read.items():
        assert_tables_equal(ds.to_arrow(), expected.select(["id", "name"]))
        assert ds.metrics()["data_bytes"] > 0, units
    with pytest.raises(ValueError, match="fetch_ahead"):
        forebay.read_parquet("s3://forebay-test/data/", storage_options=options, fetch_ahead=-1)


def test_columns_apart_are_separate_requests_unless_a_gap_is_given(s3):
    # `a` and `b` with ~440 KB of `filler` between them in each of 4 row groups: more than
    # merging may waste (1/8 of the selected bytes, at least 256 KiB), so a request each;
    # `coalesce_gap` brings back one request a row group, filler included.
    options, _, _ = s3
    rng = np.random.default_rng(5)
    n, groups = 40_000, 4
    table = pa.table(
        {
            "a": rng.integers(0, 1 << 62, n),
            "filler": pa.array([bytes(row) for row in rng.integers(0, 256, (n, 40), np.uint8)]),
            "b": rng.integers(0, 1 << 62, n),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=n // groups, compression="none")
    client = s3_client(options)
    client.put_object(Bucket="forebay-test", Key="apart/part-0.parquet", Body=buf.getvalue())
    uri = "s3://forebay-test/apart/"
    planned = forebay.read_parquet(uri, columns=["a", "b"], storage_options=options)
    merged = forebay.read_parquet(
        uri, columns=["a", "b"], storage_options=options, coalesce_gap=1 << 20
    )
    for ds in (planned, merged):
        assert_tables_equal(ds.to_arrow(), table.select(["a", "b"]))
    p, m = planned.metrics(), merged.metrics()
    assert p["data_requests"] == 2 * groups, p
    assert m["data_requests"] == groups, m
    assert m["data_bytes"] > p["data_bytes"] * 1.5, (p, m)
    with pytest.raises(ValueError, match="coalesce_gap"):
        forebay.read_parquet(uri, storage_options=options, coalesce_gap=-1)


def test_s3_filter_skips_row_groups(s3):
    options, _expected, _ = s3
    ds = forebay.read_parquet(
        "s3://forebay-test/data/part-*.parquet",
        filter=[("id", "<", 1000)],
        storage_options=options,
    )
    out = ds.to_arrow()
    assert out.column("id").to_pylist() == list(range(1000))
    m = ds.metrics()
    assert m["row_groups_pruned_by_statistics"] == FILES * ROW_GROUPS - 1, m
    # the surviving row group's filter and returned columns in one request (fetched before
    # its decoding, not a round trip per phase); nothing from the 11 pruned row groups
    assert m["data_requests"] == 1, m


def test_s3_missing_object(s3):
    options, _, _ = s3
    with pytest.raises(forebay.DatasetNotFoundError, match="nope"):
        forebay.read_parquet("s3://forebay-test/nope/x.parquet", storage_options=options)


def test_s3_hive_partition_columns_and_pruning(s3):
    options, _, _ = s3
    client = s3_client(options)
    for day in ("01", "02", "03"):
        buf = io.BytesIO()
        pq.write_table(pa.table({"x": [int(day), int(day) * 10]}), buf)
        key = f"hive/day={day}/kind=a%3Ab/part.parquet"
        client.put_object(Bucket="forebay-test", Key=key, Body=buf.getvalue())
    ds = forebay.read_parquet("s3://forebay-test/hive/", storage_options=options)
    assert ds.schema.names == ["x", "day", "kind"]
    expected = [{"x": d * m, "day": d, "kind": "a:b"} for d in (1, 2, 3) for m in (1, 10)]
    rows = ds.to_arrow().to_pylist()
    assert sorted(rows, key=lambda r: r["x"]) == sorted(expected, key=lambda r: r["x"])
    # A filter on a key: the files it rules out are neither listed twice nor opened.
    ds = forebay.read_parquet(
        "s3://forebay-test/hive", filter=[("day", ">=", 2)], storage_options=options
    )
    assert sorted(ds.to_arrow()["x"].to_pylist()) == [2, 3, 20, 30]
    m = ds.metrics()
    assert m["files_pruned_by_partition"] == 1, m
    # (the schema from the first file not ruled out: only the two files read are requested)
    assert m["footer_requests"] == 2 and m["list_requests"] == 1, m
    # Without partitioning, a key asked for says why it is not a column.
    with pytest.raises(forebay.ColumnNotFoundError, match="'day' is a hive-style partition"):
        forebay.read_parquet(
            "s3://forebay-test/hive", columns=["day"], storage_options=options, partitioning=None
        )


def test_write_parquet_to_s3_publishes_whole_objects(s3, tmp_path):
    options, _, _ = s3
    local = tmp_path / "in"
    local.mkdir()
    pq.write_table(
        pa.table({"id": np.arange(5000), "v": np.arange(5000) * 0.5}), local / "a.parquet"
    )
    result = (
        forebay.read_parquet(str(local))
        .map_batches(lambda t: t)
        .write_parquet(
            "s3://forebay-test/written/",
            rows_per_file=2000,
            concurrency=1,
            storage_options=options,
        )
    )
    assert result["rows"] == 5000 and result["files"] == 3
    back = forebay.read_parquet("s3://forebay-test/written/", storage_options=options).to_arrow()
    assert sorted(back.column("id").to_pylist()) == list(range(5000))


FROM_ENV = """
import sys, forebay
# No storage_options: the endpoint and credentials come from AWS_* variables.
table = forebay.read_parquet("s3://forebay-test/data/", columns=["id"]).to_arrow()
out = forebay.read_parquet("s3://forebay-test/data/").write_parquet(
    "s3://forebay-test/from-env/", checkpoint=forebay.Checkpoint("id", "s3://forebay-test/env-ckpt/")
)
print(table.num_rows, out["rows"])
"""


def test_s3_credentials_and_endpoint_from_the_environment(s3, tmp_path):
    options, expected, _ = s3
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ENDPOINT_URL=options["aws_endpoint"],
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION="us-east-1",
        AWS_ALLOW_HTTP="true",
    )
    run = subprocess.run(
        [sys.executable, "-c", FROM_ENV], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [str(expected.num_rows)] * 2
    # storage_options still win over the environment: a wrong endpoint in it is used.
    env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"
    ok = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, forebay; print(forebay.read_parquet('s3://forebay-test/data/', "
            "storage_options={'aws_endpoint': sys.argv[1]}).count_rows())",
            options["aws_endpoint"],
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.strip() == str(expected.num_rows)


def test_storage_options_of_any_mapping_and_value_type_mean_the_same_everywhere(s3, tmp_path):
    """Every storage_options crosses into Rust the same way: any mapping, values taken as
    their strings (``True`` is ``"True"``), in the reader, the checkpoint's index and the
    checkpointed writer alike."""
    from types import MappingProxyType

    options, expected, _ = s3
    mixed = MappingProxyType({**options, "aws_allow_http": True})
    ds = forebay.read_parquet("s3://forebay-test/data/", columns=["id"], storage_options=mixed)
    assert ds.count_rows() == expected.num_rows
    done = forebay.CheckpointFilter(pa.int64(), id_column="id")
    done.insert(pa.array(np.arange(0, 100, dtype=np.int64)))
    written = done.write("s3://forebay-test/mixed-ckpt-ids/", storage_options=mixed)
    assert written["ids"] == 100
    again = forebay.CheckpointFilter.load(
        "s3://forebay-test/mixed-ckpt-ids/", id_column="id", storage_options=mixed
    )
    assert len(again) == 100
    stats = ds.write_parquet(
        "s3://forebay-test/mixed-out/",
        storage_options=mixed,
        checkpoint=forebay.Checkpoint("id", "s3://forebay-test/mixed-ckpt/", storage_options=mixed),
    )
    assert stats["rows"] == expected.num_rows


def test_storage_option_mistakes_say_what_to_set(s3):
    """Each mistake a user makes with storage_options is an error naming what to change,
    before any request (object_store alone ignores unknown keys, so a misspelt endpoint sent
    requests to real AWS)."""
    options, _, _ = s3
    endpoint = options["aws_endpoint"]
    uri = "s3://forebay-test/data/"

    def error(opts) -> str:
        with pytest.raises(forebay.ParquetError) as raised:
            forebay.read_parquet(uri, storage_options=opts)
        return str(raised.value)

    misspelt = {k: v for k, v in options.items() if k != "aws_endpoint"}
    message = error({**misspelt, "aws_endpiont": endpoint})
    assert "'aws_endpiont'" in message and "did you mean 'aws_endpoint'?" in message, message
    assert uri in message
    message = error({**options, "google_service_account": "/k.json"})
    assert "is a GCS option" in message and "aws_* options" in message, message
    no_scheme = endpoint.removeprefix("http://")
    message = error({**options, "aws_endpoint": no_scheme})
    assert f"'{no_scheme}'" in message and "has no scheme" in message, message
    no_http = {k: v for k, v in options.items() if k != "aws_allow_http"}
    message = error(no_http)
    assert "plain HTTP" in message and "aws_allow_http" in message, message
    with pytest.raises(TypeError, match="'aws_region' must be a string"):
        forebay.read_parquet(uri, storage_options={**options, "aws_region": None})
    # The same checks guard the checkpoint and the writer, which open their stores alike.
    with pytest.raises(forebay.CheckpointError, match="did you mean 'aws_endpoint'"):
        forebay.CheckpointFilter.load(
            "s3://forebay-test/no-ckpt/", id_column="id", storage_options={"aws_endpiont": "x"}
        )
    # A bucket that does not exist is not found, said in words (not the server's XML).
    with pytest.raises(forebay.DatasetNotFoundError, match="the bucket does not exist") as gone:
        forebay.read_parquet("s3://no-such-bucket/data/", storage_options=options)
    assert "<Error>" not in str(gone.value)
    ds = forebay.read_parquet(uri, storage_options=options)
    with pytest.raises((forebay.ForebayError, ValueError), match="did you mean 'aws_region'"):
        ds.write_parquet("s3://forebay-test/never/", storage_options={**options, "aws_regoin": "x"})


NO_CREDENTIALS = """
import sys, forebay
try:
    forebay.read_parquet("s3://forebay-test/data/", storage_options={
        "aws_endpoint": sys.argv[1], "aws_allow_http": "true", "aws_region": "us-east-1"})
except forebay.StorageError as e:
    print(e)
"""


def test_missing_credentials_say_what_to_set(s3):
    """No key anywhere: object_store's last resort is the EC2 metadata service, absent here;
    the error says which options to set (not only the metadata service's answer)."""
    options, _, _ = s3

    class NoRole(BaseHTTPRequestHandler):
        """A metadata service that refuses, as the real one does off EC2 or without a role."""

        def refuse(self) -> None:
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = refuse

        def log_message(self, *args) -> None:
            pass

    metadata = ThreadingHTTPServer(("127.0.0.1", 0), NoRole)
    threading.Thread(target=metadata.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_METADATA_ENDPOINT"] = f"http://127.0.0.1:{metadata.server_address[1]}"
    try:
        run = subprocess.run(
            [sys.executable, "-c", NO_CREDENTIALS, options["aws_endpoint"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        metadata.shutdown()
    assert run.returncode == 0, run.stderr[-2000:]
    assert "no S3 credentials were found: set aws_access_key_id" in run.stdout, run.stdout


def test_pyarrow_and_fsspec_style_options_are_understood(s3):
    """Options as users write them for pyarrow's S3FileSystem and for fsspec/s3fs."""
    options, expected, _ = s3
    endpoint = options["aws_endpoint"]
    pyarrow_style = {
        "endpoint_override": endpoint.removeprefix("http://"),
        "scheme": "http",
        "access_key": "testing",
        "secret_key": "testing",
        "region": "us-east-1",
    }
    fsspec_style = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "aws_allow_http": True,
    }
    for style in (pyarrow_style, fsspec_style):
        ds = forebay.read_parquet("s3://forebay-test/data/", columns=["id"], storage_options=style)
        assert ds.count_rows() == expected.num_rows, style


def test_a_limit_after_the_read_fetches_only_the_row_groups_it_needs(s3):
    # take()/limit(n) right after the read: the scan stops at the row groups holding n rows
    # instead of fetching ahead as a whole scan does (8+ row groups at once on a store).
    options, _, _ = s3
    client = s3_client(options)
    client.create_bucket(Bucket="forebay-limit")
    rng = np.random.default_rng(7)
    table = pa.table({"x": rng.random(1_000_000), "y": rng.random(1_000_000)})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=50_000)  # 20 row groups of ~800 KB
    client.put_object(Bucket="forebay-limit", Key="t/big.parquet", Body=buf.getvalue())

    ds = forebay.read_parquet("s3://forebay-limit/t/", storage_options=options)
    assert ds.limit(5).to_arrow() == table.slice(0, 5)
    assert ds.take(3) == table.slice(0, 3).to_pylist()
    first = ds.metrics()["data_requests"]
    assert first <= 2 * 2, ds.metrics()  # one row group, each time, two columns at most
    # The limit's scan counts in the dataset's metrics like any other of its scans.
    assert ds.metrics()["row_groups_total"] == 2 * 20, ds.metrics()

    # A whole scan of the same dataset does fetch ahead (what the limit saved).
    assert ds.to_arrow().num_rows == 1_000_000
    assert ds.metrics()["data_requests"] - first >= 20


def test_write_parquet_to_a_missing_bucket_names_it_and_the_status(s3, tmp_path):
    """Without a checkpoint: the failed upload is a clear error, not a panic in an I/O
    thread ("internal error")."""
    options, _, _ = s3
    local = tmp_path / "in"
    local.mkdir()
    pq.write_table(pa.table({"id": np.arange(100)}), local / "a.parquet")
    with pytest.raises(forebay.ForebayError) as caught:
        forebay.read_parquet(str(local)).write_parquet(
            "s3://no-such-bucket/out/", storage_options=options
        )
    message = str(caught.value)
    assert "internal error" not in message and "no-such-bucket" in message, message
    assert "404" in message or "NoSuchBucket" in message or "not found" in message.lower()
