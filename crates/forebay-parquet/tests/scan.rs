//! Integration tests of the reader through the `forebay` facade: pruned scans equal a full
//! read filtered afterwards (property-tested over random data and thresholds), order and
//! provenance are deterministic, and an embedder's own object store works.

use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, StringViewArray,
};
use arrow_schema::{DataType, Field, Schema};
use arrow_select::filter::filter_record_batch;
use forebay_parquet::{DatasetSource, ParquetDataset, Predicate};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use proptest::prelude::*;

fn table(rows: usize, seed: u64) -> RecordBatch {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    let ids: Vec<i64> = (0..rows as i64).collect();
    let vals: Vec<Option<i64>> = (0..rows)
        .map(|_| {
            let v = next();
            (v % 11 != 0).then_some((v % 1000) as i64)
        })
        .collect();
    let names: Vec<String> = (0..rows).map(|i| format!("n{:03}", i % 200)).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("val", DataType::Int64, true),
        Field::new("name", DataType::Utf8, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids)) as ArrayRef,
            Arc::new(Int64Array::from(vals)),
            Arc::new(StringArray::from(names)),
        ],
    )
    .unwrap()
}

fn write(batch: &RecordBatch, row_group: usize) -> Vec<u8> {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(row_group))
        .set_statistics_enabled(EnabledStatistics::Page)
        .build();
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
    buf
}

fn read_all(ds: &ParquetDataset) -> Vec<RecordBatch> {
    ds.scan()
        .blocking_iter()
        .map(|b| b.unwrap().batch)
        .collect()
}

fn concat(batches: &[RecordBatch], schema: Arc<Schema>) -> RecordBatch {
    arrow_select::concat::concat_batches(&schema, batches).unwrap()
}

fn store_with(files: &[Vec<u8>]) -> Arc<InMemory> {
    let store = Arc::new(InMemory::new());
    forebay_parquet::block_on({
        let store = store.clone();
        let files = files.to_vec();
        async move {
            for (i, f) in files.into_iter().enumerate() {
                store
                    .put(&Path::from(format!("t/part-{i}.parquet")), f.into())
                    .await
                    .unwrap();
            }
        }
    });
    store
}

fn source(store: Arc<InMemory>) -> DatasetSource {
    DatasetSource::Store {
        store,
        display_prefix: "mem://".into(),
        paths: vec!["t/".into()],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn pruned_scan_equals_full_read_filtered(seed in 0u64..1000, lo in 0i64..1000, width in 0i64..400, id_cut in 0i64..3000) {
        let data = table(3000, seed);
        let store = store_with(&[write(&data, 250)]);
        let filter = Predicate::gt("val", lo)
            .and(Predicate::lt("val", lo + width))
            .or(Predicate::lt("id", id_cut).and(Predicate::is_null("val")));
        let ds = ParquetDataset::builder(source(store)).with_filter(filter).with_batch_size(97).build().unwrap();
        let got = concat(&read_all(&ds), data.schema());

        // reference: evaluate the same condition row by row on the full table
        let ids = data.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        let vals = data.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
        let mask: BooleanArray = (0..data.num_rows()).map(|i| {
            let v = vals.is_valid(i).then(|| vals.value(i));
            let a = v.is_some_and(|v| v > lo && v < lo + width);
            let b = ids.value(i) < id_cut && v.is_none();
            Some(a || b)
        }).collect();
        let expected = filter_record_batch(&data, &mask).unwrap();
        prop_assert_eq!(got, expected);
    }
}

/// A filter that keeps most rows: after the first row groups measured it, the others are
/// decoded whole and filtered afterwards (`scan::selectivity`), with the same rows out as
/// the RowFilter (a filter column the scan does not return is decoded too, then dropped); a
/// selective filter stays on the RowFilter.
#[test]
fn a_filter_keeping_most_rows_decodes_whole_then_filters_with_the_same_rows() {
    let data = table(6000, 7);
    let store = store_with(&[write(&data, 250), write(&data, 250)]);
    let scan = |filter: &Predicate, columns: &[&str]| {
        let ds = ParquetDataset::builder(source(store.clone()))
            .with_columns(columns.iter().copied())
            .with_filter(filter.clone())
            .with_batch_size(97)
            .build()
            .unwrap();
        let batches = read_all(&ds);
        (concat(&batches, batches[0].schema()), ds.metrics())
    };
    // val >= 50: ~86 % of rows (nulls and small values dropped).
    let most = Predicate::compare("val", forebay_parquet::CompareOp::GtEq, 50i64);
    let (got, metrics) = scan(&most, &["name", "val", "id"]);
    // The reference: both files' rows, filtered row by row.
    let vals = data
        .column(1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    let keep: BooleanArray = vals
        .iter()
        .map(|v| Some(v.is_some_and(|v| v >= 50)))
        .collect();
    let one = filter_record_batch(&data, &keep).unwrap();
    let expected = concat(&[one.clone(), one], data.schema());
    let expected_rows = expected.num_rows();
    assert_eq!(got.num_rows(), expected_rows);
    assert_eq!(got.columns().len(), 3);
    let expected: Vec<ArrayRef> = ["name", "val", "id"]
        .iter()
        .map(|c| expected.column_by_name(c).unwrap().clone())
        .collect();
    for (g, e) in got.columns().iter().zip(&expected) {
        let e = arrow_cast::cast(e, g.data_type()).unwrap();
        assert_eq!(g.as_ref(), e.as_ref());
    }
    let total = metrics.row_groups_total;
    assert!(
        metrics.row_groups_filtered_after_decoding > total / 2
            && metrics.row_groups_filtered_after_decoding < total,
        "the first row groups measure the filter, most of the rest are decoded whole: {metrics:?}"
    );
    // A selective filter (~4 %) and a filter on a column the scan does not return.
    let (_, selective) = scan(&Predicate::lt("val", 40), &["name", "val"]);
    assert_eq!(selective.row_groups_filtered_after_decoding, 0);
    let (not_returned, metrics) = scan(&most, &["id", "name"]);
    assert!(
        metrics.row_groups_filtered_after_decoding > 0,
        "{metrics:?}"
    );
    assert_eq!(not_returned.num_columns(), 2);
    for (g, e) in not_returned
        .columns()
        .iter()
        .zip([&expected[2], &expected[0]])
    {
        let e = arrow_cast::cast(e, g.data_type()).unwrap();
        assert_eq!(g.as_ref(), e.as_ref());
    }
}

#[test]
fn selective_filter_skips_row_groups_and_keeps_order() {
    let parts: Vec<Vec<u8>> = (0..3).map(|k| write(&table(2000, k), 500)).collect();
    let store = store_with(&parts);
    let ds = ParquetDataset::builder(source(store.clone()))
        .with_columns(["name", "id"])
        .with_filter(Predicate::lt("id", 400))
        .build()
        .unwrap();
    let batches: Vec<_> = ds.scan().blocking_iter().map(|b| b.unwrap()).collect();
    let files: Vec<usize> = batches.iter().map(|b| b.provenance.file_index).collect();
    assert!(
        files.windows(2).all(|w| w[0] <= w[1]),
        "file order is deterministic"
    );
    let rows: usize = batches.iter().map(|b| b.batch.num_rows()).sum();
    assert_eq!(rows, 3 * 400);
    assert_eq!(batches[0].batch.schema().field(0).name(), "name");
    let m = ds.metrics();
    assert_eq!(m.row_groups_total, 12);
    assert_eq!(m.row_groups_pruned_by_statistics, 9);
    assert_eq!(m.io.footer_requests, 3);

    // unfiltered provenance: first_row locates each batch exactly
    let all = ParquetDataset::builder(source(store))
        .with_batch_size(300)
        .build()
        .unwrap();
    for b in all.scan().blocking_iter() {
        let b = b.unwrap();
        assert_eq!(first_id(&b.batch), b.provenance.first_row.unwrap() as i64);
    }
}

/// The id (column 0) of a batch's first row.
fn first_id(batch: &RecordBatch) -> i64 {
    let ids = batch.column(0).as_any().downcast_ref::<Int64Array>();
    ids.unwrap().value(0)
}

#[test]
fn only_the_first_row_group_is_cut_into_small_batches() {
    // The scan's first batch is what a pipeline waits for before anything runs: the first
    // row group comes in batches of at most 8,192 rows, the others as `batch_size` allows.
    let parts: Vec<Vec<u8>> = (0..2).map(|k| write(&table(30_000, k), 20_000)).collect();
    let ds = ParquetDataset::builder(source(store_with(&parts)))
        .build()
        .unwrap();
    let batches: Vec<_> = ds.scan().blocking_iter().map(|b| b.unwrap()).collect();
    let sizes: Vec<usize> = batches.iter().map(|b| b.batch.num_rows()).collect();
    assert_eq!(sizes, [8192, 8192, 3616, 10_000, 20_000, 10_000]);
    for b in &batches {
        assert_eq!(first_id(&b.batch), b.provenance.first_row.unwrap() as i64);
    }
    // A smaller batch_size applies everywhere, the first row group included.
    let ds = ParquetDataset::builder(source(store_with(&parts)))
        .with_batch_size(5000)
        .build()
        .unwrap();
    assert!(read_all(&ds).iter().all(|b| b.num_rows() == 5000));
}

/// A table of kinds of column forebay's own decoders take (required integers, a date,
/// floats, decimals, string views, a nullable integer, plain strings); the flat decoder
/// test reads one of them as a dictionary, which they leave to the parquet crate.
fn mixed_table(rows: usize) -> RecordBatch {
    use arrow_array::{Date32Array, Decimal128Array, Float64Array, Int32Array};
    let n = |i: usize| (i as i64).wrapping_mul(2654435761) % 5003;
    let columns: Vec<(&str, ArrayRef, bool)> = vec![
        (
            "i64",
            Arc::new(Int64Array::from_iter_values((0..rows).map(n))),
            false,
        ),
        (
            "i32",
            Arc::new(Int32Array::from_iter_values(
                (0..rows).map(|i| (i % 7) as i32),
            )),
            false,
        ),
        (
            "date",
            Arc::new(Date32Array::from_iter_values(
                (0..rows).map(|i| (i / 100) as i32),
            )),
            false,
        ),
        (
            "f64",
            Arc::new(Float64Array::from_iter_values(
                (0..rows).map(|i| n(i) as f64 / 7.0),
            )),
            false,
        ),
        (
            "dec",
            Arc::new(
                Decimal128Array::from_iter_values((0..rows).map(|i| n(i) as i128 * 1_000_003))
                    .with_precision_and_scale(15, 2)
                    .unwrap(),
            ),
            false,
        ),
        (
            "nullable",
            Arc::new(Int64Array::from_iter(
                (0..rows).map(|i| (i % 3 != 0).then_some(n(i))),
            )),
            true,
        ),
        (
            "name",
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| format!("s{}", n(i))),
            )),
            false,
        ),
        (
            "view",
            Arc::new(StringViewArray::from_iter_values(
                (0..rows).map(|i| format!("a view of {} ✓", n(i) % 300)),
            )),
            false,
        ),
    ];
    let schema = Schema::new(
        columns
            .iter()
            .map(|(name, array, nullable)| Field::new(*name, array.data_type().clone(), *nullable))
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(
        Arc::new(schema),
        columns.into_iter().map(|(_, array, _)| array).collect(),
    )
    .unwrap()
}

#[test]
fn the_flat_decoders_read_what_the_parquet_crate_reads() {
    let data = mixed_table(20_000);
    let snappy = WriterProperties::builder()
        .set_max_row_group_row_count(Some(6_000))
        .set_data_page_row_count_limit(1_000)
        .set_write_batch_size(250)
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut snappy_file = Vec::new();
    let mut w = ArrowWriter::try_new(&mut snappy_file, data.schema(), Some(snappy)).unwrap();
    w.write(&data).unwrap();
    w.close().unwrap();
    let store = store_with(&[write(&data, 7_000), snappy_file]);
    let projections: [Option<&[&str]>; 4] = [
        None,
        Some(&["name", "dec", "view", "i32"]),
        // Only columns of its own: batches come from it alone.
        Some(&["date", "i64", "f64"]),
        // A nullable column of its own, and `name`, left to the crate (read as a dictionary).
        Some(&["nullable", "name"]),
    ];
    for columns in projections {
        // `name` as a dictionary in the last projection: a column the crate decodes, spliced
        // with the others.
        let hinted = columns == Some(&["nullable", "name"]);
        for batch_size in [999, 65_536] {
            let scan = |flat: bool| {
                let mut builder = ParquetDataset::builder(source(store.clone()))
                    .with_batch_size(batch_size)
                    .with_flat_decoder(flat);
                if let Some(columns) = columns {
                    builder = builder.with_columns(columns.iter().copied());
                }
                if hinted {
                    builder = builder.with_dictionary_columns(["name"]);
                }
                let ds = builder.build().unwrap();
                let batches = read_all(&ds);
                (ds.schema(), batches, ds.metrics().flat_decoder_chunks)
            };
            let (schema, own, own_chunks) = scan(true);
            let (crate_schema, theirs, no_chunks) = scan(false);
            assert_eq!(schema, crate_schema);
            // 3 + 4 row groups; every column is its own, unless read as a dictionary.
            let expected_chunks = match columns {
                None => 7 * 8,
                Some(columns) => 7 * (columns.len() - usize::from(hinted)),
            };
            assert_eq!(own_chunks as usize, expected_chunks, "{columns:?}");
            assert_eq!(no_chunks, 0);
            let sizes = |b: &[RecordBatch]| b.iter().map(|b| b.num_rows()).collect::<Vec<_>>();
            assert_eq!(
                sizes(&own),
                sizes(&theirs),
                "{columns:?}, batches of {batch_size}"
            );
            assert_eq!(
                concat(&own, schema.clone()),
                concat(&theirs, schema),
                "{columns:?}, batches of {batch_size}"
            );
        }
    }
    // Both files hold the data twice over.
    let ds = ParquetDataset::builder(source(store)).build().unwrap();
    let all = concat(&read_all(&ds), ds.schema());
    assert_eq!(all.slice(0, 20_000), data);
    assert_eq!(all.slice(20_000, 20_000), data);
}

#[test]
fn a_column_chunk_that_decompresses_past_the_limit_is_refused_before_it_is_read() {
    // Highly compressible strings: 16 MB of text in a file of a few KB.
    let text: Vec<String> = (0..256)
        .map(|i| format!("{i}{}", "a".repeat(64 * 1024)))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("text", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(0..256)) as ArrayRef,
            Arc::new(StringArray::from(text)),
        ],
    )
    .unwrap();
    // 8 row groups of 2 MB of text each: beyond the units decoding, the rest would be
    // fetched ahead (the store is remote), and must not be either.
    let props = WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
        .set_max_row_group_row_count(Some(32))
        .build();
    let mut file = Vec::new();
    let mut w = ArrowWriter::try_new(&mut file, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    assert!(file.len() < 64 * 1024, "{} bytes", file.len());
    let store = store_with(&[file]);
    let limited = |columns: &[&str]| {
        ParquetDataset::builder(source(store.clone()))
            .with_columns(columns.iter().copied())
            .with_max_column_chunk_bytes(1 << 20)
            .build()
            .unwrap()
    };
    let ds = limited(&["id", "text"]);
    let err = ds
        .scan()
        .blocking_iter()
        .find_map(|b| b.err())
        .expect("refused");
    let message = err.to_string();
    assert!(
        message.contains("'text'")
            && message.contains("row group 0")
            && message.contains("1048576"),
        "{message}"
    );
    assert_eq!(ds.metrics().io.data_bytes, 0, "nothing of it was fetched");
    // Without the large column the file reads.
    let rows: usize = read_all(&limited(&["id"]))
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(rows, 256);
}

/// A small file on an object store costs the scan one request: its footer request fetches
/// it whole, and its row groups are decoded from those bytes. Not under a filter (statistics
/// may prune the whole file), and not for the first file, whose footer the dataset read
/// before the scan to learn the schema.
#[test]
fn small_remote_files_are_read_with_one_request_each() {
    let tables: Vec<RecordBatch> = (0..4).map(|k| table(2000, k)).collect();
    let parts: Vec<Vec<u8>> = tables.iter().map(|t| write(t, 500)).collect();
    let store = store_with(&parts);
    let ds = ParquetDataset::builder(source(store.clone()))
        .with_columns(["id", "name"])
        .build()
        .unwrap();
    let got = read_all(&ds);
    let expected: Vec<RecordBatch> = tables
        .iter()
        .map(|t| {
            let schema = t.schema();
            t.project(&[
                schema.index_of("id").unwrap(),
                schema.index_of("name").unwrap(),
            ])
            .unwrap()
        })
        .collect();
    let schema = expected[0].schema();
    assert_eq!(concat(&got, schema.clone()), concat(&expected, schema));
    let io = ds.metrics().io;
    assert_eq!(io.footer_requests, 4, "{io:?}");
    // File 0's 4 row groups, a request each (coalesced columns); none for files 1-3.
    assert_eq!(io.data_requests, 4, "{io:?}");
    let whole: u64 = parts[1..].iter().map(|p| p.len() as u64).sum();
    assert!(io.footer_bytes >= whole, "{io:?}");

    // A second scan of the same dataset finds the footers cached and reads ranges.
    assert_eq!(read_all(&ds).len(), got.len());
    assert_eq!(ds.metrics().io.footer_requests, 4);

    // Under a filter, footers come first and the data of what survives is fetched by
    // range: each file's first row group, its filter and returned columns in one request
    // (ahead of decoding, or before it; `scan::fetch_ahead`), whether it then goes through
    // the filtering decoder or is decoded whole (`scan::selectivity`).
    let filtered = ParquetDataset::builder(source(store))
        .with_filter(Predicate::lt("id", 400))
        .build()
        .unwrap();
    let rows: usize = read_all(&filtered).iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 4 * 400);
    let metrics = filtered.metrics();
    assert_eq!(metrics.io.data_requests, 4, "{metrics:?}");
}

/// On an object store the scan requests the column chunks of the row groups after those
/// decoding (`with_fetch_ahead`): the same batches as without, each byte fetched once, and a
/// request that fails ahead of decoding ends the scan with its error, in order.
#[test]
fn remote_row_groups_are_fetched_ahead_of_decoding_and_read_once() {
    let tables: Vec<RecordBatch> = (0..3).map(|k| table(150_000, k)).collect();
    let parts: Vec<Vec<u8>> = tables.iter().map(|t| write(t, 10_000)).collect();
    assert!(parts.iter().all(|p| p.len() > 1 << 20), "not read whole");
    let store = store_with(&parts);
    let read = |fetch_ahead: usize| {
        let ds = ParquetDataset::builder(source(store.clone()))
            .with_columns(["id", "val"])
            .with_fetch_ahead(fetch_ahead)
            .build()
            .unwrap();
        let got = read_all(&ds);
        // A scan may fetch less ahead than its dataset says, and its window says so.
        let narrower = ds.scan_window_bytes_fetching_ahead(2);
        assert!(ds.scan_window_bytes_fetching_ahead(0) <= narrower);
        assert!(fetch_ahead <= 2 || narrower < ds.scan_window_bytes());
        let again: Vec<RecordBatch> = ds
            .scan_fetching_ahead(2)
            .blocking_iter()
            .map(|b| b.unwrap().batch)
            .collect();
        assert_eq!(again.len(), got.len());
        (got, ds.metrics().io)
    };
    let (ahead, io_ahead) = read(12);
    let (serial, io_serial) = read(0);
    let schema = ahead[0].schema();
    let expected: Vec<RecordBatch> = tables.iter().map(|t| t.project(&[0, 1]).unwrap()).collect();
    assert_eq!(
        concat(&ahead, schema.clone()),
        concat(&expected, schema.clone())
    );
    assert_eq!(concat(&serial, schema.clone()), concat(&expected, schema));
    // 45 row groups, their two column chunks coalesced into one request each (twice: each
    // dataset was scanned twice).
    assert_eq!(io_ahead.data_requests, 2 * 45, "{io_ahead:?}");
    assert_eq!(io_serial.data_requests, 2 * 45, "{io_serial:?}");
    assert_eq!(io_ahead.data_bytes, io_serial.data_bytes);

    // The footers are cached; then file 2 disappears: its row groups' requests fail ahead
    // of their decoding, and the scan ends with that error after files 0 and 1.
    let ds = ParquetDataset::builder(source(store.clone()))
        .with_columns(["id", "val"])
        .build()
        .unwrap();
    assert_eq!(ds.count_rows().unwrap(), 450_000);
    forebay_parquet::block_on({
        let store = store.clone();
        async move { store.delete(&Path::from("t/part-2.parquet")).await.unwrap() }
    });
    let (rows, error) = rows_until_error(&ds);
    assert_eq!(rows, 300_000);
    let error = error.expect("the scan reports the missing file");
    assert!(error.contains("part-2.parquet"), "{error}");

    // A file 2 that is no Parquet file, its footer not read yet: footers are read ahead
    // too, and the one that fails still comes after every batch of the files before it.
    forebay_parquet::block_on({
        let store = store.clone();
        async move {
            let garbage = b"this is not a Parquet file".to_vec();
            store
                .put(&Path::from("t/part-2.parquet"), garbage.into())
                .await
                .unwrap()
        }
    });
    let ds = ParquetDataset::builder(source(store.clone()))
        .with_columns(["id", "val"])
        .build()
        .unwrap();
    let (rows, error) = rows_until_error(&ds);
    assert_eq!(rows, 300_000);
    let error = error.expect("the scan reports the file that is no Parquet file");
    assert!(error.contains("part-2.parquet"), "{error}");
}

/// The rows a scan yields before its first error, and that error's message.
fn rows_until_error(ds: &ParquetDataset) -> (usize, Option<String>) {
    let mut rows = 0;
    for item in ds.scan().blocking_iter() {
        match item {
            Ok(b) => rows += b.batch.num_rows(),
            Err(e) => return (rows, Some(e.to_string())),
        }
    }
    (rows, None)
}

/// Row ranges of file 0 from proptest's `(row group, start, length)` cuts (clipped to row
/// groups of `group_rows` rows), and the slices of `data` each should read.
fn ranges_and_rows(
    data: &RecordBatch,
    group_rows: u64,
    cuts: &[(usize, u64, u64)],
) -> (Vec<forebay_parquet::RowRange>, Vec<RecordBatch>) {
    cuts.iter()
        .map(|&(rg, start, len)| {
            let end = (start + len).min(group_rows);
            let start = start.min(end - 1);
            let range = forebay_parquet::RowRange {
                file_index: 0,
                row_group: rg,
                rows: start..end,
            };
            let first = rg * group_rows as usize + start as usize;
            (range, data.slice(first, (end - start) as usize))
        })
        .unzip()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Row ranges in any order read exactly those rows (whole row groups by the flat
    /// decoders, parts by a page-index selection), equal to slices of the table.
    #[test]
    fn row_ranges_read_exactly_their_rows(seed in 0u64..1000, cuts in proptest::collection::vec((0usize..6, 0u64..250, 1u64..250), 1..12)) {
        let data = table(1500, seed);
        let store = store_with(&[write(&data, 250)]);
        let ds = ParquetDataset::builder(source(store)).for_row_ranges().build().unwrap();
        let layout = ds.row_group_layout().unwrap();
        prop_assert_eq!(&layout[0].row_group_rows, &vec![250u64; 6]);
        let (ranges, expected) = ranges_and_rows(&data, 250, &cuts);
        let got: Vec<RecordBatch> = ds.scan_row_ranges(ranges).blocking_iter().map(|b| b.unwrap().batch).collect();
        let schema = ds.schema();
        prop_assert_eq!(concat(&got, schema.clone()), concat(&expected, schema));
    }
}

#[test]
fn row_ranges_outside_the_file_or_under_a_filter_are_refused() {
    let data = table(600, 1);
    let store = store_with(&[write(&data, 250)]);
    let ds = ParquetDataset::builder(source(store.clone()))
        .build()
        .unwrap();
    let first_error = |ranges: Vec<forebay_parquet::RowRange>, ds: &ParquetDataset| {
        ds.scan_row_ranges(ranges)
            .blocking_iter()
            .find_map(|b| b.err())
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let range = |file_index, row_group, rows| forebay_parquet::RowRange {
        file_index,
        row_group,
        rows,
    };
    assert!(first_error(vec![range(1, 0, 0..5)], &ds).contains("the dataset has 1 files"));
    assert!(
        first_error(vec![range(0, 3, 0..5)], &ds).contains("row group 3 asked for, the file has 3")
    );
    assert!(first_error(vec![range(0, 2, 90..120)], &ds).contains("rows 90..120 of row group 2"));
    assert!(first_error(vec![range(0, 0, 5..5)], &ds).contains("rows 5..5"));
    let filtered = ParquetDataset::builder(source(store))
        .with_filter(Predicate::gt("id", 3))
        .build()
        .unwrap();
    assert!(first_error(vec![range(0, 0, 0..5)], &filtered).contains("with a filter"));
}

/// A host's own predicates (arrow-rs `ArrowPredicate`s, made per row group) drop rows while
/// decoding, after the scan's `Predicate`; row counts honour them; a predicate that cannot be
/// built fails the scan naming the file and row group.
#[test]
fn a_hosts_arrow_predicates_filter_rows_after_the_predicate() {
    use forebay_parquet::parquet::arrow::arrow_reader::{
        ArrowPredicate, ArrowPredicateFn, ArrowReaderMetadata,
    };
    use forebay_parquet::parquet::arrow::ProjectionMask;
    use forebay_parquet::{ArrowPredicates, RowFilterError};

    /// Rows whose id is even, or (broken) a column the file lacks.
    struct EvenIds {
        columns: Vec<String>,
        made: std::sync::atomic::AtomicUsize,
    }
    impl ArrowPredicates for EvenIds {
        fn columns(&self) -> &[String] {
            &self.columns
        }
        fn predicates(
            &self,
            file: &ArrowReaderMetadata,
            _path: &str,
            _row_group: usize,
        ) -> Result<Vec<Box<dyn ArrowPredicate>>, RowFilterError> {
            self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let root = file.schema().index_of(&self.columns[0])?;
            let mask = ProjectionMask::roots(file.parquet_schema(), [root]);
            Ok(vec![Box::new(ArrowPredicateFn::new(mask, |batch| {
                let ids = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap();
                Ok(ids.iter().map(|v| v.map(|v| v % 2 == 0)).collect())
            }))])
        }
    }
    let data = table(2000, 3);
    let store = store_with(&[write(&data, 500)]);
    let even = Arc::new(EvenIds {
        columns: vec!["id".into()],
        made: Default::default(),
    });
    let ds = ParquetDataset::builder(source(store.clone()))
        .with_filter(Predicate::lt("id", 1000))
        .with_arrow_predicates(even.clone())
        .build()
        .unwrap();
    let got = concat(&read_all(&ds), data.schema());
    let ids = got.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    let expected: Vec<i64> = (0..1000).filter(|i| i % 2 == 0).collect();
    assert_eq!(ids.values().to_vec(), expected);
    assert_eq!(
        even.made.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "made for the two row groups the filter keeps"
    );
    assert_eq!(ds.count_rows().unwrap(), 500);

    let broken = ParquetDataset::builder(source(store))
        .with_arrow_predicates(Arc::new(EvenIds {
            columns: vec!["nope".into()],
            made: Default::default(),
        }))
        .build()
        .unwrap();
    let (rows, err) = rows_until_error(&broken);
    let err = err.expect("the predicate cannot be built");
    assert_eq!(rows, 0);
    assert!(
        err.contains("mem://t/part-0.parquet") && err.contains("row group 0"),
        "{err}"
    );
}

/// A table with a list column (and nulls at both levels) written without a page index,
/// its row groups cut into many small pages: what a training stream reads in blocks.
fn lists_without_page_index(
    rows: usize,
    seed: u64,
    v2: bool,
    codec: u8,
    dictionary: bool,
) -> (RecordBatch, Vec<u8>) {
    use arrow_array::builder::{Int32Builder, ListBuilder};
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::WriterVersion;
    let base = table(rows, seed);
    let mut tokens = ListBuilder::new(Int32Builder::new());
    let mut x = seed | 1;
    for row in 0..rows {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = (x >> 40) % 40;
        if len == 39 {
            tokens.append_null();
            continue;
        }
        for i in 0..len {
            if (row as u64 + i).is_multiple_of(17) {
                tokens.values().append_null();
            } else {
                tokens.values().append_value((row as i32) * 7 + i as i32);
            }
        }
        tokens.append(true);
    }
    let tokens = Arc::new(tokens.finish()) as ArrayRef;
    let mut fields = base.schema().fields().to_vec();
    fields.push(Arc::new(Field::new(
        "tokens",
        tokens.data_type().clone(),
        true,
    )));
    let mut columns = base.columns().to_vec();
    columns.push(tokens);
    let data = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(400))
        .set_data_page_row_count_limit(23)
        .set_write_batch_size(23)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_offset_index_disabled(true)
        .set_dictionary_enabled(dictionary)
        .set_writer_version(if v2 {
            WriterVersion::PARQUET_2_0
        } else {
            WriterVersion::PARQUET_1_0
        })
        .set_compression(match codec {
            0 => Compression::UNCOMPRESSED,
            1 => Compression::SNAPPY,
            _ => Compression::ZSTD(ZstdLevel::default()),
        })
        .build();
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, data.schema(), Some(props)).unwrap();
    w.write(&data).unwrap();
    w.close().unwrap();
    (data, buf)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// In files without a page index, row ranges read exactly their rows (lists and nulls,
    /// v1 and v2 pages, three codecs, local or not), through page locations forebay finds
    /// itself.
    #[test]
    fn row_ranges_of_files_without_a_page_index_read_exactly_their_rows(
        seed in 0u64..1000,
        v2 in any::<bool>(),
        codec in 0u8..3,
        dictionary in any::<bool>(),
        cuts in proptest::collection::vec((0usize..3, 0u64..400, 1u64..120), 1..10),
    ) {
        let (data, file) = lists_without_page_index(1200, seed, v2, codec, dictionary);
        // On an object store (chunks fetched to locate their pages) or a local file (walked
        // page by page).
        let dir = tempfile::tempdir().unwrap();
        let on_disk = seed % 2 == 0;
        let source = if on_disk {
            let path = dir.path().join("part-0.parquet");
            std::fs::write(&path, &file).unwrap();
            DatasetSource::uris([path.to_str().unwrap().to_string()])
        } else {
            source(store_with(&[file]))
        };
        let ds = ParquetDataset::builder(source).for_row_ranges().with_batch_size(50).build().unwrap();
        let (ranges, expected) = ranges_and_rows(&data, 400, &cuts);
        let got: Vec<RecordBatch> = ds.scan_row_ranges(ranges.clone()).blocking_iter().map(|b| b.unwrap().batch).collect();
        let schema = ds.schema();
        prop_assert_eq!(concat(&got, schema.clone()), concat(&expected, schema));
        let partial: std::collections::HashSet<usize> =
            ranges.iter().filter(|r| r.rows != (0..400)).map(|r| r.row_group).collect();
        prop_assert_eq!(ds.metrics().row_groups_pages_located, partial.len() as u64);
    }
}

/// Once a row group's pages are located, a range of a few rows reads a few pages, not the
/// row group's chunks; and a file whose list pages start inside a row is read correctly the
/// way it was before (the crate finding its rows).
#[test]
fn a_located_row_group_reads_only_the_pages_of_a_range() {
    // (No dictionary: a range reads its column's dictionary page whole, whatever its rows.)
    let (data, file) = lists_without_page_index(1200, 7, false, 1, false);
    let file_len = file.len() as u64;
    let store = store_with(&[file]);
    // Ranges not merged, so that the bytes read are the pages read.
    let ds = ParquetDataset::builder(source(store))
        .for_row_ranges()
        .with_coalesce_gap(0)
        .build()
        .unwrap();
    let read = |row_group: usize, rows: std::ops::Range<u64>| {
        let before = ds.metrics().io.data_bytes;
        let got: Vec<RecordBatch> = ds
            .scan_row_ranges(vec![forebay_parquet::RowRange {
                file_index: 0,
                row_group,
                rows: rows.clone(),
            }])
            .blocking_iter()
            .map(|b| b.unwrap().batch)
            .collect();
        let first_row = row_group * 400 + rows.start as usize;
        let expected = data.slice(first_row, (rows.end - rows.start) as usize);
        assert_eq!(concat(&got, ds.schema()), expected);
        ds.metrics().io.data_bytes - before
    };
    // Row group 0 first: the file's metadata with located pages is made then, and row
    // group 1's locations are added to it in place.
    read(0, 5..15);
    let first = read(1, 300..310);
    assert_eq!(ds.metrics().row_groups_pages_located, 2);
    let second = read(1, 200..210);
    let third = read(1, 380..400);
    assert_eq!(ds.metrics().row_groups_pages_located, 2, "located once");
    let row_group = file_len / 3;
    assert!(
        second < row_group / 4 && third < row_group / 4,
        "a range of 10-20 rows read {second} and {third} bytes of a ~{row_group}-byte row group"
    );
    assert!(
        first >= second,
        "the first read walks the row group's chunks: {first}"
    );
}

#[test]
fn a_column_named_twice_is_refused_before_anything_is_read() {
    let store = store_with(&[write(&table(10, 1), 10)]);
    let Err(err) = ParquetDataset::builder(source(store))
        .with_columns(["id", "val", "id"])
        .build()
    else {
        panic!("a column named twice was accepted");
    };
    assert_eq!(err.kind(), forebay_parquet::ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("'id' twice"), "{err}");
}
