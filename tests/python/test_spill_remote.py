"""forebay.RemoteSpillTarget against an S3-compatible server (moto) started on 127.0.0.1:
one PUT for a small round, a real multipart upload (counted in the server's log) for a
large one, byte-for-byte restores, corruption and truncation reported with the object's
URI and offset, deletion when the last location is freed, removal of a dead process's
objects, and clean errors for an unreachable endpoint."""

import re
import subprocess
import time

import pytest

import forebay
from conftest import S3_CREDENTIALS, moto_s3

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

BUCKET = "spill"
MiB = 1 << 20


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    with moto_s3(log_path) as (client, endpoint):
        client.create_bucket(Bucket=BUCKET)
        yield client, {"aws_endpoint": endpoint, **S3_CREDENTIALS}, log_path


def requests_for(log_path, key_prefix: str, since: int) -> list[str]:
    raw = log_path.read_text().splitlines()[since:]
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in raw]
    return [line for line in lines if f"/{BUCKET}/{key_prefix}" in line]


def keys(client, prefix: str) -> list[str]:
    listing = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []))


def blob(n: int, seed: int) -> bytes:
    return (
        bytes((i * 131 + seed * 7 + (i >> 9)) & 0xFF for i in range(n))
        if n < 4096
        else ((bytes(range(256)) * (n // 256 + 1))[seed % 256 : seed % 256 + n])
    )


def test_small_round_is_one_put_large_round_is_multipart(s3):
    client, options, log_path = s3
    target = forebay.RemoteSpillTarget(
        f"s3://{BUCKET}/jobs/a", storage_options=options, part_size=5 * MiB, parts_in_flight=2
    )
    root_key = target.root_uri.removeprefix(f"s3://{BUCKET}/")
    assert root_key.startswith("jobs/a/")
    since = len(log_path.read_text().splitlines())

    small = [[blob(100, 1), blob(0, 2), blob(3000, 3)], [blob(17, 4)]]
    small_locs = target.spill(small, ids=[10, 11])
    large = [[blob(6 * MiB, 5), blob(5, 6)], [blob(5 * MiB + 1, 7)]]
    large_locs = target.spill(large, ids=[20, 21])

    stats = target.stats()
    assert (stats["single_puts"], stats["multipart_uploads"]) == (1, 1)
    # 6 MiB + 5 MiB of payload plus heads and padding: 3 parts of at most 5 MiB.
    assert stats["parts_uploaded"] == 3
    seen = requests_for(log_path, root_key, since)
    part_puts = [line for line in seen if '"PUT ' in line and "partNumber=" in line]
    assert len(part_puts) == 3, seen
    assert any('"POST ' in line and "uploads" in line for line in seen), seen  # create upload
    assert any('"POST ' in line and "uploadId=" in line for line in seen), seen  # complete
    plain_puts = [line for line in seen if '"PUT ' in line and "partNumber=" not in line]
    assert len(plain_puts) == 1, seen

    for objs, locs in [(small, small_locs), (large, large_locs)]:
        for obj, loc in zip(objs, locs, strict=True):
            assert loc.uri().startswith(f"s3://{BUCKET}/{root_key}/")
            assert loc.offset() % 64 == 0
            assert target.restore(loc) == obj
    assert small_locs[0].object_id() == 10 and large_locs[1].object_id() == 21
    assert len(keys(client, root_key)) == 2

    # Freed: the remote objects go away (in the background).
    for loc in small_locs + large_locs:
        loc.free()
    assert target.wait_for_deletes(30)
    assert keys(client, root_key) == []
    assert target.stats()["remote_objects_deleted"] == 2
    with pytest.raises(forebay.SpillError, match="already freed"):
        target.restore(small_locs[0])


def test_corruption_and_truncation_name_the_object_and_offset(s3):
    client, options, _ = s3
    target = forebay.RemoteSpillTarget(f"s3://{BUCKET}/jobs/c", storage_options=options)
    objs = [[blob(500, 1)], [blob(2000, 2), blob(70, 3)]]
    locs = target.spill(objs)
    loc = locs[1]
    key = loc.uri().removeprefix(f"s3://{BUCKET}/")
    pristine = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def expect_error(body: bytes, what: str):
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
        with pytest.raises(forebay.SpillError) as err:
            target.restore(loc)
        message = str(err.value)
        assert loc.uri() in message and f"offset {loc.offset()}" in message, (what, message)
        return message

    for at in [loc.offset() + 3, loc.offset() + 70, loc.offset() + 200, len(pristine) - 100]:
        damaged = bytearray(pristine)
        damaged[at] ^= 0x01
        assert "corrupt" in expect_error(bytes(damaged), f"flip at {at}")
    expect_error(pristine[: len(pristine) - 10], "truncated")
    expect_error(pristine[: loc.offset() - 1], "cut before the object")
    client.put_object(Bucket=BUCKET, Key=key, Body=pristine)
    assert target.restore(loc) == objs[1]
    assert target.restore(locs[0]) == objs[0]


def test_dead_process_objects_are_removed_on_open(s3):
    client, options, _ = s3
    probe = forebay.RemoteSpillTarget(f"s3://{BUCKET}/jobs/probe", storage_options=options)
    host = probe.root_uri.rsplit("/", 1)[1].split("-", 2)[2]
    child = subprocess.Popen(["true"])
    child.wait()
    dead_dir = f"jobs/stale/{child.pid}-00000000000000ab-{host}"
    for name in ["0.spill", "1.spill"]:
        client.put_object(Bucket=BUCKET, Key=f"{dead_dir}/{name}", Body=b"x")
    client.put_object(Bucket=BUCKET, Key="jobs/stale/keep.txt", Body=b"y")
    target = forebay.RemoteSpillTarget(f"s3://{BUCKET}/jobs/stale", storage_options=options)
    assert target.stats()["stale_objects_removed"] == 2
    assert keys(client, "jobs/stale/") == ["jobs/stale/keep.txt"]


def test_unreachable_endpoint_is_a_clean_error():
    start = time.monotonic()
    options = {**S3_CREDENTIALS, "aws_endpoint": "http://127.0.0.1:9"}
    with pytest.raises(forebay.SpillError, match="s3://nowhere/x"):
        forebay.RemoteSpillTarget("s3://nowhere/x", storage_options=options)
    assert time.monotonic() - start < 120


def test_bad_arguments():
    with pytest.raises(forebay.SpillError, match="at least 1"):
        forebay.RemoteSpillTarget("memory://spill-args", part_size=0)
    with pytest.raises(forebay.SpillError, match=r"not a valid URI|remote spill target"):
        forebay.RemoteSpillTarget("s3://", storage_options={})


def test_memory_target_round_trip():
    target = forebay.RemoteSpillTarget("memory://spill-mem/run", part_size=1000)
    objs = [[blob(5000, 9), blob(1, 1)], []]
    locs = target.spill(objs)
    assert [target.restore(loc) for loc in locs] == objs
    assert target.stats()["parts_uploaded"] >= 5
