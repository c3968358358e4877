"""Pruning never changes results: for many filters, forebay's answer equals pyarrow's
filtering of a full read, while row groups and pages that cannot match are skipped."""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import forebay
from conftest import assert_tables_equal

ROWS = 60_000
ROW_GROUP = 2_000  # 30 row groups


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(7)
    ids = np.arange(ROWS, dtype=np.int64)  # sorted: min/max prune well
    score = rng.random(ROWS)
    score[rng.integers(0, ROWS, 500)] = np.nan
    score_mask = rng.random(ROWS) < 0.05
    cat = np.array(["alpha", "beta", "gamma", "delta", ""])[rng.integers(0, 5, ROWS)]
    cat_mask = rng.random(ROWS) < 0.05
    day = np.datetime64("2020-01-01") + (ids // 100).astype("timedelta64[D]")
    table = pa.table(
        {
            "id": ids,
            "score": pa.array(score, mask=score_mask),
            "cat": pa.array(cat, mask=cat_mask),
            "day": pa.array(day, pa.date32()),
            "small": pa.array(rng.integers(-5, 5, ROWS).astype(np.int8)),
            "flag": pa.array(rng.random(ROWS) < 0.3),
            "price": pa.array(
                [decimal.Decimal(int(v)) / 100 for v in rng.integers(0, 100000, ROWS)],
                pa.decimal128(9, 2),
            ),
            "ts": pa.array(ids * 1_000_000, pa.timestamp("us")),
            "blob": pa.array([b"k%05d" % (i % 1000) for i in range(ROWS)], pa.binary()),
            "mostly_null": pa.array(
                [i if i >= ROWS - 3000 else None for i in range(ROWS)], pa.int64()
            ),
        }
    )
    path = tmp_path_factory.mktemp("pruning") / "data.parquet"
    # plain encoding so each row group has several data pages for the page index to skip
    pq.write_table(
        table,
        path,
        row_group_size=ROW_GROUP,
        write_page_index=True,
        data_page_size=4096,
        use_dictionary=False,
    )
    return str(path), table


def pyarrow_expression(filter):
    """Independent reference: pyarrow's own filter expression for the same tuples."""

    def term(t):
        col = pc.field(t[0])
        op = t[1]
        if op in ("is null", "is not null"):
            return col.is_null() if op == "is null" else ~col.is_null()
        v = t[2]
        return {
            "=": lambda: col == v,
            "==": lambda: col == v,
            "!=": lambda: col != v,
            "<": lambda: col < v,
            "<=": lambda: col <= v,
            ">": lambda: col > v,
            ">=": lambda: col >= v,
            "in": lambda: col.isin(v),
            "not in": lambda: ~col.isin(v),
        }[op]()

    def conj(ts):
        e = term(ts[0])
        for t in ts[1:]:
            e = e & term(t)
        return e

    if isinstance(filter, tuple):
        return term(filter)
    if all(isinstance(t, tuple) for t in filter):
        return conj(filter)
    e = conj(filter[0])
    for c in filter[1:]:
        e = e | conj(c)
    return e


FILTERS = [
    ("id", "<", 5000),
    ("id", ">=", 55_000),
    ("id", "==", 12_345),
    ("id", "!=", 7),
    ("id", "in", [3, 30_000, 59_999]),
    ("id", "not in", [1, 2, 3]),
    [("id", ">", 10_000), ("id", "<=", 12_000)],
    [[("id", "<", 1000)], [("id", ">", 59_000)]],
    ("score", ">", 0.9),
    ("score", "!=", 0.5),
    ("score", "<=", 0.1),
    ("score", "is null"),
    ("score", "is not null"),
    ("cat", "==", "beta"),
    ("cat", "in", ["alpha", ""]),
    ("cat", "not in", ["alpha"]),
    ("cat", ">=", "d"),
    ("day", ">=", dt.date(2020, 6, 1)),
    ("day", "<", dt.date(2020, 1, 15)),
    ("small", ">", 2),
    ("small", "<", 0.5),
    ("flag", "==", True),
    ("price", ">", decimal.Decimal("900.00")),
    ("ts", ">=", dt.datetime(1970, 1, 1, 16, 0)),
    ("blob", "==", b"k00042"),
    ("mostly_null", "is null"),
    ("mostly_null", ">", ROWS - 10),
    [("cat", "==", "gamma"), ("score", ">", 0.5), ("id", "<", 30_000)],
]


@pytest.mark.parametrize("filter", FILTERS, ids=repr)
def test_pruned_result_equals_full_read_filtered(data, filter):
    path, table = data
    expected = table.filter(pyarrow_expression(filter))
    ds = forebay.read_parquet(path, filter=filter, batch_size=1000)
    actual = ds.to_arrow()
    assert_tables_equal(actual, expected, context=repr(filter))
    assert ds.count_rows() == expected.num_rows


@pytest.mark.parametrize(
    "filter",
    [
        ("id", "<", 5000),
        ("id", "==", 12_345),
        ("day", "<", dt.date(2020, 1, 15)),
        ("mostly_null", ">", 0),
    ],
    ids=repr,
)
def test_selective_filters_skip_row_groups_and_bytes(data, filter):
    path, _ = data
    full = forebay.read_parquet(path)
    full.to_arrow()
    ds = forebay.read_parquet(path, filter=filter)
    ds.to_arrow()
    m = ds.metrics()
    assert m["row_groups_total"] == ROWS // ROW_GROUP
    assert m["row_groups_pruned_by_statistics"] >= m["row_groups_total"] // 2, m
    assert m["data_bytes"] < full.metrics()["data_bytes"] / 2, (m, full.metrics())


def test_page_index_skips_pages_inside_row_groups(data):
    path, _table = data
    # one row group, many pages: only the page index can skip inside it
    ds = forebay.read_parquet(path, filter=[("id", ">=", 2_100), ("id", "<", 2_200)])
    out = ds.to_arrow()
    assert out.column("id").to_pylist() == list(range(2_100, 2_200))
    m = ds.metrics()
    assert m["rows_pruned_by_page_index"] > 0, m


def test_filter_on_column_not_selected(data):
    path, table = data
    ds = forebay.read_parquet(path, columns=["cat"], filter=[("id", "<", 100)])
    assert ds.schema.names == ["cat"]
    assert_tables_equal(ds.to_arrow(), table.slice(0, 100).select(["cat"]))


def test_filtered_provenance_has_no_first_row(data):
    path, _ = data
    pairs = list(
        forebay.read_parquet(path, filter=[("id", "<", 4100)]).iter_batches_with_provenance()
    )
    assert {p["row_group"] for _, p in pairs} == {0, 1, 2}
    assert all(p["first_row"] is None for _, p in pairs)
