//! A scan inside a host engine: on the runtime it is given, charging the host's memory pool.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use forebay_io::memory::{BoundedPool, MemoryPool};
use forebay_parquet::{
    DatasetSource, ParquetDataset, ParquetError, RowFilterError, RowRange, ScanRowFilter,
};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

const ROWS: usize = 40_000;
const ROW_GROUP_ROWS: usize = 5_000;

/// A file of 8 equal row groups: `id` (0..ROWS) and a string payload.
fn file(dir: &std::path::Path) -> String {
    let ids = Int64Array::from_iter_values(0..ROWS as i64);
    let payload = StringArray::from_iter_values((0..ROWS).map(|i| format!("payload-{i:08}")));
    let batch = RecordBatch::try_from_iter([
        ("id", Arc::new(ids) as ArrayRef),
        ("payload", Arc::new(payload) as ArrayRef),
    ])
    .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();
    let path = dir.join("data.parquet");
    let mut writer = ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    path.display().to_string()
}

/// Keeps every row, noting which thread decoded it.
struct ThreadRecorder {
    columns: Vec<String>,
    threads: Mutex<Vec<String>>,
}

impl ScanRowFilter for ThreadRecorder {
    fn columns(&self) -> &[String] {
        &self.columns
    }
    fn keep(&self, batch: &RecordBatch) -> Result<BooleanArray, RowFilterError> {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        self.threads.lock().unwrap().push(name);
        Ok(BooleanArray::from(vec![true; batch.num_rows()]))
    }
}

fn rows(dataset: &ParquetDataset) -> usize {
    dataset
        .scan()
        .blocking_iter()
        .map(|b| b.unwrap().batch.num_rows())
        .sum()
}

#[test]
fn a_scan_decodes_on_the_runtime_it_is_given_and_blocks_politely_on_its_workers() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(dir.path());
    let host = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("host-scan")
        .enable_all()
        .build()
        .unwrap();
    let recorder = Arc::new(ThreadRecorder {
        columns: vec!["id".into()],
        threads: Mutex::default(),
    });
    let dataset = ParquetDataset::builder(DatasetSource::uris([path]))
        .with_runtime(host.handle().clone())
        .with_row_filter(recorder.clone())
        .build()
        .unwrap();
    assert_eq!(rows(&dataset), ROWS);
    let threads = recorder.threads.lock().unwrap().clone();
    assert_eq!(threads.len(), ROWS / ROW_GROUP_ROWS);
    assert!(threads.iter().all(|t| t == "host-scan"), "{threads:?}");

    // Blocking on the stream from a task of the host's runtime: the runtime is told the
    // worker blocks (block_in_place), so the scan's own tasks still run.
    let on_worker = dataset.clone();
    let counted = host
        .block_on(host.spawn(async move { rows(&on_worker) }))
        .unwrap();
    assert_eq!(counted, ROWS);
}

#[test]
fn a_scan_charges_the_pool_per_row_group_waits_for_room_and_gives_everything_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(dir.path());
    let with_pool = |pool: &Arc<BoundedPool>, prefetch: usize| {
        ParquetDataset::builder(DatasetSource::uris([path.clone()]))
            .with_memory_pool(pool.clone())
            .with_prefetch(prefetch)
            .build()
            .unwrap()
    };

    let one = Arc::new(BoundedPool::new(usize::MAX));
    assert_eq!(rows(&with_pool(&one, 1)), ROWS);
    let unit = one.peak();
    assert!(
        unit > ROW_GROUP_ROWS * 8,
        "a row group charged {unit} bytes"
    );
    assert_eq!((one.reserved(), one.consumers()), (0, 0));

    let wide = Arc::new(BoundedPool::new(usize::MAX));
    assert_eq!(rows(&with_pool(&wide, 4)), ROWS);
    assert!(
        wide.peak() > unit && wide.peak() <= 4 * unit,
        "{}",
        wide.peak()
    );

    // Room for one row group and a half: prefetch 4 waits, one at a time.
    let narrow = Arc::new(BoundedPool::new(unit * 3 / 2));
    let dataset = with_pool(&narrow, 4);
    assert_eq!(rows(&dataset), ROWS);
    assert_eq!(narrow.peak(), unit);

    // Row ranges in any order are charged the same way.
    let ranges: Vec<RowRange> = (0..ROWS / ROW_GROUP_ROWS)
        .rev()
        .map(|rg| RowRange {
            file_index: 0,
            row_group: rg,
            rows: 0..ROW_GROUP_ROWS as u64 / 2,
        })
        .collect();
    let got: usize = dataset
        .scan_row_ranges(ranges)
        .blocking_iter()
        .map(|b| b.unwrap().batch.num_rows())
        .sum();
    assert_eq!(got, ROWS / 2);
    assert_eq!((narrow.peak(), narrow.reserved()), (unit, 0));

    // Too small for one row group: an error naming the file and row group, not a hang.
    let tiny = Arc::new(BoundedPool::new(unit / 2));
    let err = with_pool(&tiny, 2)
        .scan()
        .blocking_iter()
        .find_map(|b| b.err())
        .expect("refused");
    assert!(matches!(err, ParquetError::MemoryRefused { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("data.parquet") && message.contains("row group 0"),
        "{message}"
    );

    // A scan dropped half way gives its charges back (its driver is cancelled).
    let dropped = Arc::new(BoundedPool::new(usize::MAX));
    let mut scan = with_pool(&dropped, 4).scan();
    scan.next_blocking().unwrap().unwrap();
    assert!(dropped.reserved() > 0);
    drop(scan);
    let deadline = Instant::now() + Duration::from_secs(10);
    while dropped.reserved() > 0 || dropped.consumers() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} bytes kept",
            dropped.reserved()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
