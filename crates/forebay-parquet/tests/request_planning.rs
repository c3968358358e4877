//! Requests on an object store: what a scan fetches and how many requests it keeps in
//! flight, seen from a store that delays and records every GET (`io::request_plan`,
//! `scan::fetch_ahead`).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
use async_trait::async_trait;
use bytes::Bytes;
use forebay_parquet::{DatasetSource, FileEntry, ParquetDataset, ScanSkip};
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::SerializedFileReader;

/// An in-memory store whose GETs take `delay`, recording each bounded GET's range (data
/// requests; footers are suffix or whole-object reads) and the most in flight at once, and
/// when each GET started.
#[derive(Debug)]
struct SlowStore {
    inner: InMemory,
    delay: Duration,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    ranges: Mutex<Vec<Range<u64>>>,
    gets: Mutex<Vec<Get>>,
    /// The length of each file, by path.
    lens: Mutex<std::collections::HashMap<String, u64>>,
    /// How much longer than `delay` the footer requests of files other than the first take.
    later_footers: Mutex<Duration>,
}

/// A GET as the store saw it.
#[derive(Debug, Clone)]
struct Get {
    started: Instant,
    path: String,
    range: Option<GetRange>,
}

impl std::fmt::Display for SlowStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlowStore({:?})", self.delay)
    }
}

impl SlowStore {
    fn with(files: &[Vec<u8>], delay: Duration) -> Arc<SlowStore> {
        let store = Arc::new(SlowStore {
            inner: InMemory::new(),
            delay,
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            ranges: Mutex::new(Vec::new()),
            gets: Mutex::new(Vec::new()),
            lens: Mutex::new(
                files
                    .iter()
                    .enumerate()
                    .map(|(i, f)| (format!("t/part-{i}.parquet"), f.len() as u64))
                    .collect(),
            ),
            later_footers: Mutex::new(Duration::ZERO),
        });
        forebay_parquet::block_on({
            let store = store.clone();
            let files = files.to_vec();
            async move {
                for (i, f) in files.into_iter().enumerate() {
                    let path = Path::from(format!("t/part-{i}.parquet"));
                    store.inner.put(&path, f.into()).await.unwrap();
                }
            }
        });
        store
    }

    fn source(self: &Arc<Self>) -> DatasetSource {
        DatasetSource::Store {
            store: self.clone(),
            display_prefix: "slow://".into(),
            paths: vec!["t/".into()],
        }
    }

    fn reset(&self) {
        self.most_in_flight.store(0, Ordering::SeqCst);
        self.ranges.lock().unwrap().clear();
        self.gets.lock().unwrap().clear();
    }

    /// Whether a GET of `path` asks for its end: a footer request, whatever its form.
    fn reaches_end(&self, path: &str, range: &Option<GetRange>) -> bool {
        let len = self.lens.lock().unwrap()[path];
        match range {
            Some(GetRange::Bounded(r)) => r.end == len,
            Some(GetRange::Suffix(_)) | Some(GetRange::Offset(_)) | None => true,
        }
    }

    /// The footer requests made so far.
    fn footer_gets(&self) -> Vec<Get> {
        self.gets
            .lock()
            .unwrap()
            .iter()
            .filter(|g| self.reaches_end(&g.path, &g.range))
            .cloned()
            .collect()
    }

    /// The data requests made so far (those not for a file's end).
    fn data_gets(&self) -> Vec<Get> {
        self.gets
            .lock()
            .unwrap()
            .iter()
            .filter(|g| !self.reaches_end(&g.path, &g.range))
            .cloned()
            .collect()
    }
}

#[async_trait]
impl ObjectStore for SlowStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.gets.lock().unwrap().push(Get {
            started: Instant::now(),
            path: location.to_string(),
            range: options.range.clone(),
        });
        let data = match &options.range {
            Some(GetRange::Bounded(range)) => Some(range.clone()),
            _ => None,
        };
        if let Some(range) = &data {
            self.ranges.lock().unwrap().push(range.clone());
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        }
        let mut delay = self.delay;
        if location.as_ref() != "t/part-0.parquet"
            && self.reaches_end(location.as_ref(), &options.range)
        {
            delay += *self.later_footers.lock().unwrap();
        }
        tokio::time::sleep(delay).await;
        let result = self.inner.get_opts(location, options).await;
        if data.is_some() {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        result
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// Pseudo-random values (the data must not compress away).
fn noise(n: usize, seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

fn int_column(n: usize, seed: u64) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(
        noise(n, seed).map(|v| v as i64),
    ))
}

/// A Parquet file of `columns`, row groups of `row_group_rows`, plain-encoded unless
/// `dictionary`.
fn write(columns: Vec<(&str, ArrayRef)>, row_group_rows: usize, dictionary: bool) -> Vec<u8> {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(row_group_rows))
        .set_dictionary_enabled(dictionary)
        .build();
    let mut buf = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    buf
}

/// The compressed bytes of the named columns' chunks in `file`.
fn chunk_bytes(file: &[u8], columns: &[&str]) -> u64 {
    let reader = SerializedFileReader::new(Bytes::copy_from_slice(file)).unwrap();
    let meta = reader.metadata();
    let mut total = 0;
    for rg in meta.row_groups() {
        for chunk in rg.columns() {
            if columns.contains(&chunk.column_path().string().as_str()) {
                total += chunk.byte_range().1;
            }
        }
    }
    total
}

fn rows(ds: &ParquetDataset) -> usize {
    ds.scan()
        .blocking_iter()
        .map(|b| b.unwrap().batch.num_rows())
        .sum()
}

#[test]
fn two_columns_apart_fetch_little_more_than_their_own_bytes() {
    // `a` and `b` with ~0.8 MB of `filler` between them in every row group: the old fixed
    // rule (merge gaps under 1 MiB) fetched the filler too.
    let n = 200_000;
    let filler = BinaryArray::from_iter_values(noise(n, 3).map(|v| v.to_le_bytes()[..6].to_vec()));
    let file = write(
        vec![
            ("a", int_column(n, 1)),
            ("filler", Arc::new(filler)),
            ("b", int_column(n, 2)),
        ],
        50_000,
        false,
    );
    let selected = chunk_bytes(&file, &["a", "b"]);
    let store = SlowStore::with(&[file], Duration::ZERO);
    let planned = ParquetDataset::builder(store.source())
        .with_columns(["a", "b"])
        .build()
        .unwrap();
    assert_eq!(rows(&planned), n);
    let io = planned.metrics().io;
    assert!(
        io.data_bytes as f64 <= 1.125 * selected as f64,
        "fetched {} of {selected} selected bytes",
        io.data_bytes
    );
    assert_eq!(io.data_requests, 8, "one request a column chunk: {io:?}");

    let fixed_gap = ParquetDataset::builder(store.source())
        .with_columns(["a", "b"])
        .with_coalesce_gap(1 << 20)
        .build()
        .unwrap();
    assert_eq!(rows(&fixed_gap), n);
    let io = fixed_gap.metrics().io;
    assert_eq!(io.data_requests, 4, "the fixed rule merges: {io:?}");
    assert!(io.data_bytes as f64 > 1.5 * selected as f64, "{io:?}");
}

#[test]
fn a_long_column_chunk_is_fetched_as_parts_at_once() {
    // One row group, one ~20 MB column chunk: at least two parts of 8 MiB.
    let n = 2_500_000;
    let file = write(vec![("big", int_column(n, 7))], n, false);
    let reader = SerializedFileReader::new(Bytes::copy_from_slice(&file)).unwrap();
    let (start, len) = reader.metadata().row_group(0).column(0).byte_range();
    let chunk = start..start + len;
    assert!(len >= 2 * forebay_parquet::MIN_PART_BYTES, "{len}");
    let store = SlowStore::with(&[file], Duration::from_millis(5));
    let ds = ParquetDataset::builder(store.source()).build().unwrap();
    let mut got = Vec::new();
    for batch in ds.scan().blocking_iter() {
        let batch = batch.unwrap().batch;
        let col = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        got.extend_from_slice(col.values());
    }
    let expected: Vec<i64> = noise(n, 7).map(|v| v as i64).collect();
    assert!(got == expected, "the parts put back together are the chunk");
    let mut parts: Vec<Range<u64>> = store
        .ranges
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.start >= chunk.start && r.end <= chunk.end)
        .cloned()
        .collect();
    parts.sort_by_key(|r| r.start);
    assert!(parts.len() >= 3, "{parts:?}");
    assert_eq!(parts.first().unwrap().start, chunk.start);
    assert_eq!(parts.last().unwrap().end, chunk.end);
    assert!(
        parts.windows(2).all(|w| w[0].end == w[1].start),
        "{parts:?}"
    );
    assert!(store.most_in_flight.load(Ordering::SeqCst) >= 2);
    assert_eq!(ds.metrics().io.data_bytes, len, "each byte once");
}

#[test]
fn a_slow_link_gets_more_requests_in_flight_than_a_scan_starts_with() {
    // Two files of 40 row groups each (~160 KB a row group: too large to be fetched whole
    // with the footer), behind 20 ms a request; decoding is quick, so the link makes it wait.
    let files: Vec<Vec<u8>> = (0..2)
        .map(|k| {
            let n = 400_000;
            write(
                vec![
                    ("id", int_column(n, 10 + k)),
                    ("val", int_column(n, 20 + k)),
                ],
                10_000,
                false,
            )
        })
        .collect();
    let store = SlowStore::with(&files, Duration::from_millis(20));
    let scan_with = |most_ahead: Option<usize>| {
        let mut builder = ParquetDataset::builder(store.source())
            .with_num_threads(2)
            .with_prefetch(4);
        if let Some(most) = most_ahead {
            builder = builder.with_fetch_ahead(most);
        }
        let ds = builder.build().unwrap();
        store.reset();
        assert_eq!(rows(&ds), 800_000);
        let io = ds.metrics().io;
        assert_eq!(io.data_requests, 80, "{io:?}");
        store.most_in_flight.load(Ordering::SeqCst)
    };
    let fixed = scan_with(Some(8));
    // Decoding 4 and 8 ahead (one more while a finished unit's response is still counted).
    assert!(fixed <= 4 + 8 + 1, "{fixed}");
    let measured = scan_with(None);
    assert!(
        measured >= 24,
        "the scan went deeper while decoding waited: {measured} in flight"
    );
    let none = scan_with(Some(0));
    assert!(none <= 4 + 1, "{none}");
}

#[test]
fn a_filtered_scan_fetches_its_units_before_they_take_a_core() {
    // A selective filter (~1 % of rows) behind 20 ms a request. Its units' column chunks
    // are fetched before decoding takes one of the 2 cores: the 4 units in flight wait on
    // their round trips at once, not 2 at a time and one phase after another.
    let n = 400_000;
    let files: Vec<Vec<u8>> = (0..2)
        .map(|k| {
            write(
                vec![
                    ("id", int_column(n, 30 + k)),
                    ("val", int_column(n, 40 + k)),
                ],
                10_000,
                false,
            )
        })
        .collect();
    let cut = i64::MIN + (u64::MAX / 100) as i64;
    let store = SlowStore::with(&files, Duration::from_millis(20));
    let ds = ParquetDataset::builder(store.source())
        .with_num_threads(2)
        .with_prefetch(4)
        .with_filter(forebay_parquet::Predicate::lt("val", cut))
        .build()
        .unwrap();
    store.reset();
    let mut got: Vec<(i64, i64)> = Vec::new();
    for batch in ds.scan().blocking_iter() {
        let batch = batch.unwrap().batch;
        let column = |i: usize| {
            batch
                .column(i)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        };
        got.extend(column(0).into_iter().zip(column(1)));
    }
    let expected: Vec<(i64, i64)> = (0..2)
        .flat_map(|k| noise(n, 30 + k).zip(noise(n, 40 + k)))
        .map(|(id, val)| (id as i64, val as i64))
        .filter(|(_, val)| *val < cut)
        .collect();
    assert!(
        got == expected,
        "{} rows, {} expected",
        got.len(),
        expected.len()
    );
    assert!(expected.len() > 4_000 && expected.len() < 12_000);
    let most = store.most_in_flight.load(Ordering::SeqCst);
    assert!(most >= 4, "{most} requests in flight at most");
    // Each chunk once: the decoder's reads were served from what was fetched.
    let io = ds.metrics().io;
    let chunks: u64 = files.iter().map(|f| chunk_bytes(f, &["id", "val"])).sum();
    assert_eq!(io.data_bytes, chunks, "{io:?}");
}

/// Keeps the ids `keeps` says; decides row groups by their dictionary (as a resume by id
/// does).
struct KeepsIds {
    columns: Vec<String>,
    keeps: fn(i64) -> bool,
    decided: AtomicUsize,
}

impl forebay_parquet::ScanRowFilter for KeepsIds {
    fn columns(&self) -> &[String] {
        &self.columns
    }
    fn keep(
        &self,
        batch: &RecordBatch,
    ) -> Result<arrow_array::BooleanArray, forebay_parquet::RowFilterError> {
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        Ok(ids.iter().map(|id| id.map(self.keeps)).collect())
    }
    fn decides_by_values(&self) -> bool {
        true
    }
    fn decide_by_values(
        &self,
        values: &ArrayRef,
        _rows: u64,
    ) -> Result<forebay_parquet::RowGroupDecision, forebay_parquet::RowFilterError> {
        use forebay_parquet::RowGroupDecision::{DropAll, KeepAll, RowByRow};
        self.decided.fetch_add(1, Ordering::SeqCst);
        let ids = values.as_any().downcast_ref::<Int64Array>().unwrap();
        let kept = ids.values().iter().filter(|&&id| (self.keeps)(id)).count();
        Ok(match kept {
            0 => DropAll,
            n if n == ids.len() => KeepAll,
            _ => RowByRow,
        })
    }
}

#[test]
fn a_row_filter_deciding_by_dictionary_fetches_the_page_before_it_takes_a_core() {
    // Ids 0..400,000 in row groups of 10,000, dictionary-encoded, behind 20 ms a request.
    let n = 400_000;
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
    let file = write(vec![("id", ids), ("val", int_column(n, 50))], 10_000, true);
    let store = SlowStore::with(&[file], Duration::from_millis(20));
    let scan = |keeps: fn(i64) -> bool| {
        let filter = Arc::new(KeepsIds {
            columns: vec!["id".into()],
            keeps,
            decided: AtomicUsize::new(0),
        });
        let ds = ParquetDataset::builder(store.source())
            .with_num_threads(2)
            .with_prefetch(4)
            .with_row_filter(filter.clone())
            .build()
            .unwrap();
        store.reset();
        let mut got = Vec::new();
        for batch in ds.scan().blocking_iter() {
            let batch = batch.unwrap().batch;
            let ids = batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            got.extend_from_slice(ids.values());
        }
        assert_eq!(
            filter.decided.load(Ordering::SeqCst),
            40,
            "each row group decided"
        );
        let mut ranges = store.ranges.lock().unwrap().clone();
        ranges.sort_by_key(|r| r.start);
        assert!(
            ranges.windows(2).all(|w| w[0].end <= w[1].start),
            "a byte fetched twice: {ranges:?}"
        );
        (got, store.most_in_flight.load(Ordering::SeqCst))
    };
    // Every row group dropped by its dictionary alone: the pages of 4 units are fetched at
    // once, not 2 (the cores) at a time.
    let (none, most) = scan(|_| false);
    assert!(none.is_empty());
    assert!(most >= 4, "{most} requests in flight at most");
    // Every row group read row by row after its dictionary: the rest of each chunk is
    // fetched, not the dictionary page again.
    let (even, _) = scan(|id| id % 2 == 0);
    assert!(
        even == (0..n as i64).step_by(2).collect::<Vec<i64>>(),
        "{} rows",
        even.len()
    );
}

#[test]
fn the_first_footers_are_requested_together_not_behind_the_schemas() {
    // Six files (too large to be fetched whole with the footer) behind 200 ms a
    // request. The dataset's schema comes from the first footer; the scan's next footers
    // must not wait for it (one more round trip before any data, on every dataset).
    let files = files_of_ids(6, 200_000, 50_000, 30);
    let store = SlowStore::with(&files, Duration::from_millis(200));
    let ds = ParquetDataset::builder(store.source()).build().unwrap();
    assert_eq!(rows(&ds), 1_200_000);
    let footers = store.footer_gets();
    assert_eq!(footers.len(), 6, "one footer request a file: {footers:?}");
    let first = footers.iter().map(|g| g.started).min().unwrap();
    let last = footers.iter().map(|g| g.started).max().unwrap();
    assert!(
        last - first < Duration::from_millis(100),
        "footers requested {:?} apart",
        last - first
    );
    assert_eq!(ds.metrics().io.footer_requests, 6);
}

/// Skips the files `t/part-{i}.parquet` whose `i` it says to, as a resume skips finished
/// files or a worker of a checkpoint load the other workers'.
struct SkipFiles(fn(usize) -> bool);

impl ScanSkip for SkipFiles {
    fn skip_file(&self, file: &FileEntry) -> bool {
        let name = file.uri().to_string();
        let i = name[name.rfind("part-").unwrap() + 5..name.len() - ".parquet".len()]
            .parse()
            .unwrap();
        (self.0)(i)
    }
    fn skip_row_group(&self, _file: &FileEntry, _row_group: usize) -> bool {
        false
    }
}

/// `n` files of `rows` random int64 ids each, in row groups of `group_rows` (8 bytes a row:
/// 200,000 rows is ~1.6 MB, too large to be fetched whole with the footer).
fn files_of_ids(n: u64, rows: usize, group_rows: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|k| write(vec![("id", int_column(rows, seed + k))], group_rows, false))
        .collect()
}

#[test]
fn a_skipping_scan_of_a_built_dataset_takes_its_footers_requested_ahead() {
    // As a resume does: build, then scan with the finished files skipped. The footers
    // requested while the dataset was built serve the skipping scan; none is requested
    // twice, and the skipped file's is not waited for.
    let files = files_of_ids(6, 200_000, 50_000, 40);
    let store = SlowStore::with(&files, Duration::from_millis(50));
    let ds = ParquetDataset::builder(store.source()).build().unwrap();
    let skipping = ds.with_skip(Arc::new(SkipFiles(|i| i == 5)));
    assert_eq!(rows(&skipping), 1_000_000);
    let footers = store.footer_gets();
    assert_eq!(footers.len(), 6, "{footers:?}");
    // The dataset it was derived from kept the skipped file's tail; it reads again only the
    // footers it gave away (file 0's is cached).
    store.reset();
    assert_eq!(rows(&ds), 1_200_000);
    assert_eq!(store.footer_gets().len(), 4);
}

#[test]
fn datasets_derived_for_each_worker_share_the_footers_requested_ahead() {
    let files = files_of_ids(6, 200_000, 50_000, 90);
    let store = SlowStore::with(&files, Duration::from_millis(20));
    let ds = ParquetDataset::builder(store.source()).build().unwrap();
    let even = ds.with_skip(Arc::new(SkipFiles(|i| i % 2 == 1)));
    let odd = ds.with_skip(Arc::new(SkipFiles(|i| i % 2 == 0)));
    assert_eq!(rows(&odd) + rows(&even), 1_200_000);
    assert_eq!(store.footer_gets().len(), 6, "each footer requested once");
}

#[test]
fn units_of_files_opened_while_the_first_unit_waits_are_fetched_at_once() {
    // Footers come back at different times: the first file's after 100 ms, the others' 50 ms
    // later, while the first file's data is still on its way (100 ms). Their units' data
    // must be requested as soon as their footers are read, not after the first unit's
    // first batch (which would cost one more round trip before most of the data).
    let files = files_of_ids(4, 200_000, 50_000, 50);
    let store = SlowStore::with(&files, Duration::from_millis(100));
    *store.later_footers.lock().unwrap() = Duration::from_millis(50);
    let ds = ParquetDataset::builder(store.source())
        .with_num_threads(2)
        .with_prefetch(4)
        .build()
        .unwrap();
    assert_eq!(rows(&ds), 800_000);
    let data = store.data_gets();
    let first_of = |file: &str| {
        data.iter()
            .filter(|g| g.path == file)
            .map(|g| g.started)
            .min()
            .unwrap()
    };
    let first = first_of("t/part-0.parquet");
    let second = first_of("t/part-1.parquet");
    assert!(
        second - first < Duration::from_millis(90),
        "the second file's data was requested {:?} after the first's",
        second - first
    );
}

#[test]
fn the_default_fetch_ahead_is_a_budget_of_bytes_in_row_groups() {
    // Row groups of ~80 KB selected: 256 MiB would be thousands; at most 256 by default.
    let small = write(vec![("id", int_column(100_000, 60))], 10_000, false);
    let store = SlowStore::with(&[small], Duration::ZERO);
    let ds = ParquetDataset::builder(store.source()).build().unwrap();
    assert_eq!(ds.fetch_ahead(), 256);
    // Row groups of ~16 MB: 256 MiB holds 16, but a scan may start 32 ahead.
    let large = write(vec![("id", int_column(2_000_000, 61))], 2_000_000, false);
    let store = SlowStore::with(&[large], Duration::ZERO);
    let ds = ParquetDataset::builder(store.source()).build().unwrap();
    assert_eq!(ds.fetch_ahead(), 32);
    // What the caller sets, it gets.
    let ds = ParquetDataset::builder(store.source())
        .with_fetch_ahead(5)
        .build()
        .unwrap();
    assert_eq!(ds.fetch_ahead(), 5);
}

#[test]
fn small_files_fetched_whole_are_requested_as_far_ahead_as_row_groups_would_be() {
    // 64 files of ~80 KB, each fetched whole with its footer (one request a file), behind
    // 50 ms a request: 16 at a time would be 4 round trips one after another.
    let files = files_of_ids(64, 10_000, 10_000, 70);
    let store = SlowStore::with(&files, Duration::from_millis(50));
    let scan_with = |most_ahead: Option<usize>| {
        let mut builder = ParquetDataset::builder(store.source());
        if let Some(most) = most_ahead {
            builder = builder.with_fetch_ahead(most);
        }
        let ds = builder.build().unwrap();
        store.reset();
        assert_eq!(rows(&ds), 640_000);
        // Each file came whole, but the first: its footer was read alone, for the schema.
        assert_eq!(ds.metrics().io.data_requests, 1);
        store.most_in_flight.load(Ordering::SeqCst)
    };
    let default = scan_with(None);
    assert!(default >= 48, "{default} in flight");
    let none = scan_with(Some(0));
    assert!(none <= 16, "{none} in flight without fetching ahead");
}

#[test]
fn counting_the_rows_of_many_remote_files_reads_their_footers_many_at_once() {
    // count_rows() reads every footer: 64 files behind 50 ms a request, not 16 at a time.
    let files = files_of_ids(64, 1_000, 1_000, 80);
    let store = SlowStore::with(&files, Duration::from_millis(50));
    let ds = ParquetDataset::builder(store.source()).build().unwrap();
    store.reset();
    assert_eq!(ds.count_rows().unwrap(), 64_000);
    let most = store.most_in_flight.load(Ordering::SeqCst);
    assert!(most >= 32, "{most} footers in flight");
}
