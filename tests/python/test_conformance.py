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


# Files where arrow-rs (which forebay decodes with) and pyarrow disagree. For each, forebay
# must still behave cleanly: raise a ForebayError naming the file, or (int96) differ only in
# values that overflow the target type in both readers. Keep this list short and explained.
KNOWN_DIFFERENCES = {
    # arrow-rs's footer decoder rejects a list element type this writer used; pyarrow accepts.
    "dict-page-offset-zero.parquet": "error",
    # A deliberately malformed dictionary page that pyarrow tolerates and arrow-rs rejects.
    "nation.dict-malformed.parquet": "error",
    # Legacy repeated group without LIST annotation: arrow-rs decodes no rows; forebay's
    # row-count check turns that into an error instead of silently returning 0 rows.
    "repeated_no_annotation.parquet": "error",
    # One INT96 value lies outside the timestamp[ns] range; both readers overflow, differently.
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
    if known == "error":
        with pytest.raises(forebay.ForebayError) as raised:
            forebay.read_parquet(str(path)).to_arrow()
        assert path.name in str(raised.value)
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
