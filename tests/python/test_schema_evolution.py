"""read_parquet(schema=...): files whose columns differ read as one table (a union, or a schema
given), nulls where a file lacks a column, widening by the documented rule, clear errors."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay


@pytest.fixture
def generations(tmp_path):
    """A table over time: id int32 then int64; name dropped; score added as float32, then
    float64."""
    pq.write_table(
        pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]}), tmp_path / "a.parquet"
    )
    pq.write_table(
        pa.table(
            {
                "id": pa.array([3, 4], pa.int64()),
                "name": ["c", "d"],
                "score": pa.array([0.5, 1.5], pa.float32()),
            }
        ),
        tmp_path / "b.parquet",
    )
    pq.write_table(
        pa.table({"score": [2.5], "id": pa.array([5], pa.int32())}), tmp_path / "c.parquet"
    )
    return tmp_path


def test_files_that_differ_are_refused_by_default_and_read_as_their_union(generations):
    with pytest.raises(forebay.SchemaMismatchError, match=r"b\.parquet"):
        forebay.read_parquet(generations).to_arrow()
    ds = forebay.read_parquet(generations, schema="union")
    assert ds.schema == pa.schema(
        [("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())]
    )
    table = ds.to_arrow()
    assert table.to_pydict() == {
        "id": [1, 2, 3, 4, 5],
        "name": ["a", "b", "c", "d", None],
        "score": [None, None, 0.5, 1.5, 2.5],
    }
    assert ds.count() == 5
    picked = forebay.read_parquet(
        generations, schema="union", columns=["score", "id"], filter=[("id", ">", 3)]
    )
    assert picked.to_arrow().to_pydict() == {"score": [1.5, 2.5], "id": [4, 5]}
    # A dataset pickles as its read_parquet call (Ray tasks, loader workers).
    assert pickle.loads(pickle.dumps(ds)).to_arrow().equals(table)


def test_a_schema_given_is_what_every_file_reads_as(generations):
    schema = pa.schema([("id", pa.int64()), ("score", pa.float64()), ("comment", pa.string())])
    table = forebay.read_parquet(generations, schema=schema).to_arrow()
    assert table.schema == schema
    assert table.column("comment").null_count == 5
    narrower = pa.schema([("id", pa.int32())])
    with pytest.raises(forebay.SchemaMismatchError, match=r"b\.parquet.*'id' is Int64 here, Int32"):
        forebay.read_parquet(generations, schema=narrower).to_arrow()
    with pytest.raises(TypeError, match=r"pyarrow\.Schema, 'union' or None"):
        forebay.read_parquet(generations, schema={"id": "int64"})
    with pytest.raises(forebay.SchemaMismatchError, match="neither widens"):
        pq.write_table(pa.table({"id": ["x"]}), generations / "d.parquet")
        forebay.read_parquet(generations, schema="union")


def test_files_with_their_columns_in_another_order_say_so_and_read_by_name(tmp_path):
    pq.write_table(pa.table({"a": [1], "b": ["x"]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"b": ["y"], "a": [2]}), tmp_path / "2.parquet")
    with pytest.raises(forebay.SchemaMismatchError) as raised:
        forebay.read_parquet(str(tmp_path)).to_arrow()
    message = str(raised.value)
    assert "2.parquet" in message and "same columns in another order" in message, message
    assert 'schema="union"' in message, message
    table = forebay.read_parquet(str(tmp_path), schema="union").to_arrow()
    assert table.to_pylist() == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    # Columns named pick the same order from every file.
    assert forebay.read_parquet(str(tmp_path), columns=["b", "a"]).to_arrow().column_names == [
        "b",
        "a",
    ]
