//! The flat decoders against the parquet crate's reader, on files the crate's writer makes
//! with every layout they take: dictionary pages, PLAIN pages, a dictionary that overflows
//! into PLAIN pages mid-chunk, data page v2, many small pages, codecs.

use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BinaryArray, BinaryViewArray, Date32Array, Decimal128Array, Float32Array,
    Float64Array, Int32Array, Int64Array, RecordBatch, StringArray, StringViewArray,
};
use arrow_schema::{Field, Schema};
use arrow_select::concat::concat;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::{WriterProperties, WriterVersion};

use super::*;
use crate::io::FetchedRegion;
use crate::test_files::{metadata_of, parquet_bytes};
use parquet::column::page::{Page, PageReader};
use parquet::file::serialized_reader::SerializedPageReader;

/// A deterministic value stream: `distinct` values, so a dictionary holds them or not.
fn numbers(rows: usize, distinct: u64) -> impl Iterator<Item = i64> {
    (0..rows as u64).map(move |i| {
        let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
        (mixed % distinct) as i64 - (distinct as i64 / 2)
    })
}

/// A string for `v`: empty, short enough for a view (≤ 12 bytes), longer, or longer than
/// 128 bytes (its length prefix is not ASCII), with multi-byte characters at various places.
fn text(v: i64) -> String {
    match v.rem_euclid(5) {
        0 => String::new(),
        1 => format!("é{v}"),
        2 => format!("a longer value {v} ✓"),
        3 => format!("{}{v}€", "ü".repeat(70)),
        _ => format!("{v}"),
    }
}

/// One column of each supported type, `rows` rows of `distinct` values.
fn columns(rows: usize, distinct: u64) -> Vec<ArrayRef> {
    let n = || numbers(rows, distinct);
    vec![
        Arc::new(StringViewArray::from_iter_values(n().map(text))),
        Arc::new(BinaryViewArray::from_iter_values(n().map(|v| {
            let mut bytes = text(v).into_bytes();
            bytes.push(0xff); // not UTF-8
            bytes
        }))),
        Arc::new(StringArray::from_iter_values(n().map(text))),
        Arc::new(BinaryArray::from_iter_values(n().map(|v| {
            let mut bytes = text(v).into_bytes();
            bytes.insert(0, 0xc3); // not UTF-8
            bytes
        }))),
        Arc::new(Int32Array::from_iter_values(n().map(|v| v as i32))),
        Arc::new(Date32Array::from_iter_values(n().map(|v| v as i32))),
        Arc::new(Int64Array::from_iter_values(n().map(|v| v * 1_000_003))),
        Arc::new(Float32Array::from_iter_values(n().map(|v| v as f32 / 8.0))),
        Arc::new(Float64Array::from_iter_values(n().map(|v| v as f64 / 3.0))),
        Arc::new(
            Decimal128Array::from_iter_values(n().map(|v| v as i128))
                .with_precision_and_scale(9, 2)
                .unwrap(),
        ),
        Arc::new(
            Decimal128Array::from_iter_values(n().map(|v| v as i128 * 1_000_000_007))
                .with_precision_and_scale(18, 4)
                .unwrap(),
        ),
        Arc::new(
            arrow_array::TimestampMillisecondArray::from_iter_values(n().map(|v| v * 1_000_003))
                .with_timezone("UTC"),
        ),
        Arc::new(arrow_array::TimestampMicrosecondArray::from_iter_values(
            n().map(|v| v * 1_000_003),
        )),
        Arc::new(
            arrow_array::TimestampNanosecondArray::from_iter_values(n().map(|v| v * 1_000_003))
                .with_timezone("+02:00"),
        ),
        // Stored as FIXED_LEN_BYTE_ARRAY of 11 and 16 bytes.
        Arc::new(
            Decimal128Array::from_iter_values(n().map(|v| v as i128 * 1_000_000_000_007))
                .with_precision_and_scale(25, 3)
                .unwrap(),
        ),
        Arc::new(
            Decimal128Array::from_iter_values(n().map(|v| v as i128 * (i128::MAX / (1 << 40))))
                .with_precision_and_scale(38, 0)
                .unwrap(),
        ),
    ]
}

/// `column` with the rows `null(row)` made null.
fn with_nulls(column: &ArrayRef, null: impl Fn(usize) -> bool) -> ArrayRef {
    let validity = arrow_buffer::NullBuffer::from_iter((0..column.len()).map(|row| !null(row)));
    let data = column.to_data().into_builder().nulls(Some(validity));
    arrow_array::make_array(data.build().unwrap())
}

/// Whether a row is null.
type NullAt = fn(usize) -> bool;

/// Where nulls fall in the nullable cases: nowhere (a nullable column without nulls),
/// scattered, in long runs (pages of nulls only, and of no null), everywhere.
fn null_patterns() -> Vec<(&'static str, NullAt)> {
    vec![
        ("no nulls", |_| false),
        ("every 7th null", |row| row % 7 == 3),
        ("runs of nulls", |row| {
            (1_000..9_000).contains(&(row % 30_000)) || row % 3 == 0 && row > 60_000
        }),
        ("all null", |_| true),
    ]
}

/// Column `c` in a file; nullable (OPTIONAL) when it has nulls.
fn write(column: ArrayRef, props: WriterProperties) -> (Bytes, Arc<ParquetMetaData>) {
    write_as(column, props, false)
}

fn write_as(
    column: ArrayRef,
    props: WriterProperties,
    nullable: bool,
) -> (Bytes, Arc<ParquetMetaData>) {
    let nullable = nullable || column.null_count() > 0;
    let schema = Schema::new(vec![Field::new("c", column.data_type().clone(), nullable)]);
    let batch = RecordBatch::try_new(Arc::new(schema), vec![column]).unwrap();
    let bytes = parquet_bytes(&batch, props);
    let metadata = metadata_of(&bytes);
    (bytes, Arc::new(metadata))
}

/// The parquet crate's reading of column `c`.
fn crate_reading(bytes: &Bytes) -> ArrayRef {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
    let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(0).as_ref()).collect();
    concat(&parts).unwrap()
}

/// Column `c` read by this module, `batch` rows at a time, every row group in turn.
fn own_reading(
    bytes: &Bytes,
    metadata: &ParquetMetaData,
    batch: usize,
) -> Result<ArrayRef, String> {
    let schema = ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
        .unwrap()
        .schema()
        .clone();
    let data_type = schema.field(0).data_type();
    let mut parts = Vec::new();
    for group in metadata.row_groups() {
        let chunk = group.column(0);
        let ty = FlatType::of(chunk.column_descr(), data_type)
            .ok_or_else(|| format!("{data_type} is not taken"))?;
        assert!(
            chunk_is_supported(chunk),
            "{:?}",
            chunk.encodings().collect::<Vec<_>>()
        );
        let rows = group.num_rows() as usize;
        let mut decoder = decoder(&ty, chunk, 0, bytes.clone(), rows, &Arc::default())?;
        let mut read = 0;
        while read < rows {
            let n = batch.min(rows - read);
            let array = decoder.next_array(n)?;
            assert_eq!(array.len(), n);
            parts.push(array);
            read += n;
        }
        decoder.finish()?;
    }
    let parts: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
    Ok(concat(&parts).unwrap())
}

fn layouts() -> Vec<(&'static str, WriterProperties)> {
    let base = || WriterProperties::builder().set_max_row_group_row_count(Some(30_000));
    vec![
        ("dictionary, uncompressed", base().build()),
        (
            "dictionary, snappy, small pages",
            base()
                .set_compression(Compression::SNAPPY)
                .set_data_page_row_count_limit(777)
                .set_write_batch_size(100)
                .build(),
        ),
        (
            "PLAIN, zstd",
            base()
                .set_dictionary_enabled(false)
                .set_compression(Compression::ZSTD(ZstdLevel::default()))
                .build(),
        ),
        (
            "dictionary overflowing into PLAIN",
            base()
                .set_dictionary_page_size_limit(1024)
                .set_data_page_row_count_limit(500)
                .set_write_batch_size(100)
                .build(),
        ),
        (
            "data page v2, snappy",
            base()
                .set_writer_version(WriterVersion::PARQUET_2_0)
                // Otherwise strings fall back to DELTA_BYTE_ARRAY, left to the crate.
                .set_encoding(parquet::basic::Encoding::PLAIN)
                .set_compression(Compression::SNAPPY)
                .set_data_page_row_count_limit(3000)
                .set_write_batch_size(100)
                .build(),
        ),
    ]
}

#[test]
fn every_layout_decodes_as_the_parquet_crate_does() {
    for distinct in [1, 7, 300, 1 << 40] {
        for column in columns(70_001, distinct) {
            for (layout, props) in layouts() {
                let (bytes, metadata) = write(column.clone(), props);
                let expected = crate_reading(&bytes);
                for batch in [1_000, 65_536] {
                    let context = format!(
                        "{} with {distinct} values, {layout}, batches of {batch}",
                        column.data_type()
                    );
                    let actual = own_reading(&bytes, &metadata, batch)
                        .unwrap_or_else(|e| panic!("{context}: {e}"));
                    assert_eq!(actual.data_type(), expected.data_type(), "{context}");
                    assert_eq!(&actual, &expected, "{context}");
                }
            }
        }
    }
}

#[test]
fn nullable_columns_decode_as_the_parquet_crate_does() {
    for (pattern, null) in null_patterns() {
        for distinct in [7, 1 << 40] {
            for column in columns(70_001, distinct) {
                let column = with_nulls(&column, null);
                for (layout, props) in layouts() {
                    let (bytes, metadata) = write_as(column.clone(), props, true);
                    let leaf = metadata.row_group(0).column(0).column_descr();
                    assert_eq!(leaf.max_def_level(), 1);
                    let expected = crate_reading(&bytes);
                    assert_eq!(expected.null_count(), column.null_count());
                    for batch in [999, 65_536] {
                        let context = format!(
                            "{} with {distinct} values, {pattern}, {layout}, batches of {batch}",
                            column.data_type()
                        );
                        let actual = own_reading(&bytes, &metadata, batch)
                            .unwrap_or_else(|e| panic!("{context}: {e}"));
                        assert_eq!(actual.data_type(), expected.data_type(), "{context}");
                        assert_eq!(actual.null_count(), expected.null_count(), "{context}");
                        assert_eq!(&actual, &expected, "{context}");
                    }
                }
            }
        }
    }
}

#[test]
fn types_outside_its_reach_are_left_to_the_parquet_crate() {
    let (_, metadata) = write(
        Arc::new(Int64Array::from_iter_values(0..10)),
        WriterProperties::builder().build(),
    );
    let leaf = metadata.row_group(0).column(0).column_descr();
    assert!(FlatType::of(leaf, &DataType::Int64).is_some());
    // The scan decodes it as another type (a dictionary hint, a timestamp).
    assert!(FlatType::of(leaf, &DataType::UInt64).is_none());
    let hinted = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Int64));
    assert!(FlatType::of(leaf, &hinted).is_none());
    // A timestamp read in the unit it is stored in, not converted to another.
    let (_, stamps) = write(
        Arc::new(arrow_array::TimestampMillisecondArray::from_iter_values(
            0..10,
        )),
        WriterProperties::builder().build(),
    );
    let leaf = stamps.row_group(0).column(0).column_descr();
    let in_unit = |unit| DataType::Timestamp(unit, None);
    assert!(FlatType::of(leaf, &in_unit(arrow_schema::TimeUnit::Millisecond)).is_some());
    assert!(FlatType::of(leaf, &in_unit(arrow_schema::TimeUnit::Second)).is_none());
    assert!(FlatType::of(leaf, &in_unit(arrow_schema::TimeUnit::Microsecond)).is_none());
    // A nullable column is taken; one inside a nullable struct (two definition levels) is
    // not.
    let batch = RecordBatch::try_from_iter([(
        "c",
        Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef,
    )])
    .unwrap();
    let nullable = metadata_of(&parquet_bytes(&batch, WriterProperties::builder().build()));
    let leaf = nullable.row_group(0).column(0).column_descr();
    assert!(FlatType::of(leaf, &DataType::Int64).is_some());
    let inner = Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef;
    let fields = vec![Arc::new(Field::new("x", DataType::Int64, true))];
    let nested = arrow_array::StructArray::new(fields.into(), vec![inner], None);
    let batch =
        RecordBatch::try_from_iter_with_nullable([("s", Arc::new(nested) as ArrayRef, true)])
            .unwrap();
    let nested = metadata_of(&parquet_bytes(&batch, WriterProperties::builder().build()));
    let leaf = nested.row_group(0).column(0).column_descr();
    assert_eq!(leaf.max_def_level(), 2);
    assert!(FlatType::of(leaf, &DataType::Int64).is_none());
    // Other encodings.
    let (_, delta) = write(
        Arc::new(Int64Array::from_iter_values(0..1000)),
        WriterProperties::builder()
            .set_dictionary_enabled(false)
            .set_encoding(parquet::basic::Encoding::DELTA_BINARY_PACKED)
            .build(),
    );
    assert!(!chunk_is_supported(delta.row_group(0).column(0)));
}

#[test]
fn a_chunk_with_fewer_or_more_values_than_rows_is_an_error() {
    let (bytes, metadata) = write(
        Arc::new(Int64Array::from_iter_values(numbers(5_000, 50))),
        WriterProperties::builder().build(),
    );
    let chunk = metadata.row_group(0).column(0);
    let ty = FlatType::FixedWidth(FixedWidthType::Int64);
    let mut short = decoder(&ty, chunk, 0, bytes.clone(), 5_001, &Arc::default()).unwrap();
    let err = short.next_array(5_001).unwrap_err();
    assert!(err.contains("end after 5000"), "{err}");
    let mut long = decoder(&ty, chunk, 0, bytes.clone(), 5_000, &Arc::default()).unwrap();
    long.next_array(4_000).unwrap();
    let err = long.finish().unwrap_err();
    assert!(err.contains("more values"), "{err}");
}

/// Where `page` (a slice of `file`, as uncompressed pages are) starts in `file`.
fn offset_in(file: &Bytes, page: &Bytes) -> usize {
    page.as_ptr() as usize - file.as_ptr() as usize
}

#[test]
fn damaged_pages_give_errors_not_panics_or_wrong_lengths() {
    let (bytes, metadata) = write(
        Arc::new(Int64Array::from_iter_values(numbers(20_000, 1000))),
        WriterProperties::builder()
            .set_data_page_row_count_limit(4000)
            .set_write_batch_size(500)
            .build(),
    );
    let chunk = metadata.row_group(0).column(0);
    let (start, len) = chunk.byte_range();
    // Find the first data page's values in the file.
    let region = Arc::new(FetchedRegion::new(0, bytes.clone()));
    let mut pages = SerializedPageReader::new(region, chunk, 20_000, None).unwrap();
    let mut data_page = None;
    while let Some(page) = pages.get_next_page().unwrap() {
        if let Page::DataPage { buf, .. } = page {
            data_page = Some(offset_in(&bytes, &buf));
            break;
        }
    }
    let data_page = data_page.expect("the chunk has a data page");
    let read = |file: Bytes| -> Result<(), String> {
        let mut decoder = decoder(
            &FlatType::FixedWidth(FixedWidthType::Int64),
            chunk,
            0,
            file,
            20_000,
            &Arc::default(),
        )?;
        for _ in 0..20 {
            assert_eq!(decoder.next_array(1_000)?.len(), 1_000);
        }
        decoder.finish()
    };
    read(bytes.clone()).unwrap();
    // Indices wider than the dictionary: out of range, or running out of bytes.
    let mut wide = bytes.to_vec();
    wide[data_page] = 31;
    assert!(read(Bytes::from(wide)).is_err());
    let mut too_wide = bytes.to_vec();
    too_wide[data_page] = 40;
    let err = read(Bytes::from(too_wide)).unwrap_err();
    assert!(err.contains("40 bits"), "{err}");
    // Every byte of the chunk overwritten in turn: an error or the right number of values.
    for at in (start as usize..(start + len) as usize).step_by(7) {
        for value in [0x00, 0xff, 0x81] {
            let mut damaged = bytes.to_vec();
            damaged[at] = value;
            let _ = read(Bytes::from(damaged));
        }
    }
}

#[test]
fn damaged_nullable_pages_give_errors_not_panics_or_wrong_lengths() {
    // Every byte of a nullable chunk (levels, indices, values) overwritten in turn: the
    // decoder returns an error or arrays of the rows asked for, never panics.
    let rows = 6_000;
    let strings: ArrayRef = Arc::new(StringArray::from_iter_values(
        numbers(rows, 40).map(|v| text(v % 40)),
    ));
    let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(numbers(rows, 100)));
    let plain = WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_data_page_row_count_limit(1000)
        .set_write_batch_size(250)
        .build();
    let dictionary = WriterProperties::builder()
        .set_data_page_row_count_limit(1000)
        .set_write_batch_size(250)
        .build();
    for (column, ty) in [
        (strings, FlatType::ByteOffsets { utf8: true }),
        (ints, FlatType::FixedWidth(FixedWidthType::Int64)),
    ] {
        let column = with_nulls(&column, |row| row % 5 == 1 || (2_000..2_600).contains(&row));
        for props in [plain.clone(), dictionary.clone()] {
            let (bytes, metadata) = write(column.clone(), props);
            let chunk = metadata.row_group(0).column(0);
            let (start, len) = chunk.byte_range();
            let read = |file: Bytes| -> Result<(), String> {
                let mut decoder = decoder(&ty, chunk, 0, file, rows, &Arc::default())?;
                for _ in 0..6 {
                    assert_eq!(decoder.next_array(1_000)?.len(), 1_000);
                }
                decoder.finish()
            };
            read(bytes.clone()).unwrap();
            // Every 17th byte (the sweep runs in the unoptimised test build).
            for at in (start as usize..(start + len) as usize).step_by(17) {
                for value in [0x00, 0xff] {
                    let mut damaged = bytes.to_vec();
                    damaged[at] = value;
                    let _ = read(Bytes::from(damaged));
                }
            }
        }
    }
}

#[test]
fn a_string_column_that_is_not_utf8_is_an_error() {
    // Bytes written as binary, read as strings: in the dictionary, and in PLAIN pages.
    let values = |bad: usize| {
        BinaryViewArray::from_iter_values((0..3000usize).map(move |i| {
            if i == bad {
                vec![b'o', 0xc3] // a character cut short
            } else {
                text(i as i64 % 40).into_bytes()
            }
        }))
    };
    let layouts = [
        WriterProperties::builder().build(),
        WriterProperties::builder()
            .set_dictionary_enabled(false)
            .build(),
    ];
    for props in layouts {
        for bad in [0, 1234, 2999] {
            let (bytes, metadata) = write(Arc::new(values(bad)), props.clone());
            let chunk = metadata.row_group(0).column(0);
            let as_strings = FlatType::ByteView { utf8: true };
            let mut strings =
                decoder(&as_strings, chunk, 0, bytes.clone(), 3000, &Arc::default()).unwrap();
            let err = strings.next_array(3000).unwrap_err();
            assert!(err.contains("UTF-8"), "{err}");
            let as_binary = FlatType::ByteView { utf8: false };
            let mut binary =
                decoder(&as_binary, chunk, 0, bytes.clone(), 3000, &Arc::default()).unwrap();
            assert_eq!(binary.next_array(3000).unwrap().len(), 3000);
            for utf8 in [true, false] {
                let ty = FlatType::ByteOffsets { utf8 };
                let mut offsets =
                    decoder(&ty, chunk, 0, bytes.clone(), 3000, &Arc::default()).unwrap();
                let read = offsets.next_array(3000);
                match utf8 {
                    true => assert!(read.unwrap_err().contains("UTF-8")),
                    false => assert_eq!(read.unwrap().len(), 3000),
                }
            }
        }
    }
}

#[test]
fn a_character_cut_between_two_values_is_not_utf8() {
    // "é" is 0xc3 0xa9: the values [0xc3] and [0xa9] are valid only together.
    let values = BinaryArray::from_iter_values([b"a".as_slice(), &[0xc3], &[0xa9], b"z"]);
    // In PLAIN pages, and as entries of a dictionary (checked when it is read).
    for dictionary in [false, true] {
        let props = WriterProperties::builder()
            .set_dictionary_enabled(dictionary)
            .build();
        let (bytes, metadata) = write(Arc::new(values.clone()), props);
        let chunk = metadata.row_group(0).column(0);
        assert_eq!(chunk.dictionary_page_offset().is_some(), dictionary);
        let ty = FlatType::ByteOffsets { utf8: true };
        let read = decoder(&ty, chunk, 0, bytes, 4, &Arc::default())
            .and_then(|mut strings| strings.next_array(4));
        let err = read.unwrap_err();
        assert!(err.contains("UTF-8"), "{err}");
    }
}

#[test]
fn a_value_cut_by_the_page_end_is_an_error() {
    let mut page = Vec::new();
    for v in ["abc", "a value longer than twelve bytes"] {
        page.extend((v.len() as u32).to_le_bytes());
        page.extend(v.as_bytes());
    }
    let mut views = Vec::new();
    assert_eq!(
        byte_view::plain_views(&page, 0, 2, 0, true, &mut views).unwrap(),
        page.len()
    );
    assert_eq!(views.len(), 2);
    let err =
        byte_view::plain_views(&page[..page.len() - 1], 0, 2, 0, true, &mut views).unwrap_err();
    assert!(err.contains("beyond its page"), "{err}");
    let err = byte_view::plain_views(&page[..5], 0, 2, 0, true, &mut views).unwrap_err();
    assert!(err.contains("beyond its page"), "{err}");
}

#[test]
fn an_index_past_the_dictionary_is_an_error_unless_its_width_cannot_reach_past() {
    // One bit-packed run of 8 two-bit indices: 0 1 2 3 0 1 2 3.
    let run = Bytes::from_static(&[0b11, 0xE4, 0xE4]);
    let gather_all = |dictionary: &[i64]| {
        let mut indices = HybridIndices::new(2, run.clone()).unwrap();
        let (mut left, mut out) = (8, Vec::new());
        gather(&mut indices, dictionary, 8, &mut left, &mut out, |v| v).map(|_| out)
    };
    // Four entries: two bits cannot name a fifth, so no index is checked, and none need be.
    assert_eq!(
        gather_all(&[10, 11, 12, 13]).unwrap(),
        [10, 11, 12, 13, 10, 11, 12, 13]
    );
    // Three entries: index 3 is past the end.
    let err = gather_all(&[10, 11, 12]).unwrap_err();
    assert!(err.contains("index 3 is out of range"), "{err}");
}
