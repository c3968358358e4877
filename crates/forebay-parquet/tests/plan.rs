//! Planning for a host engine: the scan's units with sizes and statistics, scans of chosen
//! units, and limits.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use forebay_parquet::{DatasetSource, ParquetDataset, Predicate, RowRange, ScanUnit};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

const FILES: i64 = 3;
const ROWS_PER_FILE: i64 = 4_000;
const ROW_GROUP_ROWS: usize = 1_000;

/// Files of `id` (0.. across files) and `name`; `name` has no statistics in file 1.
fn dataset_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in 0..FILES {
        let first = f * ROWS_PER_FILE;
        let ids = Int64Array::from_iter_values(first..first + ROWS_PER_FILE);
        let names = StringArray::from_iter_values(
            (first..first + ROWS_PER_FILE).map(|i| format!("n{i:06}")),
        );
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(ids) as ArrayRef),
            ("name", Arc::new(names) as ArrayRef),
        ])
        .unwrap();
        let mut props =
            WriterProperties::builder().set_max_row_group_row_count(Some(ROW_GROUP_ROWS));
        if f == 1 {
            props = props.set_column_statistics_enabled("name".into(), EnabledStatistics::None);
        }
        let file = std::fs::File::create(dir.path().join(format!("part-{f}.parquet"))).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props.build())).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
    dir
}

fn open(dir: &tempfile::TempDir) -> forebay_parquet::ParquetDatasetBuilder {
    ParquetDataset::builder(DatasetSource::uris([dir.path().display().to_string()]))
}

fn ids(stream: forebay_parquet::ScanStream) -> Vec<i64> {
    stream
        .blocking_iter()
        .flat_map(|b| {
            let batch = b.unwrap().batch;
            let ids = batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            ids.values().to_vec()
        })
        .collect()
}

fn scalar_i64(value: &Option<ArrayRef>) -> Option<i64> {
    value
        .as_ref()
        .map(|a| a.as_any().downcast_ref::<Int64Array>().unwrap().value(0))
}

#[test]
fn the_plan_is_the_scans_units_with_sizes_and_statistics() {
    let dir = dataset_dir();
    // Rows 1500..=9499: row groups 1.. of file 0, all of file 1, 0..=1 of file 2.
    let filter = Predicate::gt("id", 1_499).and(Predicate::lt("id", 9_500));
    let dataset = open(&dir).with_filter(filter).build().unwrap();
    let plan = dataset.plan().unwrap();
    let units: Vec<(usize, usize)> = plan.iter().map(|u| (u.file_index, u.row_group)).collect();
    let expected: Vec<(usize, usize)> = (1..4)
        .map(|rg| (0, rg))
        .chain((0..4).map(|rg| (1, rg)))
        .chain((0..2).map(|rg| (2, rg)))
        .collect();
    assert_eq!(units, expected);
    for unit in &plan {
        let first =
            unit.file_index as i64 * ROWS_PER_FILE + (unit.row_group * ROW_GROUP_ROWS) as i64;
        assert_eq!(unit.rows, ROW_GROUP_ROWS as u64);
        assert!(unit.rows_to_read <= unit.rows);
        assert!(unit.compressed_bytes > 0 && unit.decoded_bytes >= unit.rows * 8);
        let id = &unit.columns[0];
        assert_eq!(id.column, "id");
        assert_eq!(scalar_i64(&id.min), Some(first), "{unit:?}");
        assert_eq!(scalar_i64(&id.max), Some(first + ROW_GROUP_ROWS as i64 - 1));
        assert_eq!(id.null_count, Some(0));
        let name = &unit.columns[1];
        if unit.file_index == 1 {
            assert!(
                name.min.is_none() && name.max.is_none(),
                "written without statistics"
            );
        } else {
            let min = name.min.as_ref().unwrap();
            let min = min.as_any().downcast_ref::<StringArray>().unwrap().value(0);
            assert_eq!(min, format!("n{first:06}"));
        }
    }
    // The plan's counts do not touch the scans'.
    assert_eq!(dataset.metrics().row_groups_total, 0);

    // Two partitions of the plan, scanned apart, read what one scan reads, once.
    let (left, right): (Vec<ScanUnit>, Vec<ScanUnit>) =
        plan.iter().cloned().partition(|u| u.row_group % 2 == 0);
    let mut both = ids(dataset.scan_units(&left));
    both.extend(ids(dataset.scan_units(&right)));
    both.sort_unstable();
    assert_eq!(both, (1_500..9_500).collect::<Vec<_>>());
    assert_eq!(ids(dataset.scan_units(&[])), Vec::<i64>::new());
}

#[test]
fn a_limit_yields_the_first_rows_and_reads_no_row_group_past_them() {
    let dir = dataset_dir();
    let full = open(&dir).with_prefetch(1).build().unwrap();
    assert_eq!(ids(full.scan()).len() as i64, FILES * ROWS_PER_FILE);
    let full_bytes = full.metrics().io.data_bytes;

    let limited = open(&dir)
        .with_limit(1_234)
        .with_prefetch(1)
        .with_batch_size(500)
        .build()
        .unwrap();
    assert_eq!(limited.count_rows().unwrap(), 1_234);
    assert_eq!(ids(limited.scan()), (0..1_234).collect::<Vec<_>>());
    // Two of the twelve row groups hold the rows: nothing past them was fetched.
    let bytes = limited.metrics().io.data_bytes;
    assert!(bytes * 4 < full_bytes, "{bytes} of {full_bytes} bytes read");
    // The same from async code, and for row ranges.
    let from_async =
        forebay_parquet::block_on(async move { futures::StreamExt::count(limited.scan()).await });
    assert_eq!(from_async, 3); // 500 + 500 + 234
    let ranges = vec![RowRange {
        file_index: 2,
        row_group: 3,
        rows: 0..1_000,
    }];
    let ranged = open(&dir).with_limit(10).for_row_ranges().build().unwrap();
    assert_eq!(
        ids(ranged.scan_row_ranges(ranges)),
        (11_000..11_010).collect::<Vec<_>>()
    );

    // Under a filter the limit counts the rows that match.
    let filtered = open(&dir)
        .with_filter(Predicate::gt("id", 5_000))
        .with_limit(7)
        .build()
        .unwrap();
    assert_eq!(ids(filtered.scan()), (5_001..5_008).collect::<Vec<_>>());
    assert_eq!(filtered.count_rows().unwrap(), 7);
    // A limit of nothing reads nothing.
    let none = open(&dir).with_limit(0).build().unwrap();
    assert!(ids(none.scan()).is_empty());
}
