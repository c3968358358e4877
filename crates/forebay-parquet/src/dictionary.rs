//! A column chunk's dictionary page as an Arrow array: every distinct value the chunk can
//! hold, read without its data pages.
//!
//! ```text
//!  column chunk   [ dictionary page | data page | data page | … ]
//!                   └─ fetched alone ─┘
//!                   decompressed, PLAIN values ──► Arrow array (the column's type)
//! ```
//!
//! The values describe the whole chunk only when the footer proves it: a dictionary page,
//! data pages that are all dictionary-encoded (the encoding statistics; a writer falls back
//! to PLAIN pages when its dictionary grows too large, and those values are in no
//! dictionary), no nulls (null count 0 in the statistics) and a flat column. Anything else,
//! or a page this module does not read with certainty, gives `None`: the caller decodes the
//! chunk as usual, and the usual decoder reports a corrupt file.
//!
//! Used by the scan to let a [`ScanRowFilter`](crate::ScanRowFilter) decide a row group at
//! once (see [`ScanRowFilter::decide_by_values`](crate::ScanRowFilter::decide_by_values)).

use std::ops::Range;
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int32Array, Int64Array, UInt32Array, UInt64Array};
use arrow_buffer::ArrowNativeType;
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_cast::{cast_with_options, CastOptions};
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};
use parquet::file::serialized_reader::SerializedPageReader;

use crate::io::FetchedRegion;

/// Where the dictionary page of the flat column `column` of `row_group` is, when that page
/// alone lists every value of the chunk (see the module docs); `None` otherwise.
pub(crate) fn dictionary_page_range(
    metadata: &ParquetMetaData,
    row_group: usize,
    column: &str,
) -> Option<(usize, Range<u64>)> {
    let group = metadata.row_group(row_group);
    let leaf = group.columns().iter().position(|chunk| {
        let parts = chunk.column_path().parts();
        parts.len() == 1 && parts[0] == column
    })?;
    let chunk = group.column(leaf);
    let descr = chunk.column_descr();
    if descr.max_rep_level() != 0 || descr.max_def_level() > 1 {
        return None;
    }
    let all_dictionary = chunk.page_encoding_stats_mask().is_some_and(|mask| {
        mask.is_only(Encoding::RLE_DICTIONARY) || mask.is_only(Encoding::PLAIN_DICTIONARY)
    });
    let no_nulls = chunk.statistics().and_then(|s| s.null_count_opt()) == Some(0);
    if !all_dictionary || !no_nulls {
        return None;
    }
    let start = u64::try_from(chunk.dictionary_page_offset()?).ok()?;
    let end = u64::try_from(chunk.data_page_offset()).ok()?;
    let (chunk_start, chunk_len) = chunk.byte_range();
    (start == chunk_start && start < end && end <= chunk_start + chunk_len)
        .then_some((leaf, start..end))
}

/// The values of a dictionary page fetched from `range` (by [`dictionary_page_range`]), as an
/// array of `data_type`: the column's type as the scan decodes it. `None` when the page or
/// the type is not one this reads with certainty (see the module docs).
pub(crate) fn decode_dictionary_page(
    chunk: &ColumnChunkMetaData,
    range: Range<u64>,
    bytes: Bytes,
    data_type: &DataType,
) -> Option<ArrayRef> {
    let value_type = match data_type {
        DataType::Dictionary(_, value) => value.as_ref(),
        other => other,
    };
    let region = Arc::new(FetchedRegion::new(range.start, bytes));
    let rows = usize::try_from(chunk.num_values()).ok()?;
    let mut pages = SerializedPageReader::new(region, chunk, rows, None).ok()?;
    let Ok(Some(Page::DictionaryPage {
        buf,
        num_values,
        encoding: Encoding::PLAIN | Encoding::PLAIN_DICTIONARY,
        ..
    })) = pages.get_next_page()
    else {
        return None;
    };
    let count = num_values as usize;
    match (chunk.column_type(), value_type) {
        (
            PhysicalType::BYTE_ARRAY,
            DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView,
        ) => {
            let values = plain_byte_arrays(&buf, count)?;
            // A UTF-8 check for string types (`safe: false`: an invalid value is an error, not
            // a null). A cast that fails means the decoder would have failed too; leave the
            // error to it.
            let strict = CastOptions {
                safe: false,
                ..Default::default()
            };
            cast_with_options(&values, value_type, &strict).ok()
        }
        (PhysicalType::INT64, DataType::Int64) => Some(Arc::new(Int64Array::new(
            plain_fixed(&buf, count, i64::from_le_bytes)?,
            None,
        ))),
        (PhysicalType::INT64, DataType::UInt64) => Some(Arc::new(UInt64Array::new(
            plain_fixed(&buf, count, u64::from_le_bytes)?,
            None,
        ))),
        (PhysicalType::INT32, DataType::Int32) => Some(Arc::new(Int32Array::new(
            plain_fixed(&buf, count, i32::from_le_bytes)?,
            None,
        ))),
        (PhysicalType::INT32, DataType::UInt32) => Some(Arc::new(UInt32Array::new(
            plain_fixed(&buf, count, u32::from_le_bytes)?,
            None,
        ))),
        _ => None,
    }
}

/// `count` PLAIN-encoded byte arrays (4-byte little-endian length, then the bytes) that fill
/// `page` exactly; `None` if they do not.
fn plain_byte_arrays(page: &Bytes, count: usize) -> Option<ArrayRef> {
    let mut offsets = Vec::with_capacity(count + 1);
    let mut values = Vec::with_capacity(page.len().saturating_sub(4 * count));
    offsets.push(0i32);
    let mut rest = page.as_ref();
    for _ in 0..count {
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let value = rest.get(4..4 + len)?;
        values.extend_from_slice(value);
        offsets.push(i32::try_from(values.len()).ok()?);
        rest = &rest[4 + len..];
    }
    if !rest.is_empty() {
        return None;
    }
    let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
    Some(Arc::new(BinaryArray::new(offsets, values.into(), None)))
}

/// `count` PLAIN-encoded fixed-width little-endian values that fill `page` exactly.
fn plain_fixed<T: ArrowNativeType, const WIDTH: usize>(
    page: &Bytes,
    count: usize,
    from_le_bytes: fn([u8; WIDTH]) -> T,
) -> Option<ScalarBuffer<T>> {
    if page.len() != count.checked_mul(WIDTH)? {
        return None;
    }
    let (values, _) = page.as_chunks::<WIDTH>();
    Some(values.iter().map(|bytes| from_le_bytes(*bytes)).collect())
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int32Type, Int64Type, UInt64Type};
    use arrow_array::{Array, LargeStringArray, RecordBatch, StringArray, StringViewArray};
    use arrow_cast::cast;
    use parquet::file::properties::{WriterProperties, WriterPropertiesBuilder};

    use super::*;
    use crate::test_files::{metadata_of, parquet_bytes};

    /// Write `column` as column `c` of a one-row-group file; the file's metadata and bytes.
    fn write(column: ArrayRef, props: WriterPropertiesBuilder) -> (ParquetMetaData, Bytes) {
        let batch = RecordBatch::try_from_iter([("c", column)]).unwrap();
        let bytes = parquet_bytes(&batch, props.build());
        (metadata_of(&bytes), bytes)
    }

    /// The dictionary of column `c` decoded as `data_type`, or `None` where none is read.
    fn dictionary_of(column: ArrayRef, props: WriterPropertiesBuilder) -> Option<ArrayRef> {
        let data_type = column.data_type().clone();
        let (meta, bytes) = write(column, props);
        let (leaf, range) = dictionary_page_range(&meta, 0, "c")?;
        let page = bytes.slice(range.start as usize..range.end as usize);
        decode_dictionary_page(meta.row_group(0).column(leaf), range, page, &data_type)
    }

    fn sorted_strings(values: &ArrayRef) -> Vec<String> {
        let values = cast(values, &DataType::Utf8).unwrap();
        let mut v: Vec<String> = values
            .as_string::<i32>()
            .iter()
            .map(|s| s.unwrap().to_string())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_dictionary_page_decodes_to_the_distinct_values_in_the_columns_type() {
        let words = ["b", "a", "", "été", "a", "b"];
        let distinct = vec!["", "a", "b", "été"];
        for column in [
            Arc::new(StringArray::from_iter_values(words)) as ArrayRef,
            Arc::new(LargeStringArray::from_iter_values(words)),
            Arc::new(StringViewArray::from_iter_values(words)),
            Arc::new(BinaryArray::from_iter_values(words)),
        ] {
            let data_type = column.data_type().clone();
            let values = dictionary_of(column, WriterProperties::builder()).unwrap();
            assert_eq!(values.data_type(), &data_type);
            assert_eq!(sorted_strings(&values), distinct, "{data_type}");
        }

        let ints = dictionary_of(
            Arc::new(Int64Array::from(vec![i64::MIN, 7, 7, -1])),
            WriterProperties::builder(),
        )
        .unwrap();
        let mut ints = ints.as_primitive::<Int64Type>().values().to_vec();
        ints.sort();
        assert_eq!(ints, vec![i64::MIN, -1, 7]);
        let unsigned = dictionary_of(
            Arc::new(UInt64Array::from(vec![u64::MAX, 3, 3])),
            WriterProperties::builder(),
        )
        .unwrap();
        let mut unsigned = unsigned.as_primitive::<UInt64Type>().values().to_vec();
        unsigned.sort();
        assert_eq!(unsigned, vec![3, u64::MAX]);
        let small = dictionary_of(
            Arc::new(Int32Array::from(vec![5, -5, 5])),
            WriterProperties::builder(),
        )
        .unwrap();
        assert_eq!(small.as_primitive::<Int32Type>().len(), 2);
    }

    #[test]
    fn no_dictionary_is_offered_unless_it_holds_every_value_of_the_chunk() {
        let many = || {
            Arc::new(StringArray::from_iter_values(
                (0..5000).map(|i| format!("id-{i}")),
            )) as ArrayRef
        };
        // The writer falls back to PLAIN pages once its dictionary passes the limit.
        let fallback = WriterProperties::builder()
            .set_dictionary_page_size_limit(1024)
            .set_data_page_size_limit(1024);
        assert!(dictionary_of(many(), fallback).is_none());
        // No dictionary at all.
        let plain = WriterProperties::builder().set_dictionary_enabled(false);
        assert!(dictionary_of(many(), plain).is_none());
        // Nulls are in no dictionary.
        let with_null = Arc::new(StringArray::from(vec![Some("a"), None])) as ArrayRef;
        assert!(dictionary_of(with_null, WriterProperties::builder()).is_none());
        // Without statistics the null count is unknown.
        let no_stats = WriterProperties::builder()
            .set_statistics_enabled(parquet::file::properties::EnabledStatistics::None);
        assert!(dictionary_of(many(), no_stats).is_none());
        // A type this does not read with certainty (the decoder narrows INT32 to Int8).
        let narrow = Arc::new(arrow_array::Int8Array::from(vec![1, 2])) as ArrayRef;
        assert!(dictionary_of(narrow, WriterProperties::builder()).is_none());
        // And the dictionary of a chunk that qualifies is read.
        assert_eq!(
            dictionary_of(many(), WriterProperties::builder())
                .unwrap()
                .len(),
            5000
        );
    }

    #[test]
    fn a_page_that_does_not_match_its_footer_gives_no_values() {
        let column = Arc::new(StringArray::from_iter_values(["x", "y"])) as ArrayRef;
        let (meta, bytes) = write(column, WriterProperties::builder());
        let (leaf, range) = dictionary_page_range(&meta, 0, "c").unwrap();
        let chunk = meta.row_group(0).column(leaf);
        let page = bytes.slice(range.start as usize..range.end as usize);
        // Cut short: the page header claims bytes the range does not hold.
        let short = range.start..range.end - 1;
        let cut = page.slice(..page.len() - 1);
        assert!(decode_dictionary_page(chunk, short, cut, &DataType::Utf8).is_none());
        // Not UTF-8 where the column says strings.
        let mut garbled = page.to_vec();
        let last = garbled.len() - 1;
        garbled[last] = 0xff;
        let garbled = Bytes::from(garbled);
        assert!(decode_dictionary_page(chunk, range.clone(), garbled, &DataType::Utf8).is_none());
        assert!(decode_dictionary_page(chunk, range, page, &DataType::Utf8).is_some());
    }
}
