"""Every file of Apache's parquet-testing suite reads through forebay exactly as pyarrow reads
it; files pyarrow rejects raise a ForebayError (never a crash, hang or wrong data)."""

from __future__ import annotations

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import forebay
from conftest import assert_tables_equal, parquet_testing_dir

DATA = parquet_testing_dir()
FILES = sorted(p for p in DATA.rglob("*") if p.is_file() and ".parquet" in p.name)


# Files where forebay and pyarrow disagree, each explained. Everything else must read exactly
# as pyarrow reads it (forebay-parquet's `repair` module handles the files of writers that
# arrow-rs alone refuses: dict-page-offset-zero, nation.dict-malformed,
# repeated_no_annotation).
KNOWN_DIFFERENCES = {
    # Row 5 is 290000-12-31, beyond the ±292 years of int64 nanoseconds: read as "ns" (the
    # default of both readers) it wraps. forebay gives the exact value modulo 2^64; pyarrow
    # another number. With int96_timestamp_unit="us" forebay reads the exact date (pyarrow's
    # "us" reading of that row is wrong too): test_int96_beyond_nanoseconds.
    "int96_from_spark.parquet": "int96-overflow",
}


def test_the_suite_is_there():
    assert len(FILES) > 50, f"expected the parquet-testing files in {DATA}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_reads_like_pyarrow(path):
    known = KNOWN_DIFFERENCES.get(path.name)
    try:
        expected = pq.read_table(path)
    except Exception:  # noqa: BLE001 - pyarrow's verdict is the reference
        with pytest.raises(forebay.ForebayError) as raised:
            forebay.read_parquet(str(path)).to_arrow()
        assert str(path.name) in str(raised.value), "the error names the file"
        return
    actual = forebay.read_parquet(str(path)).to_arrow()
    if known == "int96-overflow":
        in_range = pc.and_(
            pc.greater(pc.cast(expected.column(0), "int64"), -(2**62)),
            pc.less(pc.cast(expected.column(0), "int64"), 2**62 - 1),
        )
        # rows whose value fits agree; the out-of-range one is documented above
        expected, actual = expected.filter(in_range), actual.filter(in_range)
    assert_tables_equal(actual, expected, context=path.name)


@pytest.mark.parametrize("path", FILES[:40], ids=lambda p: str(p.relative_to(DATA)))
def test_count_rows_from_footer(path):
    try:
        expected = pq.ParquetFile(path).metadata.num_rows
    except Exception:  # noqa: BLE001
        pytest.skip("pyarrow cannot read this footer")
    try:
        assert forebay.read_parquet(str(path)).count_rows() == expected
    except forebay.ForebayError:
        pytest.skip("forebay rejects this file (covered by test_reads_like_pyarrow)")


def test_int96_beyond_nanoseconds():
    """Dates nanoseconds cannot hold read exactly in microseconds.

    The file's README gives the values Spark wrote; the last is 290000-12-31T01:00:00+02:00.
    pyarrow agrees on the first five rows; for the sixth its "us" reading is wrong too (it
    goes through nanoseconds), so that row is checked against the exact value.
    """
    path = DATA / "int96_from_spark.parquet"
    expected = pq.read_table(path, coerce_int96_timestamp_unit="us")
    actual = forebay.read_parquet(str(path), int96_timestamp_unit="us").to_arrow()
    assert actual.schema.field("a").type == expected.schema.field("a").type
    assert_tables_equal(actual.slice(0, 5), expected.slice(0, 5), context=path.name)
    # 290000-12-30T23:00:00Z in microseconds (Python's datetime stops at year 9999).
    assert actual.column("a").cast("int64")[5].as_py() == 9_089_380_393_200_000_000
    with pytest.raises(ValueError, match="int96_timestamp_unit"):
        forebay.read_parquet(str(path), int96_timestamp_unit="minutes")


@pytest.mark.parametrize(
    "name",
    [
        "dict-page-offset-zero.parquet",
        "nation.dict-malformed.parquet",
        "repeated_no_annotation.parquet",
    ],
)
def test_repaired_files_read_every_column_alone(name):
    """The repaired footers serve projections too (each column chunk located on its own)."""
    path = DATA / name
    expected = pq.read_table(path)
    for column in expected.column_names:
        actual = forebay.read_parquet(str(path), columns=[column]).to_arrow()
        assert_tables_equal(actual, expected.select([column]), context=f"{name}:{column}")
