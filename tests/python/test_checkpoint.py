"""forebay.CheckpointFilter against Python sets: every id type, flat (Ray) and partitioned
layouts, the documented on-disk hash checked with an independent XXH3 implementation, S3
through a moto server, a writer SIGKILLed mid-commit, and bad input."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay
from conftest import S3_CREDENTIALS, moto_s3

xxhash = pytest.importorskip("xxhash")


def reference_shard(value, num_shards: int) -> int:
    """Shard of an id as documented in forebay-checkpoint's fingerprint module."""
    if isinstance(value, int):
        data = value.to_bytes(16, "little", signed=True)
    elif isinstance(value, str):
        data = value.encode()
    else:
        data = bytes(value)
    fingerprint = xxhash.xxh3_128_intdigest(data) >> 28
    bits = num_shards.bit_length() - 1
    return fingerprint >> (100 - bits) if bits else 0


def random_ids(rng: random.Random, n: int) -> list:
    pool = ["", "a", "é", "🚀" * 3, "x" * 500]
    return [
        None
        if rng.random() < 0.05
        else (rng.choice(pool) if rng.random() < 0.1 else str(rng.randrange(3 * n)))
        for _ in range(n)
    ]


def test_flat_ray_layout_load_contains_filter(tmp_path):
    rng = random.Random(7)
    done = tmp_path / "ray_checkpoint"
    done.mkdir()
    reference = set()
    for k in range(5):  # a flat directory of parquet files with an id column, as Ray writes
        ids = random_ids(rng, 3000)
        reference.update(i for i in ids if i is not None)
        pq.write_table(pa.table({"id": ids, "other": list(range(len(ids)))}), done / f"{k}.parquet")
    (done / "_SUCCESS").write_text("")
    ckpt = forebay.CheckpointFilter.load(str(done), "id")
    assert len(ckpt) == len(reference)
    assert ckpt.num_shards == forebay._checkpoint_filter.DEFAULT_NUM_SHARDS
    assert ckpt.memory_bytes < 64 * len(reference) + 1_000_000

    probes = random_ids(rng, 10_000)
    expected = [p is not None and p in reference for p in probes]
    assert ckpt.contains(pa.array(probes)).to_pylist() == expected
    assert ckpt.contains(pa.chunked_array([probes[:10], probes[10:]])).to_pylist() == expected
    table = pa.table({"id": probes, "row": list(range(len(probes)))})
    kept = ckpt.filter(table)
    assert kept.schema == table.schema
    assert kept.column("row").to_pylist() == [i for i, e in enumerate(expected) if not e]
    batch = table.to_batches()[0]
    assert ckpt.filter(batch).num_rows == expected.count(False)
    fresh = table.filter(pa.array([not e for e in expected]))
    assert ckpt.filter(fresh) is fresh, "nothing removed: the input itself comes back"


@pytest.mark.parametrize(
    "id_type, values",
    [
        (pa.string(), ["a", "", "ü", "long" * 40]),
        (pa.large_string(), ["a", "", "ü"]),
        (pa.string_view(), ["a", "", "a string longer than twelve bytes"]),
        (pa.binary(), [b"\x00", b"", b"\xff\xfe"]),
        (pa.large_binary(), [b"\x00", b"", b"\xff"]),
        (pa.binary(4), [b"abcd", b"\x00\x00\x00\x00"]),
        (pa.int32(), [0, -1, 2**31 - 1]),
        (pa.int64(), [0, -1, 2**63 - 1]),
        (pa.uint32(), [0, 2**32 - 1]),
        (pa.uint64(), [0, 2**64 - 1]),
    ],
)
def test_every_id_type(tmp_path, id_type, values):
    ids = pa.array([*values, None], type=id_type)
    ckpt = forebay.CheckpointFilter(id_type, num_shards=4)
    assert ckpt.insert(ids) == len(set(values))
    assert ckpt.insert(ids) == 0
    assert len(ckpt) == len(set(values))
    assert ckpt.contains(ids).to_pylist() == [True] * len(values) + [False]
    dictionary = ids.dictionary_encode()
    assert ckpt.contains(dictionary).to_pylist() == [True] * len(values) + [False]
    # Persist and reload: same answers, ids landed in their documented shard.
    ckpt.write(str(tmp_path / "ck"))
    again = forebay.CheckpointFilter.load(str(tmp_path / "ck"), "id")
    assert again.contains(ids).to_pylist() == [True] * len(values) + [False]
    for path in (tmp_path / "ck").glob("shard=*/*.parquet"):
        shard = int(path.parent.name.split("=")[1])
        for v in pq.read_table(path).column("id").to_pylist():
            assert reference_shard(v, 4) == shard


def test_string_and_integer_families_do_not_mix():
    ckpt = forebay.CheckpointFilter("string")
    with pytest.raises(forebay.CheckpointError, match="integer"):
        ckpt.contains(pa.array([1, 2]))
    ints = forebay.CheckpointFilter(pa.int32())
    ints.insert(pa.array([5, -1], pa.int32()))
    assert ints.contains(pa.array([5, -1, 2**40], pa.int64())).to_pylist() == [True, True, False]
    assert ints.contains(pa.array([5, 2**64 - 1], pa.uint64())).to_pylist() == [True, False]


def test_partitioned_layout_matches_the_documented_hash(tmp_path):
    ids = [str(i) for i in range(50_000)]
    ckpt = forebay.CheckpointFilter("string", num_shards=8)
    ckpt.insert(pa.array(ids))
    summary = ckpt.write(str(tmp_path / "ck"))
    assert summary["ids"] == 50_000 and len(summary["files"]) == 8
    assert ckpt.pending_ids == 0
    assert ckpt.shard_ids(pa.array(ids[:100])).to_pylist() == [
        reference_shard(i, 8) for i in ids[:100]
    ]
    # Every chunk of a ChunkedArray is hashed, not only the first.
    chunked = pa.chunked_array([pa.array(ids[:60]), pa.array(ids[60:100])])
    assert ckpt.shard_ids(chunked).to_pylist() == [reference_shard(i, 8) for i in ids[:100]]
    seen = 0
    for k in range(8):
        files = list((tmp_path / "ck" / f"shard={k}").glob("part-*.parquet"))
        assert len(files) == 1
        for v in pq.read_table(files[0]).column("id").to_pylist():
            assert reference_shard(v, 8) == k
            seen += 1
    assert seen == 50_000
    # A worker owning shards {0, 5} loads only those.
    part = forebay.CheckpointFilter.load(str(tmp_path / "ck"), "id", shards=[0, 5])
    mine = [i for i in ids if reference_shard(i, 8) in (0, 5)]
    assert part.loaded_shards == [0, 5] and len(part) == len(mine)
    with pytest.raises(forebay.CheckpointError, match="shard"):
        part.contains(pa.array([next(i for i in ids if reference_shard(i, 8) == 3)]))
    # Appending a second write adds a part; reload sees both.
    more = forebay.CheckpointFilter.load(str(tmp_path / "ck"), "id")
    more.insert(pa.array(["new-1", "new-2"]))
    more.write(str(tmp_path / "ck"))
    assert len(forebay.CheckpointFilter.load(str(tmp_path / "ck"), "id")) == 50_002


def test_merge_and_threads(tmp_path):
    a = forebay.CheckpointFilter("string", num_shards=4)
    b = forebay.CheckpointFilter("large_string", num_shards=4)
    a.insert(pa.array(["x", "y"]))
    b.insert(pa.array(["y", "z"], pa.large_string()))
    a.merge(b)
    assert len(a) == 3
    with pytest.raises(forebay.CheckpointError, match="shard"):
        a.merge(forebay.CheckpointFilter("string", num_shards=8))
    # Concurrent probes from Python threads (GIL released, shared read lock).
    from concurrent.futures import ThreadPoolExecutor

    big = forebay.CheckpointFilter("string")
    big.insert(pa.array([str(i) for i in range(200_000)]))
    probe = pa.array([str(i) for i in range(100_000, 300_000)])
    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda _: big.contains(probe).true_count, range(8)))
    assert counts == [100_000] * 8


def test_bad_input_raises_checkpoint_error(tmp_path):
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": [1.5, 2.5], "name": ["a", "b"]}), path)
    with pytest.raises(
        forebay.CheckpointError, match=r"(?s)request_id.*ids\.parquet|ids\.parquet.*request_id"
    ):
        forebay.CheckpointFilter.load(str(path), "request_id")
    with pytest.raises(
        forebay.CheckpointError, match=r"ids\.parquet.*'id'.*double|ids\.parquet.*'id'.*Float64"
    ):
        forebay.CheckpointFilter.load(str(path), "id")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1 but not really")
    with pytest.raises(forebay.CheckpointError, match=r"junk\.parquet"):
        forebay.CheckpointFilter.load(str(junk), "id")
    with pytest.raises(forebay.CheckpointError, match="missing-dir"):
        forebay.CheckpointFilter.load(str(tmp_path / "missing-dir"), "id")
    with pytest.raises(forebay.CheckpointError, match="power of two"):
        forebay.CheckpointFilter("string", num_shards=10)
    with pytest.raises((forebay.CheckpointError, TypeError, ValueError)):
        forebay.CheckpointFilter(pa.float64())
    ckpt = forebay.CheckpointFilter("string")
    with pytest.raises(forebay.CheckpointError, match=r"'id'.*other"):
        ckpt.filter(pa.table({"other": ["a"]}))
    assert issubclass(forebay.CheckpointError, forebay.ForebayError)


def test_writer_killed_mid_commit_loses_nothing_committed(tmp_path):
    """A writer appends parts of 1,000 ids in a loop and is SIGKILLed at a random point:
    every committed part is loaded, and no partial file is ever read."""
    ck = tmp_path / "ck"
    script = textwrap.dedent(
        f"""
        import sys, pyarrow as pa, forebay
        ckpt = forebay.CheckpointFilter("string", num_shards=1)
        for i in range(10_000):
            ckpt.insert(pa.array([f"{{i}}-{{j}}-" + "x" * 200 for j in range(1000)]))
            ckpt.write({str(ck)!r})
            print(i, flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    committed = -1
    for line in proc.stdout:
        committed = int(line)
        if committed >= 15:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    loaded = forebay.CheckpointFilter.load(str(ck), "id")
    assert len(loaded) % 1000 == 0, "a partial part file was read"
    assert len(loaded) >= (committed + 1) * 1000, "a committed part was lost"
    assert loaded.contains(pa.array([f"{committed}-999-" + "x" * 200])).to_pylist() == [True]


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    with moto_s3(tmp_path_factory.mktemp("moto") / "server.log") as (client, endpoint):
        client.create_bucket(Bucket="ckpt")
        yield client, {"aws_endpoint": endpoint, **S3_CREDENTIALS}


def test_s3_write_and_load(s3_endpoint):
    client, options = s3_endpoint
    import io

    # Flat Ray-style files on S3.
    for k in range(3):
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": [f"{k}-{i}" for i in range(1000)]}), buf)
        client.put_object(Bucket="ckpt", Key=f"ray/{k}.parquet", Body=buf.getvalue())
    flat = forebay.CheckpointFilter.load("s3://ckpt/ray/", "id", storage_options=options)
    assert len(flat) == 3000
    # Partitioned write to S3, reload, subset of shards.
    flat.insert(pa.array([f"run-{i}" for i in range(500)]))
    summary = flat.write("s3://ckpt/forebay", storage_options=options)
    assert summary["ids"] == 500 and all(
        f.startswith("s3://ckpt/forebay/shard=") for f in summary["files"]
    )
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="ckpt", Prefix="forebay/")["Contents"]]
    assert "forebay/_forebay_checkpoint" in keys
    back = forebay.CheckpointFilter.load("s3://ckpt/forebay", "id", storage_options=options)
    assert len(back) == 500 and back.num_shards == 16
    part = forebay.CheckpointFilter.load(
        "s3://ckpt/forebay", "id", shards=[3], storage_options=options
    )
    assert len(part) == sum(1 for i in range(500) if reference_shard(f"run-{i}", 16) == 3)


def test_filter_dataset_streams_in_order_on_threads(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for k in range(30):
        ids = [f"{k}-{i}" for i in range(1000)]
        pq.write_table(
            pa.table({"id": ids, "n": list(range(k * 1000, (k + 1) * 1000))}),
            inputs / f"part-{k:02d}.parquet",
        )
    ckpt = forebay.CheckpointFilter("string")
    ckpt.insert(pa.array([f"{k}-{i}" for k in range(30) for i in range(1000) if (k + i) % 3 == 0]))
    out = list(ckpt.filter(forebay.read_parquet(str(inputs))))
    kept = [n for b in out for n in b.column("n").to_pylist()]
    expected = [k * 1000 + i for k in range(30) for i in range(1000) if (k + i) % 3 != 0]
    assert kept == expected, "filtered in parallel, delivered in scan order"
    assert all(b.schema.names == ["id", "n"] for b in out)
    # A read error mid-stream surfaces as CheckpointError naming the file.
    (inputs / "part-99.parquet").write_bytes(b"PAR1garbagePAR1")
    with pytest.raises(forebay.ForebayError, match="part-99"):
        list(ckpt.filter(forebay.read_parquet(str(inputs))))
