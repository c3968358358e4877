//! Datasets and their streaming scan.
//!
//! ```text
//!  files ──► open (footer, once per file, cached; spawned ahead)
//!              │ prune row groups (statistics) and pages (page index)
//!              ▼
//!  units = (file, row group, row selection) in file order
//!              │  at most `prefetch` units in flight, each decoding on the pool
//!              │  into its own small channel
//!              ▼
//!  driver forwards unit 0's batches, then unit 1's, ... ──► ScanStream (ordered)
//! ```
//!
//! Memory is bounded by `prefetch` × (the selected column chunks of one row group + two
//! decoded batches), independent of the number or size of files. Order is deterministic
//! (file, then row group) whatever finishes first. Dropping the [`ScanStream`] cancels
//! everything in flight.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use futures::{FutureExt, Stream, StreamExt};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowPredicate, ArrowPredicateFn, ArrowReaderMetadata, ArrowReaderOptions,
    ParquetRecordBatchReader, RowFilter, RowSelection,
};
use parquet::arrow::async_reader::{
    AsyncFileReader, ParquetRecordBatchStream, ParquetRecordBatchStreamBuilder,
};
use parquet::arrow::parquet_to_arrow_field_levels;
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataOptions, ParquetMetaDataReader,
    ParquetStatisticsPolicy,
};
use tokio::sync::{mpsc, Semaphore};

use crate::error::{ParquetError, Result};
use crate::flat::{self, FlatDecoder, FlatType};
use crate::io::{FileEntry, IoMetrics, IoMetricsSnapshot, ObjectFileReader};
use crate::pages::{FetchedRowGroup, PageBuffers};
use crate::predicate::{BoundPredicate, ContainerStats, Predicate};
use crate::repair;
use crate::row_filter::{RowFilterHook, RowGroupDecision, ScanRowFilter};
use crate::source::{resolve, DatasetSource, DEFAULT_FILE_EXTENSIONS};

/// Bytes fetched from the end of a file in the first footer request. Most footers (and often
/// the page index just before them) fit, so one request per file is the common case.
const FOOTER_PREFETCH: usize = 64 * 1024;
/// Footers fetched concurrently ahead of the scan.
const FOOTER_CONCURRENCY: usize = 16;

/// The pool that runs forebay's I/O and decoding: one worker per core.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(default_threads())
            .thread_name("forebay-io")
            .enable_all()
            .build()
            .expect("cannot start the forebay I/O runtime (out of threads?)")
    })
}

fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(1)
}

/// Run `fut` on the forebay runtime and wait for it from any thread (also from inside
/// another async runtime, where `Runtime::block_on` would panic).
pub fn block_on<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let handle = runtime().spawn(fut);
    match futures::executor::block_on(handle) {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("forebay runtime task cancelled: {e}"),
    }
}

/// Input a caller has already finished, to be skipped without reading it (the engine's
/// resume): whole files before their footer is fetched, row groups before their data is.
pub trait ScanSkip: Send + Sync {
    /// Skip this file entirely (its footer is not read; the dataset's first file's footer is
    /// read anyway, for the schema).
    fn skip_file(&self, file: &FileEntry) -> bool;
    /// Skip this row group of a file that is read.
    fn skip_row_group(&self, file: &FileEntry, row_group: usize) -> bool;

    /// [`ScanSkip::skip_row_group`] with the file's footer at hand, for a skip decided by
    /// what the file says of itself (its key-value metadata, a row group's statistics). The
    /// scan asks this one; by default it asks [`ScanSkip::skip_row_group`].
    fn skip_row_group_in(
        &self,
        file: &FileEntry,
        footer: &ParquetMetaData,
        row_group: usize,
    ) -> bool {
        let _ = footer;
        self.skip_row_group(file, row_group)
    }
}

/// A [`ScanSkip`] in the builder (which derives `Debug`).
#[derive(Clone)]
struct Skip(Arc<dyn ScanSkip>);

impl std::fmt::Debug for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScanSkip")
    }
}

/// How to read a dataset. Build with [`ParquetDataset::builder`].
#[derive(Debug, Clone)]
pub struct ParquetDatasetBuilder {
    source: DatasetSource,
    columns: Option<Vec<String>>,
    filter: Option<Predicate>,
    batch_size: usize,
    prefetch: Option<usize>,
    num_threads: Option<usize>,
    dictionary_columns: Vec<String>,
    int96_unit: TimeUnit,
    skip: Option<Skip>,
    row_filter: Option<RowFilterHook>,
    coalesce_gap: Option<u64>,
    use_page_index: bool,
    flat_decoder: bool,
    /// Endings of the names a directory listing keeps (None: every name).
    file_extensions: Option<Vec<String>>,
    /// The most one selected column chunk may decompress to (its footer's size).
    max_column_chunk_bytes: u64,
}

impl ParquetDatasetBuilder {
    /// Columns to read, by name; a dotted path (`"a.b"`) selects part of a nested column.
    /// Output columns follow this order. Default: all columns.
    pub fn with_columns<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.columns = Some(columns.into_iter().map(Into::into).collect());
        self
    }

    /// Keep only rows matching `filter`; row groups and pages that cannot match are skipped.
    pub fn with_filter(mut self, filter: Predicate) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Rows per batch (default 65,536). Filtered batches may be smaller, and so are those of
    /// the scan's first row group (at most 8,192 rows each), so that the first batch arrives
    /// sooner.
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Row groups in flight at once (default: threads + 2). Bounds memory.
    pub fn with_prefetch(mut self, prefetch: usize) -> Self {
        self.prefetch = Some(prefetch);
        self
    }

    /// Row groups decoded concurrently (default and maximum: the number of cores).
    pub fn with_num_threads(mut self, num_threads: usize) -> Self {
        self.num_threads = Some(num_threads);
        self
    }

    /// String/binary columns to return as `Dictionary(Int32, _)` arrays.
    pub fn with_dictionary_columns<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.dictionary_columns = columns.into_iter().map(Into::into).collect();
        self
    }

    /// The unit of timestamps stored as (deprecated) INT96, as pyarrow's
    /// `coerce_int96_timestamp_unit`. Default nanoseconds; values outside the range of the
    /// unit wrap (INT96 holds dates far beyond the ±292 years of `i64` nanoseconds: Spark
    /// writes microsecond timestamps up to year 294,247), so choose microseconds or
    /// milliseconds to read such values exactly. Applies to top-level and struct-nested
    /// INT96 columns.
    pub fn with_int96_timestamp_unit(mut self, unit: TimeUnit) -> Self {
        self.int96_unit = unit;
        self
    }

    /// Skip input the caller already finished (see [`ScanSkip`]); skipped files and row
    /// groups are counted in [`ScanMetricsSnapshot`].
    pub fn with_skip(mut self, skip: Arc<dyn ScanSkip>) -> Self {
        self.skip = Some(Skip(skip));
        self
    }

    /// Drop rows by the caller's own test while decoding (see [`ScanRowFilter`]): the other
    /// columns are decoded only for the rows it keeps. Applied after [`Self::with_filter`].
    pub fn with_row_filter(mut self, filter: Arc<dyn ScanRowFilter>) -> Self {
        self.row_filter = Some(RowFilterHook(filter));
        self
    }

    /// Merge column-chunk reads separated by at most this many bytes into one request.
    /// Default: 0 for local files (only selected bytes are read), 1 MiB for remote stores.
    pub fn with_coalesce_gap(mut self, bytes: u64) -> Self {
        self.coalesce_gap = Some(bytes);
        self
    }

    /// Use the page index (when files have one) to skip pages inside row groups. Default on.
    pub fn with_page_index(mut self, enabled: bool) -> Self {
        self.use_page_index = enabled;
        self
    }

    /// Decode flat required integer, date, float, decimal, string and binary columns (the
    /// last two as views) with forebay's own decoders when a row group is read whole
    /// (default: on). Off, the parquet crate decodes
    /// every column; the output is the same (kept for comparison and as an escape hatch).
    pub fn with_flat_decoder(mut self, enabled: bool) -> Self {
        self.flat_decoder = enabled;
        self
    }

    /// Which files of a listed directory (or prefix) are read: those whose name ends with
    /// one of `extensions` (case-insensitive; `"parquet"` and `".parquet"` alike), or every
    /// file with `None`. Default [`DEFAULT_FILE_EXTENSIONS`], so that a stray `README` or
    /// `.csv` beside the data does not fail the read. Files named explicitly, and glob
    /// matches, are read whatever their name.
    pub fn with_file_extensions<I, S>(mut self, extensions: Option<I>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.file_extensions = extensions.map(|e| {
            e.into_iter()
                .map(|x| {
                    let x: String = x.into();
                    format!(".{}", x.trim_start_matches('.').to_ascii_lowercase())
                })
                .collect()
        });
        self
    }

    /// The most one selected column chunk may decompress to, by the file's footer (default
    /// [`DEFAULT_MAX_COLUMN_CHUNK_BYTES`]): a larger one fails the scan with
    /// [`ParquetError::TooLarge`] before any of it is fetched. Arrow arrays index their
    /// values with 32-bit offsets, so a chunk past 2 GiB could not be decoded anyway; without
    /// the check a tiny file of highly compressible strings allocates gigabytes first.
    pub fn with_max_column_chunk_bytes(mut self, bytes: u64) -> Self {
        self.max_column_chunk_bytes = bytes.max(1);
        self
    }

    /// Resolve the files and read the first file's footer (for the schema).
    pub fn build(self) -> Result<ParquetDataset> {
        block_on(self.build_async())
    }

    /// [`Self::build`] for async callers.
    pub async fn build_async(self) -> Result<ParquetDataset> {
        if self.batch_size == 0 {
            return Err(ParquetError::InvalidArgument(
                "batch_size must be at least 1".into(),
            ));
        }
        if self.columns.as_ref().is_some_and(|c| c.is_empty()) {
            return Err(ParquetError::InvalidArgument(
                "columns=[] selects no column; name at least one column (or pass None for all; \
                 count_rows() counts rows without reading any)"
                    .into(),
            ));
        }
        if self.prefetch == Some(0) || self.num_threads == Some(0) {
            return Err(ParquetError::InvalidArgument(
                "prefetch and num_threads must be at least 1".into(),
            ));
        }
        let io = Arc::new(IoMetrics::default());
        let files = resolve(&self.source, self.file_extensions.as_deref(), &io).await?;
        let threads = self
            .num_threads
            .unwrap_or_else(default_threads)
            .min(default_threads())
            .max(1);
        let inner = Arc::new(DatasetInner {
            files,
            io,
            scan_metrics: ScanMetrics::default(),
            threads,
            prefetch: self.prefetch.unwrap_or(threads + 2),
            coalesce_gap: self.coalesce_gap,
            opened: Mutex::new(HashMap::new()),
            schema: OnceLock::new(),
            page_buffers: Arc::default(),
            options: self,
        });
        let first = inner.open(0).await?;
        let _ = inner.schema.set(first.output_schema.clone());
        Ok(ParquetDataset { inner })
    }
}

/// Counters of what pruning skipped, summed over every scan of a dataset.
#[derive(Debug, Default)]
struct ScanMetrics {
    row_groups_total: AtomicU64,
    row_groups_pruned_by_statistics: AtomicU64,
    row_groups_pruned_by_page_index: AtomicU64,
    rows_pruned_by_page_index: AtomicU64,
    files_skipped: AtomicU64,
    row_groups_skipped: AtomicU64,
    flat_decoder_chunks: AtomicU64,
}

/// A point-in-time copy of a dataset's pruning and I/O counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanMetricsSnapshot {
    pub row_groups_total: u64,
    pub row_groups_pruned_by_statistics: u64,
    pub row_groups_pruned_by_page_index: u64,
    pub rows_pruned_by_page_index: u64,
    /// Files a [`ScanSkip`] skipped (neither footer nor data read).
    pub files_skipped: u64,
    /// Row groups a [`ScanSkip`] skipped (data not read).
    pub row_groups_skipped: u64,
    /// Column chunks decoded by forebay's own flat-column decoders (see
    /// [`ParquetDatasetBuilder::with_flat_decoder`]) rather than the parquet crate.
    pub flat_decoder_chunks: u64,
    pub io: IoMetricsSnapshot,
}

/// A lazily read Parquet dataset: files resolved, footers read on demand and cached.
/// Cheap to clone; every scan shares the metadata cache and counters.
#[derive(Clone)]
pub struct ParquetDataset {
    inner: Arc<DatasetInner>,
}

struct DatasetInner {
    options: ParquetDatasetBuilder,
    files: Vec<FileEntry>,
    io: Arc<IoMetrics>,
    scan_metrics: ScanMetrics,
    threads: usize,
    prefetch: usize,
    coalesce_gap: Option<u64>,
    /// Footer + plan per file index: each footer is read once per dataset.
    opened: Mutex<HashMap<usize, Arc<OpenedFile>>>,
    schema: OnceLock<SchemaRef>,
    /// Decompression buffers recycled from page to page (see `pages`).
    page_buffers: Arc<PageBuffers>,
}

/// Everything needed to read one file's row groups, derived once from its footer.
struct OpenedFile {
    entry: FileEntry,
    index: usize,
    reader_meta: ArrowReaderMetadata,
    projection: ProjectionMask,
    /// Position in the decoded batch of each output column, in output order.
    reorder: Vec<usize>,
    output_schema: SchemaRef,
    filter: Option<(ProjectionMask, BoundPredicate)>,
    /// Columns of the decoded batch that forebay's own decoders may read (see `flat`); the
    /// parquet crate decodes the rest.
    flat_columns: Vec<FlatColumn>,
    /// Columns in a decoded batch: one per selected root, in file order.
    decoded_columns: usize,
}

/// A column of a file that forebay's own decoder may read.
struct FlatColumn {
    /// Its position in the decoded batch.
    position: usize,
    /// Its Parquet leaf.
    leaf: usize,
    ty: FlatType,
}

impl ParquetDataset {
    /// Start describing a dataset.
    pub fn builder(source: DatasetSource) -> ParquetDatasetBuilder {
        ParquetDatasetBuilder {
            source,
            columns: None,
            filter: None,
            batch_size: 65_536,
            prefetch: None,
            num_threads: None,
            dictionary_columns: Vec::new(),
            int96_unit: TimeUnit::Nanosecond,
            skip: None,
            row_filter: None,
            coalesce_gap: None,
            use_page_index: true,
            flat_decoder: true,
            file_extensions: Some(
                DEFAULT_FILE_EXTENSIONS
                    .iter()
                    .map(|e| e.to_string())
                    .collect(),
            ),
            max_column_chunk_bytes: DEFAULT_MAX_COLUMN_CHUNK_BYTES,
        }
    }

    /// Open local paths or URIs with default options.
    pub fn open<I, S>(uris: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder(DatasetSource::uris(uris)).build()
    }

    /// The schema of the batches a scan yields (projection and dictionary options applied).
    pub fn schema(&self) -> SchemaRef {
        self.inner
            .schema
            .get()
            .cloned()
            .expect("schema is set by build")
    }

    /// The same dataset (its files and cached footers) scanning around the input `skip`
    /// says is finished. Its metrics start from zero.
    pub fn with_skip(&self, skip: Arc<dyn ScanSkip>) -> ParquetDataset {
        let mut options = self.inner.options.clone();
        options.skip = Some(Skip(skip));
        self.with_options(options)
    }

    /// The same dataset (its files and cached footers) skipping what `skip` says on top of
    /// what it skips already (a task's [`ByteRangeSplit`](crate::ByteRangeSplit) after a
    /// resume's finished input). Its metrics start from zero.
    pub fn and_skip(&self, skip: Arc<dyn ScanSkip>) -> ParquetDataset {
        let skip = match &self.inner.options.skip {
            Some(Skip(present)) => Arc::new(crate::split::AllSkips(vec![present.clone(), skip])),
            None => skip,
        };
        self.with_skip(skip)
    }

    /// The same dataset (its files and cached footers) dropping rows by `filter` while
    /// decoding (see [`ScanRowFilter`]). Its metrics start from zero.
    pub fn with_row_filter(&self, filter: Arc<dyn ScanRowFilter>) -> ParquetDataset {
        let mut options = self.inner.options.clone();
        options.row_filter = Some(RowFilterHook(filter));
        self.with_options(options)
    }

    /// This dataset's files and cached footers under other scan options (ones that change
    /// neither the files nor how a footer is planned).
    fn with_options(&self, options: ParquetDatasetBuilder) -> ParquetDataset {
        let inner = &self.inner;
        let schema = OnceLock::new();
        if let Some(s) = inner.schema.get() {
            let _ = schema.set(s.clone());
        }
        let opened = inner.opened.lock().expect("cache lock").clone();
        ParquetDataset {
            inner: Arc::new(DatasetInner {
                options,
                files: inner.files.clone(),
                io: inner.io.clone(),
                scan_metrics: ScanMetrics::default(),
                threads: inner.threads,
                prefetch: inner.prefetch,
                coalesce_gap: inner.coalesce_gap,
                opened: Mutex::new(opened),
                schema,
                page_buffers: inner.page_buffers.clone(),
            }),
        }
    }

    /// Where the dataset's files were found (the paths, directories, globs or store given).
    pub fn source(&self) -> &DatasetSource {
        &self.inner.options.source
    }

    /// The files of the dataset, in scan order.
    pub fn files(&self) -> &[FileEntry] {
        &self.inner.files
    }

    /// The filter the scan applies (`with_filter`), if any.
    pub fn filter(&self) -> Option<&Predicate> {
        self.inner.options.filter.as_ref()
    }

    /// Counters: requests and bytes read, row groups and rows pruned.
    pub fn metrics(&self) -> ScanMetricsSnapshot {
        let m = &self.inner.scan_metrics;
        ScanMetricsSnapshot {
            row_groups_total: m.row_groups_total.load(Ordering::Relaxed),
            row_groups_pruned_by_statistics: m
                .row_groups_pruned_by_statistics
                .load(Ordering::Relaxed),
            row_groups_pruned_by_page_index: m
                .row_groups_pruned_by_page_index
                .load(Ordering::Relaxed),
            rows_pruned_by_page_index: m.rows_pruned_by_page_index.load(Ordering::Relaxed),
            files_skipped: m.files_skipped.load(Ordering::Relaxed),
            row_groups_skipped: m.row_groups_skipped.load(Ordering::Relaxed),
            flat_decoder_chunks: m.flat_decoder_chunks.load(Ordering::Relaxed),
            io: self.inner.io.snapshot(),
        }
    }

    /// An upper estimate of the memory a scan holds internally, from the first file's footer:
    /// the selected column chunks of `prefetch` row groups in flight, the decoded batches
    /// waiting in each row group's channel (up to 2) and in the scan's output channel (2).
    /// A caller that accounts for memory (the engine) reserves this for the scan as a whole.
    pub fn scan_window_bytes(&self) -> u64 {
        let opened = self.inner.opened.lock().expect("cache lock");
        let Some(file) = opened.get(&0) else {
            return 0;
        };
        let metadata = file.reader_meta.metadata();
        let (mut compressed, mut uncompressed, mut rows, mut groups) = (0u64, 0u64, 0u64, 0u64);
        for rg in metadata.row_groups() {
            groups += 1;
            rows += rg.num_rows().max(0) as u64;
            for (leaf, column) in rg.columns().iter().enumerate() {
                if file.projection.leaf_included(leaf) {
                    compressed += column.compressed_size().max(0) as u64;
                    uncompressed += column.uncompressed_size().max(0) as u64;
                }
            }
        }
        if groups == 0 || rows == 0 {
            return 0;
        }
        let per_group = compressed / groups;
        let batch_rows = (self.inner.options.batch_size as u64)
            .min(rows / groups)
            .max(1);
        // Decoded Arrow data takes about the uncompressed Parquet size (plus offsets).
        let per_batch = uncompressed / rows * batch_rows + uncompressed / rows.max(1);
        let prefetch = self.inner.prefetch as u64;
        prefetch * (per_group + 2 * per_batch) + 2 * per_batch
    }

    /// Rows a scan yields when that is known from footers alone (no filter); reads (and
    /// caches, for the scan) every footer.
    pub fn known_row_count(&self) -> Option<u64> {
        if self.inner.options.row_filter.is_some() {
            return None;
        }
        self.rows_to_read()
    }

    /// Rows in the row groups a scan reads (what a [`ScanSkip`] leaves), from footers alone
    /// (read and cached): [`Self::known_row_count`] ignoring a [`ScanRowFilter`], so an upper
    /// bound of what the scan yields when one is set. `None` with a [`Predicate`] filter
    /// (its pruning is not known before planning).
    pub fn rows_to_read(&self) -> Option<u64> {
        if self.inner.options.filter.is_some() {
            return None;
        }
        block_on(footer_rows(self.inner.clone())).ok()
    }

    /// Row groups a scan keeps in flight (fetched or decoding; bounds its memory).
    pub fn prefetch(&self) -> usize {
        self.inner.prefetch
    }

    /// Batches a scan decodes at once: when its consumer takes a batch, this many new ones
    /// may be allocated before the consumer sees any of them.
    pub fn decode_threads(&self) -> usize {
        self.inner.threads
    }

    /// Number of rows a scan yields: from footers alone when there is no filter (leaving
    /// out what a [`ScanSkip`] skips), otherwise by scanning only the filters' columns.
    pub fn count_rows(&self) -> Result<u64> {
        let this = self.clone();
        block_on(async move { this.count_rows_async().await })
    }

    fn has_filters(&self) -> bool {
        self.inner.options.filter.is_some() || self.inner.options.row_filter.is_some()
    }

    async fn count_rows_async(&self) -> Result<u64> {
        if !self.has_filters() {
            return footer_rows(self.inner.clone()).await;
        }
        let mut options = self.inner.options.clone();
        let mut columns = options
            .filter
            .as_ref()
            .map_or_else(Vec::new, |f| f.columns());
        if let Some(f) = &options.row_filter {
            columns.extend(f.0.columns().iter().cloned());
        }
        columns.sort();
        columns.dedup();
        options.columns = Some(columns);
        options.dictionary_columns.clear();
        let counting = options.build_async().await?;
        let mut stream = counting.scan();
        let mut total = 0u64;
        while let Some(batch) = StreamExt::next(&mut stream).await {
            total += batch?.batch.num_rows() as u64;
        }
        Ok(total)
    }

    /// Stream the dataset's batches in order (file, then row group).
    pub fn scan(&self) -> ScanStream {
        let (tx, rx) = mpsc::channel(2);
        let inner = self.inner.clone();
        let driver = runtime().spawn(async move {
            let tx_err = tx.clone();
            let run = AssertUnwindSafe(drive(inner, tx)).catch_unwind().await;
            if let Err(panic) = run {
                let _ = tx_err
                    .send(Err(ParquetError::InvalidArgument(format!(
                        "internal error in the scan driver: {}",
                        panic_message(&panic)
                    ))))
                    .await;
            }
        });
        ScanStream {
            rx,
            schema: self.schema(),
            driver,
        }
    }
}

/// Rows of the row groups a scan reads (what a [`ScanSkip`] leaves), from the footers
/// (read concurrently and cached).
async fn footer_rows(inner: Arc<DatasetInner>) -> Result<u64> {
    let skip = inner.options.skip.clone();
    let wanted: Vec<usize> = (0..inner.files.len())
        .filter(|&i| {
            !skip
                .as_ref()
                .is_some_and(|s| s.0.skip_file(&inner.files[i]))
        })
        .collect();
    let opened = futures::stream::iter(wanted)
        .map(|i| {
            let inner = inner.clone();
            async move { inner.open(i).await }
        })
        .buffered(FOOTER_CONCURRENCY);
    futures::pin_mut!(opened);
    let mut total = 0u64;
    while let Some(file) = opened.next().await {
        let file = file?;
        let footer = file.reader_meta.metadata();
        for (rg, meta) in footer.row_groups().iter().enumerate() {
            let skipped = skip
                .as_ref()
                .is_some_and(|s| s.0.skip_row_group_in(&file.entry, footer, rg));
            if !skipped {
                total += meta.num_rows().max(0) as u64;
            }
        }
    }
    Ok(total)
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

impl DatasetInner {
    /// Footer and read plan of file `index`, from the cache or read now.
    async fn open(self: &Arc<Self>, index: usize) -> Result<Arc<OpenedFile>> {
        if let Some(found) = self.opened.lock().expect("cache lock").get(&index) {
            return Ok(found.clone());
        }
        let entry = self.files[index].clone();
        let this = self.clone();
        let task = AssertUnwindSafe(async move { this.open_uncached(index, entry).await });
        let opened = match task.catch_unwind().await {
            Ok(result) => Arc::new(result?),
            Err(panic) => {
                return Err(ParquetError::Corrupt {
                    path: self.files[index].uri.to_string(),
                    row_group: None,
                    reason: format!(
                        "the Parquet footer could not be decoded: {}",
                        panic_message(&panic)
                    ),
                })
            }
        };
        self.opened
            .lock()
            .expect("cache lock")
            .insert(index, opened.clone());
        Ok(opened)
    }

    async fn open_uncached(&self, index: usize, entry: FileEntry) -> Result<OpenedFile> {
        let path = entry.uri.to_string();
        let metadata = read_footer(&entry, &self.io, self.wants_page_index()).await?;
        let file_schema = {
            let plain = ArrowReaderMetadata::try_new(metadata.clone(), ArrowReaderOptions::new())
                .map_err(|e| corrupt(&path, None, e))?;
            plain.schema().clone()
        };
        check_map_keys_required(metadata.file_metadata().schema(), &path)?;
        let hinted = apply_dictionary_hints(&file_schema, &self.options.dictionary_columns, &path)?;
        let hinted = apply_int96_unit(&hinted, &metadata, self.options.int96_unit);
        let reader_meta = ArrowReaderMetadata::try_new(
            metadata.clone(),
            ArrowReaderOptions::new().with_schema(hinted.clone()),
        )
        .map_err(|e| corrupt(&path, None, e))?;
        let parquet_schema = reader_meta.parquet_schema();

        let (projection, requested_roots) = resolve_projection(
            parquet_schema,
            &hinted,
            self.options.columns.as_deref(),
            &path,
        )?;
        // Decoded batches hold the selected roots in file order; output follows the request.
        let mut selected_roots: Vec<usize> = requested_roots.clone();
        selected_roots.sort_unstable();
        selected_roots.dedup();
        let reorder: Vec<usize> = requested_roots
            .iter()
            .map(|r| selected_roots.binary_search(r).expect("root is selected"))
            .collect();
        let decoded_schema = ParquetRecordBatchStreamBuilder::new_with_metadata(
            ObjectFileReader::new(entry.clone(), self.io.clone(), 0),
            reader_meta.clone(),
        )
        .with_projection(projection.clone())
        .with_row_groups(vec![])
        .build()
        .map_err(|e| corrupt(&path, None, e))?
        .schema()
        .clone();
        let output_schema = Arc::new(Schema::new(
            reorder
                .iter()
                .map(|&i| decoded_schema.field(i).clone())
                .collect::<Vec<Field>>(),
        ));
        if let Some(first) = self.schema.get() {
            check_same_schema(first, &output_schema, &path, &self.files[0].uri)?;
        }
        let flat_columns = if self.options.flat_decoder {
            flat_columns(parquet_schema, &selected_roots, &decoded_schema)
        } else {
            Vec::new()
        };

        let filter = match &self.options.filter {
            None => None,
            Some(predicate) => {
                let bound = predicate.bind(&hinted, &path)?;
                let roots: Vec<usize> = bound
                    .columns()
                    .iter()
                    .map(|c| hinted.index_of(c).expect("bind checked the column"))
                    .collect();
                let mask = ProjectionMask::roots(parquet_schema, roots);
                Some((mask, bound))
            }
        };
        Ok(OpenedFile {
            entry,
            index,
            reader_meta,
            projection,
            reorder,
            output_schema,
            filter,
            flat_columns,
            decoded_columns: selected_roots.len(),
        })
    }

    fn wants_page_index(&self) -> bool {
        self.options.filter.is_some() && self.options.use_page_index
    }

    fn coalesce_gap_for(&self, entry: &FileEntry) -> u64 {
        self.coalesce_gap.unwrap_or_else(|| {
            if entry.uri.contains("://") {
                1 << 20
            } else {
                0
            }
        })
    }

    /// Row groups of `file` that may hold matching rows, with page-level selections.
    fn plan_units(&self, file: &OpenedFile) -> Vec<Unit> {
        let metadata = file.reader_meta.metadata();
        let row_groups = metadata.row_groups();
        let mut first_row = 0u64;
        let starts: Vec<u64> = row_groups
            .iter()
            .map(|rg| {
                let s = first_row;
                first_row += rg.num_rows().max(0) as u64;
                s
            })
            .collect();
        let metrics = &self.scan_metrics;
        metrics
            .row_groups_total
            .fetch_add(row_groups.len() as u64, Ordering::Relaxed);
        let all = || {
            (0..row_groups.len())
                .map(|rg| Unit::new(file, rg, starts[rg], None))
                .collect()
        };
        let Some((_, bound)) = &file.filter else {
            return all();
        };

        let schema = file.reader_meta.schema().clone();
        let parquet_schema = file.reader_meta.parquet_schema();
        let orders = metadata
            .file_metadata()
            .column_orders()
            .map(|v| v.as_slice());
        let converter = |column: &str| -> Option<StatisticsConverter<'_>> {
            StatisticsConverter::try_new(column, &schema, parquet_schema)
                .ok()
                .map(|c| {
                    c.with_missing_null_counts_as_zero(false)
                        .with_column_orders(orders)
                })
        };
        let keep = bound.may_match(row_groups.len(), &mut |column| {
            let c = converter(column)?;
            Some(ContainerStats {
                mins: c.row_group_mins(row_groups.iter()).ok()?,
                maxes: c.row_group_maxes(row_groups.iter()).ok()?,
                null_counts: c.row_group_null_counts(row_groups.iter()).ok()?,
                row_counts: c.row_group_row_counts(row_groups.iter()).ok().flatten(),
                min_exact: c.row_group_is_min_value_exact(row_groups.iter()).ok(),
                max_exact: c.row_group_is_max_value_exact(row_groups.iter()).ok(),
                slots_per_container: None,
            })
        });
        let pruned = keep.iter().filter(|k| !**k).count() as u64;
        metrics
            .row_groups_pruned_by_statistics
            .fetch_add(pruned, Ordering::Relaxed);

        let page_index = metadata.page_index().map(|pi| pi.as_ref());
        let mut units = Vec::new();
        for (rg, _) in keep.iter().enumerate().filter(|(_, k)| **k) {
            let rows = row_groups[rg].num_rows().max(0) as usize;
            let selection = page_index.and_then(|pi| {
                let rg_list = [rg];
                let keep_rows = bound.may_match(rows, &mut |column| {
                    let c = converter(column)?;
                    let spans = c
                        .data_page_row_counts(pi, row_groups, rg_list.iter())
                        .ok()
                        .flatten()?;
                    if spans.null_count() > 0 {
                        return None;
                    }
                    Some(ContainerStats {
                        mins: c.data_page_mins(pi, rg_list.iter()).ok()?,
                        maxes: c.data_page_maxes(pi, rg_list.iter()).ok()?,
                        null_counts: c.data_page_null_counts(pi, rg_list.iter()).ok()?,
                        row_counts: Some(spans.clone()),
                        min_exact: None,
                        max_exact: None,
                        slots_per_container: Some(
                            spans.values().iter().map(|v| *v as usize).collect(),
                        ),
                    })
                });
                let selected = keep_rows.iter().filter(|k| **k).count();
                (selected < rows).then(|| (selection_from_mask(&keep_rows), rows - selected))
            });
            match selection {
                Some((_, skipped)) if skipped == rows => {
                    metrics
                        .row_groups_pruned_by_page_index
                        .fetch_add(1, Ordering::Relaxed);
                    metrics
                        .rows_pruned_by_page_index
                        .fetch_add(skipped as u64, Ordering::Relaxed);
                }
                Some((sel, skipped)) => {
                    metrics
                        .rows_pruned_by_page_index
                        .fetch_add(skipped as u64, Ordering::Relaxed);
                    units.push(Unit::new(file, rg, starts[rg], Some(sel)));
                }
                None => units.push(Unit::new(file, rg, starts[rg], None)),
            }
        }
        units
    }
}

fn selection_from_mask(keep: &[bool]) -> RowSelection {
    let mut ranges = Vec::new();
    let mut i = 0;
    while i < keep.len() {
        if keep[i] {
            let start = i;
            while i < keep.len() && keep[i] {
                i += 1;
            }
            ranges.push(start..i);
        } else {
            i += 1;
        }
    }
    RowSelection::from_consecutive_ranges(ranges.into_iter(), keep.len())
}

fn corrupt(path: &str, row_group: Option<usize>, err: impl std::fmt::Display) -> ParquetError {
    ParquetError::Corrupt {
        path: path.to_string(),
        row_group,
        reason: err.to_string(),
    }
}

async fn read_footer(
    entry: &FileEntry,
    io: &Arc<IoMetrics>,
    with_page_index: bool,
) -> Result<Arc<ParquetMetaData>> {
    let path = entry.uri.to_string();
    if entry.size < 12 {
        return Err(ParquetError::NotParquet {
            path,
            reason: format!("only {} bytes, smaller than any Parquet file", entry.size),
        });
    }
    // One request for the file's tail; the metadata reader is served from it when the
    // footer (and page index) fit, and goes back to the store only for what does not.
    let reader = ObjectFileReader::for_footer(entry.clone(), io.clone());
    let tail_len = (FOOTER_PREFETCH as u64).min(entry.size);
    let tail_start = entry.size - tail_len;
    let tail = reader.fetch(tail_start..entry.size).await?;
    let magic = &tail[tail.len() - 4..];
    if magic != b"PAR1" {
        let reason = if magic == b"PARE" {
            "encrypted footer; encrypted Parquet files are not supported".to_string()
        } else {
            format!(
                "the file does not end with the Parquet magic 'PAR1' (found {:?})",
                String::from_utf8_lossy(magic)
            )
        };
        return Err(ParquetError::NotParquet { path, reason });
    }
    let fetch = FooterFetch {
        reader,
        tail,
        tail_start,
    };
    let policy = if with_page_index {
        PageIndexPolicy::Optional
    } else {
        PageIndexPolicy::Skip
    };
    let first_try = ParquetMetaDataReader::new()
        .with_page_index_policy(policy)
        .load_and_finish(fetch.clone(), entry.size)
        .await;
    let metadata = match first_try {
        Ok(m) => m,
        Err(first_err) => match read_footer_leniently(&fetch, entry.size).await {
            Some(m) => m,
            None => {
                return Err(match ParquetError::from_decode(&path, None, first_err) {
                    ParquetError::Corrupt { path, reason, .. } => ParquetError::Corrupt {
                        path,
                        row_group: None,
                        reason: format!("cannot read the footer: {reason}"),
                    },
                    other => other,
                })
            }
        },
    };
    let metadata = repair::repair_metadata(metadata).map_err(|reason| ParquetError::Corrupt {
        path: path.clone(),
        row_group: None,
        reason,
    })?;
    let metadata = repair::measure_short_chunks(metadata, &fetch.reader, entry.size, &path).await?;
    Ok(Arc::new(metadata))
}

/// Second and third tries at a footer arrow-rs's decoder refused (no page index either
/// way): without fields whose wire type contradicts the spec (see [`repair::compact`]), then
/// without the optional statistics structures, which only serve pruning.
async fn read_footer_leniently(fetch: &FooterFetch, file_size: u64) -> Option<ParquetMetaData> {
    if let Some(footer) = footer_bytes(fetch, file_size).await {
        if let Some(sanitized) = repair::compact::drop_mistyped_fields(&footer) {
            if !sanitized.dropped.is_empty() {
                if let Ok(m) = ParquetMetaDataReader::decode_metadata(&sanitized.footer) {
                    return Some(m);
                }
            }
        }
    }
    ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Skip)
        .with_metadata_options(Some(
            ParquetMetaDataOptions::new()
                .with_column_stats_policy(ParquetStatisticsPolicy::SkipAll)
                .with_encoding_stats_policy(ParquetStatisticsPolicy::SkipAll)
                .with_size_stats_policy(ParquetStatisticsPolicy::SkipAll),
        ))
        .load_and_finish(fetch.clone(), file_size)
        .await
        .ok()
}

/// The thrift-encoded `FileMetaData` of a file (from the fetched tail when it holds it).
async fn footer_bytes(fetch: &FooterFetch, file_size: u64) -> Option<bytes::Bytes> {
    let tail = &fetch.tail;
    let len_bytes: [u8; 4] = tail
        .get(tail.len().checked_sub(8)?..tail.len() - 4)?
        .try_into()
        .ok()?;
    let footer_len = u64::from(u32::from_le_bytes(len_bytes));
    let end = file_size.checked_sub(8)?;
    let start = end.checked_sub(footer_len)?;
    if start >= fetch.tail_start {
        let from = (start - fetch.tail_start) as usize;
        return Some(tail.slice(from..from + footer_len as usize));
    }
    fetch.reader.fetch(start..end).await.ok()
}

/// Serves metadata reads from an already fetched tail of the file.
#[derive(Clone)]
struct FooterFetch {
    reader: ObjectFileReader,
    tail: bytes::Bytes,
    tail_start: u64,
}

impl parquet::arrow::async_reader::MetadataFetch for FooterFetch {
    fn fetch(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<bytes::Bytes>> {
        async move {
            if range.start >= self.tail_start {
                let start = (range.start - self.tail_start) as usize;
                let end = (range.end - self.tail_start) as usize;
                if end <= self.tail.len() {
                    return Ok(self.tail.slice(start..end));
                }
            }
            self.reader
                .fetch(range)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        }
        .boxed()
    }
}

/// Replace the named string/binary columns' types with `Dictionary(Int32, _)`.
fn apply_dictionary_hints(schema: &SchemaRef, columns: &[String], path: &str) -> Result<SchemaRef> {
    if columns.is_empty() {
        return Ok(schema.clone());
    }
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    for name in columns {
        let idx = schema
            .index_of(name)
            .map_err(|_| column_not_found(schema, name, path))?;
        let field = &fields[idx];
        let value = match field.data_type() {
            DataType::Dictionary(_, _) => continue,
            t @ (DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary) => t.clone(),
            DataType::Utf8View => DataType::Utf8,
            DataType::BinaryView => DataType::Binary,
            other => {
                return Err(ParquetError::InvalidArgument(format!(
                    "{path}: column '{name}' has type {other}; only string and binary columns can be read as dictionaries"
                )))
            }
        };
        let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(value));
        fields[idx] = field.clone().with_data_type(dict);
    }
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )))
}

/// Read INT96 leaves (top level or inside structs) as timestamps of `unit`.
fn apply_int96_unit(schema: &SchemaRef, metadata: &ParquetMetaData, unit: TimeUnit) -> SchemaRef {
    let int96: Vec<Vec<String>> = metadata
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .filter(|c| c.physical_type() == parquet::basic::Type::INT96)
        .map(|c| c.path().parts().to_vec())
        .collect();
    if unit == TimeUnit::Nanosecond || int96.is_empty() {
        return schema.clone();
    }
    fn rewrite(
        field: &Field,
        path: &mut Vec<String>,
        int96: &[Vec<String>],
        unit: TimeUnit,
    ) -> Field {
        path.push(field.name().clone());
        let data_type = match field.data_type() {
            DataType::Timestamp(TimeUnit::Nanosecond, tz) if int96.contains(path) => {
                DataType::Timestamp(unit, tz.clone())
            }
            DataType::Struct(children) => DataType::Struct(
                children
                    .iter()
                    .map(|c| Arc::new(rewrite(c, path, int96, unit)))
                    .collect(),
            ),
            other => other.clone(),
        };
        path.pop();
        field.clone().with_data_type(data_type)
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| rewrite(f, &mut Vec::new(), &int96, unit))
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Map keys must be required (Parquet spec; pyarrow refuses such files too): a nullable key
/// cannot be represented in Arrow's map type, and arrow-rs would silently coerce it.
fn check_map_keys_required(ty: &parquet::schema::types::Type, path: &str) -> Result<()> {
    use parquet::basic::{ConvertedType, LogicalType, Repetition};
    if !ty.is_group() {
        return Ok(());
    }
    let info = ty.get_basic_info();
    let is_map = matches!(info.logical_type_ref(), Some(LogicalType::Map))
        || matches!(
            info.converted_type(),
            ConvertedType::MAP | ConvertedType::MAP_KEY_VALUE
        );
    if is_map {
        if let Some(key_value) = ty.get_fields().first().filter(|kv| kv.is_group()) {
            if let Some(key) = key_value.get_fields().first() {
                let kinfo = key.get_basic_info();
                if kinfo.has_repetition() && kinfo.repetition() != Repetition::REQUIRED {
                    return Err(ParquetError::Corrupt {
                        path: path.to_string(),
                        row_group: None,
                        reason: format!(
                            "invalid schema: keys of map column '{}' must be required",
                            info.name()
                        ),
                    });
                }
            }
        }
    }
    ty.get_fields()
        .iter()
        .try_for_each(|child| check_map_keys_required(child, path))
}

/// A [`ParquetError::ColumnNotFound`] for `name`, listing the columns `schema` has.
pub(crate) fn column_not_found(schema: &Schema, name: &str, path: &str) -> ParquetError {
    ParquetError::ColumnNotFound {
        path: path.to_string(),
        column: name.to_string(),
        available: schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The selected roots (`decoded` is the schema of their decoded batch) that are flat columns
/// forebay's own decoders read (see `flat`).
fn flat_columns(
    parquet_schema: &parquet::schema::types::SchemaDescriptor,
    selected_roots: &[usize],
    decoded: &Schema,
) -> Vec<FlatColumn> {
    let mut leaf_of_root = vec![None; parquet_schema.root_schema().get_fields().len()];
    for leaf in 0..parquet_schema.num_columns() {
        let root = parquet_schema.get_column_root_idx(leaf);
        // A root with several leaves is nested; `FlatType::of` refuses it anyway.
        leaf_of_root[root] = Some(leaf);
    }
    selected_roots
        .iter()
        .enumerate()
        .filter_map(|(position, &root)| {
            let leaf = leaf_of_root[root]?;
            let data_type = decoded.field(position).data_type();
            let ty = FlatType::of(&parquet_schema.column(leaf), data_type)?;
            Some(FlatColumn { position, leaf, ty })
        })
        .collect()
}

/// Map requested names onto Parquet leaves. Returns the mask and, per requested name, the
/// index of its top-level (root) column.
fn resolve_projection(
    parquet_schema: &parquet::schema::types::SchemaDescriptor,
    arrow_schema: &Schema,
    columns: Option<&[String]>,
    path: &str,
) -> Result<(ProjectionMask, Vec<usize>)> {
    let root_names: Vec<&str> = parquet_schema
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name())
        .collect();
    let Some(columns) = columns else {
        return Ok((ProjectionMask::all(), (0..root_names.len()).collect()));
    };
    let mut leaves = Vec::new();
    let mut roots = Vec::new();
    for name in columns {
        let matched: Vec<usize> = match root_names.iter().position(|r| r == name) {
            // An exact top-level name wins (it may itself contain dots).
            Some(root) => (0..parquet_schema.num_columns())
                .filter(|&leaf| parquet_schema.get_column_root_idx(leaf) == root)
                .collect(),
            None => {
                let parts: Vec<&str> = name.split('.').collect();
                (0..parquet_schema.num_columns())
                    .filter(|&leaf| {
                        let path = parquet_schema.column(leaf).path().parts().to_vec();
                        path.len() >= parts.len() && parts.iter().zip(&path).all(|(a, b)| a == b)
                    })
                    .collect()
            }
        };
        let Some(&first) = matched.first() else {
            return Err(column_not_found(arrow_schema, name, path));
        };
        let root = parquet_schema.get_column_root_idx(first);
        if !roots.contains(&root) {
            roots.push(root);
        }
        leaves.extend(matched);
    }
    Ok((ProjectionMask::leaves(parquet_schema, leaves), roots))
}

fn check_same_schema(first: &Schema, this: &Schema, path: &str, first_path: &str) -> Result<()> {
    let mismatch = |reason: String| ParquetError::SchemaMismatch {
        path: path.to_string(),
        first: first_path.to_string(),
        reason,
    };
    if first.fields().len() != this.fields().len() {
        let names = |s: &Schema| -> Vec<String> {
            s.fields().iter().map(|f| f.name().to_string()).collect()
        };
        let (here, there) = (names(this), names(first));
        let extra: Vec<&String> = here.iter().filter(|n| !there.contains(n)).collect();
        let missing: Vec<&String> = there.iter().filter(|n| !here.contains(n)).collect();
        let mut differences = Vec::new();
        if !extra.is_empty() {
            differences.push(format!("has {extra:?}, which the first file has not"));
        }
        if !missing.is_empty() {
            differences.push(format!("lacks {missing:?}, which the first file has"));
        }
        return Err(mismatch(format!(
            "{} selected columns here, {} in the first file: this file {}; pass columns=[...] \
             to read the columns every file has",
            here.len(),
            there.len(),
            differences.join(" and ")
        )));
    }
    for (a, b) in first.fields().iter().zip(this.fields()) {
        if a.name() != b.name() || a.data_type() != b.data_type() {
            return Err(mismatch(format!(
                "column '{}' is {} here but '{}' {} in the first file",
                b.name(),
                b.data_type(),
                a.name(),
                a.data_type()
            )));
        }
    }
    Ok(())
}

/// Where a batch came from. Lets the engine skip finished work on resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchProvenance {
    /// The file's URI or absolute path.
    pub file: Arc<str>,
    /// Position of the file in the dataset's file list.
    pub file_index: usize,
    /// Row group within the file.
    pub row_group: usize,
    /// Index (within the file) of the row group's first row.
    pub row_group_first_row: u64,
    /// Index (within the file) of the batch's first row. Rows of an unfiltered batch are
    /// consecutive from here. `None` when a filter or page skipping removed rows, since the
    /// batch's rows are then not consecutive.
    pub first_row: Option<u64>,
    /// Ordinal of this batch among those of its row group.
    pub batch_index: usize,
}

/// A decoded batch and where it came from.
#[derive(Debug, Clone)]
pub struct ProvenancedBatch {
    pub batch: RecordBatch,
    pub provenance: BatchProvenance,
}

struct Unit {
    file: Arc<str>,
    file_index: usize,
    row_group: usize,
    first_row: u64,
    selection: Option<RowSelection>,
}

impl Unit {
    fn new(
        file: &OpenedFile,
        row_group: usize,
        first_row: u64,
        selection: Option<RowSelection>,
    ) -> Self {
        Unit {
            file: file.entry.uri.clone(),
            file_index: file.index,
            row_group,
            first_row,
            selection,
        }
    }
}

type BatchResult = Result<ProvenancedBatch>;

/// Rows per batch of the scan's first unit (when `batch_size` is larger).
const FIRST_UNIT_BATCH_ROWS: usize = 8192;

/// The scan driver: opens files ahead, keeps up to `prefetch` units decoding, and forwards
/// their batches in order.
async fn drive(inner: Arc<DatasetInner>, out: mpsc::Sender<BatchResult>) {
    let decode_permits = Arc::new(Semaphore::new(inner.threads));
    let skip = inner.options.skip.clone();
    let wanted: Vec<usize> = (0..inner.files.len())
        .filter(|&i| match &skip {
            Some(s) if s.0.skip_file(&inner.files[i]) => {
                inner
                    .scan_metrics
                    .files_skipped
                    .fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => true,
        })
        .collect();
    let opening = futures::stream::iter(wanted)
        .map(|i| {
            let inner = inner.clone();
            tokio::spawn(async move { inner.open(i).await })
        })
        .buffered(FOOTER_CONCURRENCY);
    futures::pin_mut!(opening);
    let mut pending_units: VecDeque<(Arc<OpenedFile>, Unit)> = VecDeque::new();
    let mut in_flight: VecDeque<mpsc::Receiver<BatchResult>> = VecDeque::new();
    let mut files_done = false;
    // The scan's first unit decodes smaller batches: its first batch is what the whole
    // pipeline waits for, and it is decoded while the next units compete for the cores.
    let mut batch_rows = inner.options.batch_size.min(FIRST_UNIT_BATCH_ROWS);

    loop {
        // Top up: launch units until `prefetch` are in flight or there are no more.
        while in_flight.len() < inner.prefetch {
            if let Some((file, unit)) = pending_units.pop_front() {
                let (tx, rx) = mpsc::channel(2);
                tokio::spawn(run_unit(
                    inner.clone(),
                    file,
                    unit,
                    batch_rows,
                    tx,
                    decode_permits.clone(),
                ));
                batch_rows = inner.options.batch_size;
                in_flight.push_back(rx);
                continue;
            }
            if files_done {
                break;
            }
            match opening.next().await {
                None => files_done = true,
                Some(Ok(Ok(file))) => {
                    for unit in inner.plan_units(&file) {
                        if let Some(s) = &skip {
                            let footer = file.reader_meta.metadata();
                            if s.0.skip_row_group_in(&file.entry, footer, unit.row_group) {
                                inner
                                    .scan_metrics
                                    .row_groups_skipped
                                    .fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                        }
                        pending_units.push_back((file.clone(), unit));
                    }
                }
                Some(Ok(Err(err))) => {
                    // Batches of earlier files first, then the error, in order.
                    drain_in_order(&mut in_flight, &out).await;
                    let _ = out.send(Err(err)).await;
                    return;
                }
                Some(Err(join)) => {
                    drain_in_order(&mut in_flight, &out).await;
                    let _ = out
                        .send(Err(ParquetError::InvalidArgument(format!(
                            "footer task failed: {join}"
                        ))))
                        .await;
                    return;
                }
            }
        }
        let Some(front) = in_flight.front_mut() else {
            return;
        };
        match front.recv().await {
            Some(Ok(batch)) => {
                if out.send(Ok(batch)).await.is_err() {
                    return; // consumer gone: dropping the receivers cancels the units
                }
            }
            Some(Err(err)) => {
                let _ = out.send(Err(err)).await;
                return;
            }
            None => {
                in_flight.pop_front();
            }
        }
    }
}

async fn drain_in_order(
    in_flight: &mut VecDeque<mpsc::Receiver<BatchResult>>,
    out: &mpsc::Sender<BatchResult>,
) {
    while let Some(mut rx) = in_flight.pop_front() {
        while let Some(item) = rx.recv().await {
            let stop = item.is_err();
            if out.send(item).await.is_err() || stop {
                return;
            }
        }
    }
}

/// Decode one row group into `tx`, batch by batch.
async fn run_unit(
    inner: Arc<DatasetInner>,
    file: Arc<OpenedFile>,
    unit: Unit,
    batch_rows: usize,
    tx: mpsc::Sender<BatchResult>,
    permits: Arc<Semaphore>,
) {
    let path = unit.file.clone();
    let rg = unit.row_group;
    let tx_panic = tx.clone();
    let work = AssertUnwindSafe(decode_unit(inner, file, unit, batch_rows, tx, permits));
    if let Err(panic) = work.catch_unwind().await {
        let _ = tx_panic
            .send(Err(ParquetError::Corrupt {
                path: path.to_string(),
                row_group: Some(rg),
                reason: format!("decoding failed: {}", panic_message(&panic)),
            }))
            .await;
    }
}

/// The most a column chunk may decompress to by default (what 32-bit Arrow offsets index).
pub const DEFAULT_MAX_COLUMN_CHUNK_BYTES: u64 = i32::MAX as u64;

/// Refuse a row group whose selected column chunks decompress past the limit (see
/// [`ParquetDatasetBuilder::with_max_column_chunk_bytes`]), before anything is fetched.
fn check_chunk_sizes(inner: &DatasetInner, file: &OpenedFile, path: &str, rg: usize) -> Result<()> {
    let limit = inner.options.max_column_chunk_bytes;
    let group = file.reader_meta.metadata().row_group(rg);
    for (leaf, column) in group.columns().iter().enumerate() {
        let bytes = column.uncompressed_size().max(0) as u64;
        if bytes > limit && file.projection.leaf_included(leaf) {
            return Err(ParquetError::TooLarge {
                path: path.to_string(),
                row_group: rg,
                column: column.column_path().string(),
                bytes,
                limit,
            });
        }
    }
    Ok(())
}

async fn decode_unit(
    inner: Arc<DatasetInner>,
    file: Arc<OpenedFile>,
    unit: Unit,
    batch_rows: usize,
    tx: mpsc::Sender<BatchResult>,
    permits: Arc<Semaphore>,
) {
    let path = unit.file.to_string();
    let rg = unit.row_group;
    let declared_rows = file.reader_meta.metadata().row_group(rg).num_rows().max(0) as u64;
    if let Err(e) = check_chunk_sizes(&inner, &file, &path, rg) {
        let _ = tx.send(Err(e)).await;
        return;
    }
    let provenance_of = |first_row: Option<u64>, batch_index: usize| BatchProvenance {
        file: unit.file.clone(),
        file_index: unit.file_index,
        row_group: rg,
        row_group_first_row: unit.first_row,
        first_row,
        batch_index,
    };
    let mut reader = ObjectFileReader::new(
        file.entry.clone(),
        inner.io.clone(),
        inner.coalesce_gap_for(&file.entry),
    )
    .with_metadata(file.reader_meta.metadata().clone());
    // The row filter may decide the whole row group from its dictionary page first (see
    // `ScanRowFilter::decide_by_values`): dropped unread, or read without the filter.
    let mut row_filter = inner.options.row_filter.as_ref();
    if let Some(hook) = row_filter {
        let rows = unit
            .selection
            .as_ref()
            .map_or(declared_rows, |s| s.row_count() as u64);
        let decided = {
            let _permit = permits.acquire().await.expect("semaphore is never closed");
            hook.decide_by_dictionary(&reader, &file.reader_meta, &path, rg, rows)
                .await
        };
        match decided {
            Ok(None) => {}
            Ok(Some(decided)) => {
                match decided.decision {
                    RowGroupDecision::DropAll => {
                        // As when the row filter drops every row (see `ScanRowFilter`).
                        let provenance = provenance_of(None, 0);
                        let batch = RecordBatch::new_empty(file.output_schema.clone());
                        let _ = tx.send(Ok(ProvenancedBatch { batch, provenance })).await;
                        return;
                    }
                    RowGroupDecision::KeepAll => row_filter = None,
                    RowGroupDecision::RowByRow => {}
                }
                reader = reader.with_prefetched(decided.page_range, decided.page);
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
    let rows_are_consecutive =
        unit.selection.is_none() && file.filter.is_none() && row_filter.is_none();
    let mut decoding = if rows_are_consecutive {
        match WholeRowGroup::open(&inner, &file, &reader, rg, batch_rows, &path).await {
            Ok(whole) => Decoding::Whole(whole),
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    } else {
        let mut builder =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, file.reader_meta.clone())
                .with_projection(file.projection.clone())
                .with_batch_size(batch_rows)
                .with_row_groups(vec![rg]);
        if let Some(selection) = unit.selection {
            builder = builder.with_row_selection(selection);
        }
        let mut predicates: Vec<Box<dyn ArrowPredicate>> = Vec::new();
        if let Some((mask, bound)) = &file.filter {
            let bound = bound.clone();
            let predicate =
                ArrowPredicateFn::new(mask.clone(), move |batch| bound.evaluate(&batch));
            predicates.push(Box::new(predicate));
        }
        if let Some(hook) = row_filter {
            match hook.predicate(&file.reader_meta, &path, rg) {
                Ok(predicate) => predicates.push(predicate),
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
        if !predicates.is_empty() {
            builder = builder.with_row_filter(RowFilter::new(predicates));
        }
        match builder.build() {
            Ok(stream) => Decoding::Filtered(stream),
            Err(e) => {
                let _ = tx.send(Err(corrupt(&path, Some(rg), e))).await;
                return;
            }
        }
    };
    let mut next_row = unit.first_row;
    let mut batch_index = 0;
    loop {
        let next = {
            let _permit = permits.acquire().await.expect("semaphore is never closed");
            match &mut decoding {
                Decoding::Filtered(stream) => stream.next().await.map(|r| {
                    r.map(|b| (b.num_rows(), b.columns().to_vec()))
                        .map_err(|e| ParquetError::from_decode(&path, Some(rg), e))
                }),
                Decoding::Whole(whole) => whole.next(file.decoded_columns, &path, rg),
            }
        };
        let columns = match next {
            None => {
                if row_filter.is_some() && batch_index == 0 {
                    // The row filter dropped every row: say so with an empty batch, so that
                    // provenance shows the unit ended (see `ScanRowFilter`).
                    let provenance = provenance_of(None, batch_index);
                    let batch = RecordBatch::new_empty(file.output_schema.clone());
                    let _ = tx.send(Ok(ProvenancedBatch { batch, provenance })).await;
                    return;
                }
                // Without filtering every row of the row group must come out; a shortfall
                // means the decoder could not make sense of the data (never silently drop).
                let decoded = next_row - unit.first_row;
                if rows_are_consecutive && decoded != declared_rows {
                    let reason = format!(
                        "decoded {decoded} rows but the row group declares {declared_rows}"
                    );
                    let _ = tx.send(Err(corrupt(&path, Some(rg), reason))).await;
                } else if let Decoding::Whole(whole) = &mut decoding {
                    if let Err(e) = whole.own.finish(&path, rg) {
                        let _ = tx.send(Err(e)).await;
                    }
                }
                return;
            }
            Some(Err(e)) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
            Some(Ok(columns)) => columns,
        };
        let (rows, columns) = columns;
        if rows == 0 {
            continue;
        }
        let columns = file.reorder.iter().map(|&i| columns[i].clone()).collect();
        let batch = match RecordBatch::try_new(file.output_schema.clone(), columns) {
            Ok(b) => b,
            Err(e) => {
                let _ = tx.send(Err(corrupt(&path, Some(rg), e))).await;
                return;
            }
        };
        let rows = rows as u64;
        let provenance = provenance_of(rows_are_consecutive.then_some(next_row), batch_index);
        next_row += rows;
        batch_index += 1;
        if tx
            .send(Ok(ProvenancedBatch { batch, provenance }))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// How a unit's rows are decoded.
enum Decoding {
    /// Rows selected or filtered: the parquet crate's async reader does it all.
    Filtered(ParquetRecordBatchStream<ObjectFileReader>),
    /// Every row of the row group, from its chunks fetched whole (see [`WholeRowGroup`]).
    Whole(WholeRowGroup),
}

/// A row group read whole: its selected column chunks fetched in one request, the flat
/// flat required ones decoded by forebay's own decoders (`flat`), the others by the
/// parquet crate over pages from `pages` (Snappy pages into recycled buffers).
struct WholeRowGroup {
    /// The parquet crate's part of each batch; `None` when every column is forebay's.
    theirs: Option<ParquetRecordBatchReader>,
    own: OwnDecoders,
    /// Rows not yet decoded, and rows per batch (to cut batches when every column is
    /// forebay's).
    rows_left: usize,
    batch_rows: usize,
}

impl WholeRowGroup {
    async fn open(
        inner: &DatasetInner,
        file: &OpenedFile,
        reader: &ObjectFileReader,
        rg: usize,
        batch_rows: usize,
        path: &str,
    ) -> Result<Self> {
        let metadata = file.reader_meta.metadata();
        let group = metadata.row_group(rg);
        let parquet_schema = file.reader_meta.parquet_schema();
        if group.num_rows() <= 0 {
            // Nothing to decode (and an empty row group's chunks may not even parse).
            return Ok(Self {
                theirs: None,
                own: OwnDecoders { chunks: Vec::new() },
                rows_left: 0,
                batch_rows,
            });
        }
        let leaves: Vec<usize> = (0..parquet_schema.num_columns())
            .filter(|&leaf| file.projection.leaf_included(leaf))
            .collect();
        let ranges: Vec<std::ops::Range<u64>> = leaves
            .iter()
            .map(|&leaf| {
                let (start, len) = group.column(leaf).byte_range();
                start..start + len
            })
            .collect();
        let fetched = reader
            .clone()
            .get_byte_ranges(ranges.clone())
            .await
            .map_err(|e| ParquetError::from_decode(path, Some(rg), e))?;
        let mut chunks = vec![None; parquet_schema.num_columns()];
        for ((&leaf, range), bytes) in leaves.iter().zip(ranges).zip(fetched) {
            chunks[leaf] = Some((range.start, bytes));
        }
        let rows = usize::try_from(group.num_rows().max(0)).unwrap_or(usize::MAX);

        let own_columns: Vec<&FlatColumn> = file
            .flat_columns
            .iter()
            .filter(|c| flat::chunk_is_supported(group.column(c.leaf)))
            .collect();
        let mut own = OwnDecoders { chunks: Vec::new() };
        for column in &own_columns {
            let chunk = group.column(column.leaf);
            let name = chunk.column_path().string();
            let (start, bytes) = chunks[column.leaf]
                .clone()
                .expect("selected leaves are fetched");
            let decoder = flat::decoder(&column.ty, chunk, start, bytes, rows, &inner.page_buffers)
                .map_err(|reason| corrupt(path, Some(rg), format!("column {name}: {reason}")))?;
            own.chunks.push((column.position, name, decoder));
        }
        inner
            .scan_metrics
            .flat_decoder_chunks
            .fetch_add(own_columns.len() as u64, Ordering::Relaxed);

        let their_leaves: Vec<usize> = leaves
            .into_iter()
            .filter(|&leaf| own_columns.iter().all(|c| c.leaf != leaf))
            .collect();
        let theirs = if their_leaves.is_empty() {
            None
        } else {
            let mask = ProjectionMask::leaves(parquet_schema, their_leaves);
            let levels = parquet_to_arrow_field_levels(
                parquet_schema,
                mask,
                Some(file.reader_meta.schema().fields()),
            )
            .map_err(|e| corrupt(path, Some(rg), e))?;
            let row_group = FetchedRowGroup {
                metadata,
                row_group: rg,
                chunks,
                buffers: inner.page_buffers.clone(),
            };
            let reader = ParquetRecordBatchReader::try_new_with_row_groups(
                &levels, &row_group, batch_rows, None,
            )
            .map_err(|e| corrupt(path, Some(rg), e))?;
            Some(reader)
        };
        Ok(Self {
            theirs,
            own,
            rows_left: rows,
            batch_rows,
        })
    }

    /// The next batch's rows and columns (in decoded order), or `None` after the last.
    fn next(
        &mut self,
        decoded_columns: usize,
        path: &str,
        rg: usize,
    ) -> Option<Result<(usize, Vec<ArrayRef>)>> {
        let batch = match &mut self.theirs {
            Some(reader) => match reader.next()? {
                Ok(batch) => batch,
                Err(e) => return Some(Err(corrupt(path, Some(rg), e))),
            },
            None if self.rows_left == 0 => return None,
            // Every column is forebay's: a batch of rows without columns for `splice`.
            None => {
                let rows = self.batch_rows.min(self.rows_left);
                let options = RecordBatchOptions::new().with_row_count(Some(rows));
                RecordBatch::try_new_with_options(Arc::new(Schema::empty()), Vec::new(), &options)
                    .expect("a batch without columns is valid")
            }
        };
        self.rows_left = self.rows_left.saturating_sub(batch.num_rows());
        Some(self.own.splice(batch, decoded_columns, path, rg))
    }
}

/// The column chunks of one row group that forebay's own decoders read, spliced
/// into the parquet crate's batches.
struct OwnDecoders {
    /// Per chunk: its position in the decoded batch, its column's name, its decoder.
    chunks: Vec<(usize, String, Box<dyn FlatDecoder>)>,
}

impl OwnDecoders {
    /// The decoded batch's rows and columns: `batch`'s (the parquet crate's part) with this
    /// row group's next `batch.num_rows()` values of each own chunk put in their places.
    fn splice(
        &mut self,
        batch: RecordBatch,
        decoded_columns: usize,
        path: &str,
        rg: usize,
    ) -> Result<(usize, Vec<ArrayRef>)> {
        let rows = batch.num_rows();
        if self.chunks.is_empty() {
            return Ok((rows, batch.columns().to_vec()));
        }
        let mut columns: Vec<Option<ArrayRef>> = vec![None; decoded_columns];
        for (position, name, decoder) in &mut self.chunks {
            let array = decoder
                .next_array(rows)
                .map_err(|reason| corrupt(path, Some(rg), format!("column {name}: {reason}")))?;
            columns[*position] = Some(array);
        }
        let mut theirs = batch.columns().iter();
        let columns = columns
            .into_iter()
            .map(|own| {
                own.or_else(|| theirs.next().cloned()).ok_or_else(|| {
                    corrupt(
                        path,
                        Some(rg),
                        "the decoded batch lacks columns (forebay bug)",
                    )
                })
            })
            .collect::<Result<_>>()?;
        Ok((rows, columns))
    }

    /// An error when an own chunk holds more values than the rows read.
    fn finish(&mut self, path: &str, rg: usize) -> Result<()> {
        for (_, name, decoder) in &mut self.chunks {
            decoder
                .finish()
                .map_err(|reason| corrupt(path, Some(rg), format!("column {name}: {reason}")))?;
        }
        Ok(())
    }
}

/// Batches of a scan, in order. Use as a blocking [`Iterator`] from synchronous code or as
/// a [`Stream`] from async code. Dropping it cancels the scan.
pub struct ScanStream {
    rx: mpsc::Receiver<BatchResult>,
    schema: SchemaRef,
    driver: tokio::task::JoinHandle<()>,
}

impl ScanStream {
    /// The schema of every batch.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Next batch, waiting for it (not for use on an async runtime's thread).
    pub fn next_blocking(&mut self) -> Option<BatchResult> {
        futures::executor::block_on(self.rx.recv())
    }
}

impl Drop for ScanStream {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Iterator for ScanStream {
    type Item = BatchResult;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_blocking()
    }
}

impl Stream for ScanStream {
    type Item = BatchResult;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// Plain batches, as an Arrow [`RecordBatchReader`](arrow::record_batch::RecordBatchReader)
/// (what the Arrow C stream interface exports).
pub struct RecordBatchIter(pub ScanStream);

impl Iterator for RecordBatchIter {
    type Item = std::result::Result<RecordBatch, arrow::error::ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0
            .next_blocking()
            .map(|r| r.map(|p| p.batch).map_err(Into::into))
    }
}

impl arrow::record_batch::RecordBatchReader for RecordBatchIter {
    fn schema(&self) -> SchemaRef {
        self.0.schema()
    }
}
