"""The reader's contract: projection, ordering, many files, dictionaries, provenance,
zero-copy consumers, and clean errors for bad input."""

from __future__ import annotations

import os
import warnings
from datetime import date
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

import forebay
from conftest import assert_tables_equal


def make_table(n: int, offset: int = 0) -> pa.Table:
    ids = np.arange(offset, offset + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "name": pa.array([f"name-{i % 97}" for i in ids]),
            "value": ids.astype(np.float64) / 3,
            "nested": pa.array(
                [{"a": int(i), "b": {"c": f"c{i % 5}", "d": float(i)}} for i in ids],
                pa.struct(
                    [("a", pa.int64()), ("b", pa.struct([("c", pa.string()), ("d", pa.float64())]))]
                ),
            ),
            "tags": pa.array([[f"t{i % 3}"] * int(i % 3) for i in ids], pa.list_(pa.string())),
        }
    )


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    tables = []
    for k in range(5):
        t = make_table(3_000, offset=k * 3_000)
        tables.append(t)
        pq.write_table(t, root / f"part-{k}.parquet", row_group_size=700)
    (root / "_SUCCESS").write_bytes(b"")
    (root / ".part-9.parquet.crc").write_bytes(b"junk")
    return root, pa.concat_tables(tables)


def test_directory_reads_all_files_in_order_and_skips_hidden(dataset_dir):
    root, expected = dataset_dir
    ds = forebay.read_parquet(str(root))
    assert [os.path.basename(f) for f in ds.files] == [f"part-{k}.parquet" for k in range(5)]
    assert_tables_equal(ds.to_arrow(), expected)
    assert ds.count_rows() == expected.num_rows


def test_glob_and_explicit_list(dataset_dir):
    root, _expected = dataset_dir
    ds = forebay.read_parquet(str(root / "part-[13].parquet"))
    assert [os.path.basename(f) for f in ds.files] == ["part-1.parquet", "part-3.parquet"]
    ds = forebay.read_parquet([str(root / "part-4.parquet"), str(root / "part-0.parquet")])
    out = ds.to_arrow()
    assert out.column("id")[0].as_py() == 12_000 and out.column("id")[-1].as_py() == 2_999
    ds = forebay.read_parquet(str(root / "**" / "part-2.parquet"))
    assert ds.count_rows() == 3_000


def test_projection_order_and_nested_leaves(dataset_dir):
    root, expected = dataset_dir
    ds = forebay.read_parquet(str(root), columns=["value", "id"])
    assert ds.schema.names == ["value", "id"]
    assert_tables_equal(ds.to_arrow(), expected.select(["value", "id"]))
    # a nested leaf: only nested.b.c is read; the struct keeps just that path
    ds = forebay.read_parquet(str(root), columns=["nested.b.c"])
    out = ds.to_arrow()
    ref = pds.dataset(str(root)).to_table(columns={"c": pds.field("nested", "b", "c")})
    assert out.column("nested").type == pa.struct([("b", pa.struct([("c", pa.string())]))])
    assert (
        out.column("nested").combine_chunks().field("b").field("c").to_pylist()
        == ref.column("c").to_pylist()
    )


def test_projection_fetches_only_selected_column_bytes(dataset_dir):
    root, _ = dataset_dir
    path = str(root / "part-0.parquet")
    meta = pq.ParquetFile(path).metadata
    selected = sum(
        meta.row_group(r).column(c).total_compressed_size
        for r in range(meta.num_row_groups)
        for c in range(meta.num_columns)
        if meta.row_group(r).column(c).path_in_schema == "value"
    )
    ds = forebay.read_parquet(path, columns=["value"])
    ds.to_arrow()
    m = ds.metrics()
    assert m["data_bytes"] == selected, m
    assert m["footer_requests"] == 1


def test_batches_respect_batch_size_and_provenance(dataset_dir):
    root, expected = dataset_dir
    ds = forebay.read_parquet(str(root), batch_size=300)
    rows = 0
    for batch, prov in ds.iter_batches_with_provenance():
        assert batch.num_rows <= 300
        file_index = prov["file_index"]
        # provenance locates the rows exactly: file k holds ids k*3000 ...
        assert batch.column(0)[0].as_py() == file_index * 3_000 + prov["first_row"]
        assert prov["row_group_first_row"] == prov["row_group"] * 700
        rows += batch.num_rows
    assert rows == expected.num_rows


def test_dictionary_columns(dataset_dir):
    root, expected = dataset_dir
    ds = forebay.read_parquet(str(root), columns=["name"], dictionary_columns=["name"])
    assert pa.types.is_dictionary(ds.schema.field("name").type)
    out = ds.to_arrow()
    assert pa.types.is_dictionary(out.column("name").type)
    assert_tables_equal(out, expected.select(["name"]))
    with pytest.raises(forebay.ForebayError, match="value"):
        forebay.read_parquet(str(root), dictionary_columns=["value"])


def test_zero_copy_consumers(dataset_dir):
    polars = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    root, expected = dataset_dir
    ds = forebay.read_parquet(str(root), columns=["id", "value"])
    assert pa.table(ds).num_rows == expected.num_rows
    reader = pa.RecordBatchReader.from_stream(ds)
    assert reader.schema == ds.schema
    frame = polars.DataFrame(ds)
    assert frame.shape == (expected.num_rows, 2)
    assert frame["id"].sum() == sum(range(expected.num_rows))
    assert duckdb.sql("select sum(id), count(*) from ds").fetchall() == [
        (sum(range(expected.num_rows)), expected.num_rows)
    ]


def test_memory_uri_store():
    t = make_table(100)
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink)
    forebay._forebay.memory_put("memory://bucket/a/x.parquet", sink.getvalue().to_pybytes())
    ds = forebay.read_parquet("memory://bucket/a/")
    assert_tables_equal(ds.to_arrow(), t)


def test_early_stop_cancels_cleanly(dataset_dir):
    root, _ = dataset_dir
    it = iter(forebay.read_parquet(str(root), batch_size=10))
    assert next(it).num_rows == 10
    del it  # must not hang or leak a running scan


# ---------------------------------------------------------------- errors


def test_missing_file(tmp_path):
    with pytest.raises(forebay.DatasetNotFoundError, match=r"nope\.parquet"):
        forebay.read_parquet(str(tmp_path / "nope.parquet"))
    with pytest.raises(forebay.DatasetNotFoundError):
        forebay.read_parquet(str(tmp_path / "*.parquet"))


def test_not_parquet(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_text("id,name\n1,a\n")
    with pytest.raises(forebay.CorruptFileError, match=r"x.parquet.*not a Parquet file"):
        forebay.read_parquet(str(p))


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.999])
def test_truncated_file(tmp_path, keep):
    src = tmp_path / "full.parquet"
    pq.write_table(make_table(5_000), src, row_group_size=1000)
    data = src.read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(forebay.ForebayError, match=r"cut.parquet"):
        forebay.read_parquet(str(cut)).to_arrow()


def test_corrupt_footer_and_pages(tmp_path):
    src = tmp_path / "full.parquet"
    pq.write_table(make_table(5_000), src, row_group_size=1000, compression="snappy")
    data = bytearray(src.read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    bad_footer = bytearray(data)
    for i in range(len(data) - 8 - footer_len, len(data) - 8, 7):
        bad_footer[i] ^= 0xFF
    (tmp_path / "badfooter.parquet").write_bytes(bad_footer)
    with pytest.raises(forebay.ForebayError, match=r"badfooter.parquet"):
        forebay.read_parquet(str(tmp_path / "badfooter.parquet")).to_arrow()
    bad_pages = bytearray(data)
    for i in range(4, len(data) - 8 - footer_len, 5):
        bad_pages[i] ^= 0x5A
    (tmp_path / "badpages.parquet").write_bytes(bad_pages)
    with pytest.raises(forebay.ForebayError, match=r"badpages.parquet"):
        forebay.read_parquet(str(tmp_path / "badpages.parquet")).to_arrow()


def test_unknown_column_and_bad_filters(dataset_dir):
    root, _ = dataset_dir
    with pytest.raises(forebay.ColumnNotFoundError, match="nope"):
        forebay.read_parquet(str(root), columns=["id", "nope"])
    with pytest.raises(forebay.ColumnNotFoundError, match="nope"):
        forebay.read_parquet(str(root), filter=[("nope", "==", 1)])
    with pytest.raises(forebay.InvalidFilterError, match="'name'"):
        forebay.read_parquet(str(root), filter=[("name", ">", 5)])
    with pytest.raises(forebay.InvalidFilterError, match="'id'"):
        forebay.read_parquet(str(root), filter=[("id", "==", "five")])
    with pytest.raises(forebay.InvalidFilterError):
        forebay.read_parquet(str(root), filter=[("id", "~", 1)])
    with pytest.raises(forebay.InvalidFilterError):
        forebay.read_parquet(str(root), filter=[("id", "==", None)])
    with pytest.raises(forebay.InvalidFilterError):
        forebay.read_parquet(str(root), filter=[("id", "in", 3)])
    # Ray Data's filter is a pyarrow expression: the error says how to write it instead.
    with pytest.raises(forebay.InvalidFilterError, match=r"pyarrow expression .* \[\('x', '>'"):
        forebay.read_parquet(str(root), filter=pc.field("id") > 5)


def _hive_table(tmp_path):
    """A table written by pyarrow under year=/region= directories (a null year among them,
    a region with characters pyarrow percent-encodes), and pyarrow's own hive read of it."""
    table = pa.table(
        {
            "x": list(range(12)),
            "year": [2023, 2023, 2024, 2024, 2024, 2025, 2025, 2025, None, None, 2024, 2023],
            "region": [
                "eu",
                "us",
                "eu",
                "us",
                "eu",
                "eu",
                "a b:c",
                "a b:c",
                "us",
                "eu",
                "us",
                "eu",
            ],
        }
    )
    root = tmp_path / "table"
    pq.write_to_dataset(table, str(root), partition_cols=["year", "region"])
    partitioning = pds.HivePartitioning.discover(infer_dictionary=False)
    expected = pds.dataset(str(root), partitioning=partitioning).to_table()
    return root, expected


def _rows(table, *columns):
    names = list(columns) or table.schema.names
    return sorted(table.select(names).to_pylist(), key=lambda r: [str(r[n]) for n in names])


def test_hive_partition_columns_are_read_from_directories(tmp_path, monkeypatch):
    """key=value directories under a directory (or glob) given are columns, as in pyarrow,
    polars, DuckDB and Ray Data: after the files' own, typed, null for Hive's default."""
    root, expected = _hive_table(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = forebay.read_parquet(str(root))
    assert ds.schema.names == ["x", "year", "region"]
    assert ds.schema.field("year").type == pa.int64()
    assert ds.schema.field("region").type == pa.string()
    out = ds.to_arrow()
    assert _rows(out) == _rows(expected.cast(out.schema))
    assert {r["region"] for r in out.to_pylist()} == {"eu", "us", "a b:c"}
    assert sum(r["year"] is None for r in out.to_pylist()) == 2
    # columns place them, and alone they read no file column.
    picked = forebay.read_parquet(str(root), columns=["region", "x"]).to_arrow()
    assert picked.schema.names == ["region", "x"]
    assert _rows(picked) == _rows(expected, "region", "x")
    years = forebay.read_parquet(str(root), columns=["year"]).to_arrow()
    assert years.schema.names == ["year"] and years.num_rows == 12
    assert sorted(years["year"].to_pylist(), key=str) == sorted(
        expected["year"].to_pylist(), key=str
    )
    # With a union of the files' schemas too.
    union = forebay.read_parquet(str(root), schema="union", columns=["year", "x"]).to_arrow()
    assert _rows(union) == _rows(expected, "year", "x")
    assert forebay.read_parquet(str(root), schema="union", columns=["year"]).count_rows() == 12
    # A relative directory and a glob over the partitions read them too.
    monkeypatch.chdir(tmp_path)
    assert forebay.read_parquet("table").schema.names == ["x", "year", "region"]
    glob = forebay.read_parquet(str(root / "*" / "*" / "*.parquet"))
    assert glob.schema.names == ["x", "year", "region"] and glob.count_rows() == 12
    # A glob inside one partition lists nothing above it; files named one by one have no
    # partition values (as in pyarrow): the files' columns only.
    inside = forebay.read_parquet(str(root / "year=2024" / "region=eu" / "*.parquet"))
    assert inside.schema.names == ["x"]
    files = sorted(str(p) for p in root.rglob("*.parquet"))
    assert forebay.read_parquet(files).schema.names == ["x"]
    # partitioning=None: the files' columns only, and a key asked for says why it is missing.
    plain = forebay.read_parquet(str(root), partitioning=None)
    assert plain.schema.names == ["x"] and plain.count_rows() == 12
    with pytest.raises(forebay.ColumnNotFoundError) as raised:
        forebay.read_parquet(str(root), columns=["x", "year"], partitioning=None).to_arrow()
    message = str(raised.value)
    assert "'year' is a hive-style partition directory" in message, message
    assert "partitioning=" in message, message
    with pytest.raises(ValueError, match="partitioning must be 'hive' or None"):
        forebay.read_parquet(str(root), partitioning="directory")


def test_a_filter_on_partition_columns_skips_files_unread(tmp_path):
    root, expected = _hive_table(tmp_path)
    # Terms on keys alone: decided per file; the files ruled out are never opened.
    ds = forebay.read_parquet(str(root), filter=[("year", "=", 2024)])
    out = ds.to_arrow()
    assert sorted(out["x"].to_pylist()) == [2, 3, 4, 10]
    m = ds.metrics()
    assert m["files_pruned_by_partition"] == 6, m
    # (the schema comes from the first file not ruled out: only the 2 files of 2024 are read)
    assert m["footer_requests"] == 2, m
    assert forebay.read_parquet(str(root), filter=[("year", "=", 2024)]).count_rows() == 4
    # (forebay's tuple forms against the same rule in Python over pyarrow's hive read)
    cases = [
        ([("year", ">=", 2024), ("x", ">", 3)], lambda r: (r["year"] or 0) >= 2024 and r["x"] > 3),
        (
            [[("region", "=", "a b:c")], [("x", "<", 2)]],
            lambda r: r["region"] == "a b:c" or r["x"] < 2,
        ),
        ([("year", "is null")], lambda r: r["year"] is None),
        ([("year", "not in", [2023, 2025])], lambda r: r["year"] not in (2023, 2025)),
        (
            [("region", "!=", "eu"), ("year", "is not null")],
            lambda r: r["region"] != "eu" and r["year"] is not None,
        ),
    ]
    for dnf, keep in cases:
        got = forebay.read_parquet(str(root), filter=dnf).to_arrow()
        want = [r for r in expected.to_pylist() if keep(r)]
        assert _rows(got, "x", "year", "region") == _rows(
            pa.Table.from_pylist(want), "x", "year", "region"
        ), dnf
        assert forebay.read_parquet(str(root), filter=dnf).count_rows() == len(want), dnf
    # A key's terms are checked like any column's.
    with pytest.raises(forebay.InvalidFilterError, match="year"):
        forebay.read_parquet(str(root), filter=[("year", ">", "soon")])


def test_hive_layouts_that_cannot_be_read_as_one_are_errors(tmp_path):
    # Files under different keys.
    mixed = tmp_path / "mixed"
    (mixed / "year=2024").mkdir(parents=True)
    (mixed / "day=1").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), mixed / "year=2024" / "a.parquet")
    pq.write_table(pa.table({"x": [2]}), mixed / "day=1" / "b.parquet")
    with pytest.raises(
        forebay.SchemaMismatchError, match=r'partition keys \["year"\], the other file.s \["day"\]'
    ):
        forebay.read_parquet(str(mixed))
    assert forebay.read_parquet(str(mixed), partitioning=None).count_rows() == 2
    # A file with a column of a key's name: two values for one column.
    both = tmp_path / "both"
    (both / "year=2024").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1], "year": [2023]}), both / "year=2024" / "a.parquet")
    with pytest.raises(forebay.SchemaMismatchError, match="has a column 'year'"):
        forebay.read_parquet(str(both))
    plain = forebay.read_parquet(str(both), partitioning=None).to_arrow()
    assert plain.to_pylist() == [{"x": 1, "year": 2023}]


def test_hive_schema_types_keys_and_partition_base_places_named_files(tmp_path):
    root, expected = _hive_table(tmp_path)
    typed = forebay.read_parquet(str(root), hive_schema=pa.schema([("year", pa.int16())]))
    assert typed.schema.field("year").type == pa.int16()
    assert typed.schema.field("region").type == pa.string()
    assert sorted(typed.to_arrow()["year"].to_pylist(), key=str) == sorted(
        expected["year"].to_pylist(), key=str
    )
    dates = tmp_path / "dates"
    for day in ("2024-01-31", "2024-02-01"):
        (dates / f"day={day}").mkdir(parents=True)
        pq.write_table(pa.table({"x": [1]}), dates / f"day={day}" / "a.parquet")
    as_dates = forebay.read_parquet(
        str(dates),
        hive_schema=pa.schema([("day", pa.date32())]),
        filter=[("day", ">=", date(2024, 2, 1))],
    )
    assert as_dates.to_arrow().to_pylist() == [{"x": 1, "day": date(2024, 2, 1)}]
    with pytest.raises(
        forebay.SchemaMismatchError,
        match=r"day=2024-01-31.*'2024-01-31' is not a value of type Int32",
    ):
        forebay.read_parquet(str(dates), hive_schema=pa.schema([("day", pa.int32())]))
    with pytest.raises(forebay.SchemaMismatchError, match="not nullable"):
        forebay.read_parquet(
            str(root), hive_schema=pa.schema([pa.field("year", pa.int64(), nullable=False)])
        )
    with pytest.raises(forebay.ForebayError, match="'month', which no directory gives"):
        forebay.read_parquet(str(root), hive_schema=pa.schema([("month", pa.int64())]))
    with pytest.raises(TypeError, match=r"hive_schema must be a pyarrow\.Schema"):
        forebay.read_parquet(str(root), hive_schema={"year": "int64"})
    with pytest.raises(ValueError, match="need partitioning='hive'"):
        forebay.read_parquet(str(root), partitioning=None, partition_base=str(root))
    # Files named one by one take their keys from below a partition_base.
    files = sorted(str(p) for p in root.rglob("*.parquet"))
    based = forebay.read_parquet(files, partition_base=str(root))
    assert based.schema.names == ["x", "year", "region"]
    assert _rows(based.to_arrow()) == _rows(expected.cast(based.schema))
    # The longest base holding a file counts.
    inner = forebay.read_parquet(files[:1], partition_base=[str(root), os.path.dirname(files[0])])
    assert inner.schema.names == ["x"]


def test_partition_columns_flow_through_a_pipeline_and_training(tmp_path):
    root, expected = _hive_table(tmp_path)
    out = tmp_path / "out"
    forebay.read_parquet(str(root)).map_batches(lambda t: t).write_parquet(str(out))
    written = pq.read_table(str(out))
    assert _rows(written) == _rows(expected.cast(written.schema))
    stream = forebay.read_parquet(str(root), filter=[("region", "=", "us")]).training_stream(
        batch_size=2, seed=0
    )
    rows = [r for batch in stream for r in batch.to_pylist()]
    assert sorted((r["x"], r["year"], r["region"]) for r in rows) == [
        (1, 2023, "us"),
        (3, 2024, "us"),
        (8, None, "us"),
        (10, 2024, "us"),
    ]


def test_schema_mismatch_names_both_files(tmp_path):
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "0.parquet")
    pq.write_table(pa.table({"a": ["x", "y"]}), tmp_path / "1.parquet")
    with pytest.raises(forebay.SchemaMismatchError, match=r"1.parquet"):
        forebay.read_parquet(str(tmp_path)).to_arrow()


def test_unreachable_uri_fails_fast():
    import time

    start = time.monotonic()
    with pytest.raises(forebay.ForebayError):
        forebay.read_parquet(
            "s3://bucket/x.parquet",
            storage_options={
                "aws_endpoint": "http://127.0.0.1:9",
                "aws_allow_http": "true",
                "aws_access_key_id": "k",
                "aws_secret_access_key": "s",
                "aws_region": "us-east-1",
            },
        )
    assert time.monotonic() - start < 60


def test_relative_paths_with_dot_dot(tmp_path, monkeypatch):
    """`..` and `.` in a relative path resolve as the OS resolves them (a bug once reported
    such paths as missing)."""
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), data / "f.parquet")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for path in ["../data/f.parquet", "./../data/./f.parquet", "../data", "../data/*.parquet"]:
        assert forebay.read_parquet(path).to_arrow().column("x").to_pylist() == [1, 2, 3], path


@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"use_dictionary": False, "compression": "zstd"},
        {"data_page_version": "2.0", "data_page_size": 4096},
        {"dictionary_pagesize_limit": 2048, "data_page_size": 8192},
    ],
    ids=["defaults", "plain-zstd", "v2-small-pages", "dictionary-overflow"],
)
def test_files_pyarrow_writes_with_nulls_are_read_by_forebays_own_decoders(tmp_path, layout):
    """What pyarrow writes by default (every column nullable, `string`, decimals as fixed-size
    bytes) is decoded by forebay's own decoders, nulls and all, exactly as pyarrow reads it."""
    n = 20_000
    rng = np.random.default_rng(7)
    null = rng.random(n) < 0.1
    null[5_000:9_000] = True  # pages of nulls only
    mask = pa.array(null)

    def nullable(values: pa.Array) -> pa.Array:
        return pc.if_else(mask, pa.scalar(None, values.type), values)

    ints = rng.integers(-(10**12), 10**12, n)
    table = pa.table(
        {
            "i32": nullable(pa.array((ints % 1000).astype("int32"))),
            "i64": nullable(pa.array(ints)),
            "f64": nullable(pa.array(ints / 7.0)),
            "date": nullable(pa.array((ints % 20_000).astype("int32")).cast(pa.date32())),
            "dec7": nullable(
                pa.array([Decimal(int(v) % 10**13).scaleb(-2) for v in ints], pa.decimal128(15, 2))
            ),
            "dec16": nullable(
                pa.array([Decimal(int(v) * 10**20).scaleb(-4) for v in ints], pa.decimal128(38, 4))
            ),
            "ts_us": nullable(pa.array(ints, pa.timestamp("us"))),
            "ts_ns_utc": nullable(pa.array(ints, pa.timestamp("ns", tz="UTC"))),
            "short": nullable(pa.array([f"s{v % 50}" for v in ints])),
            "text": nullable(pa.array([f"ü {v} " * (1 + v % 9) for v in ints])),
            "bytes": nullable(pa.array([b"\xff" + bytes(str(v), "ascii") for v in ints])),
            "no_nulls": pa.array([f"value {v % 300}" for v in ints]),
        }
    )
    path = tmp_path / "pyarrow.parquet"
    pq.write_table(table, path, row_group_size=7_000, **layout)
    expected = pq.read_table(path)
    for batch_size in [1_000, 65_536]:
        ds = forebay.read_parquet(str(path), batch_size=batch_size)
        assert_tables_equal(ds.to_arrow(), expected, f"{layout}, batches of {batch_size}")
        # Every column of every row group (3) by forebay's own decoders.
        assert ds.metrics()["flat_decoder_chunks"] == 3 * table.num_columns
