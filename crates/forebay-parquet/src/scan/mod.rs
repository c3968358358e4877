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
//!
//! One phase per module:
//!
//! | module    | phase                                                                     |
//! |-----------|---------------------------------------------------------------------------|
//! | `builder` | the options ([`ParquetDatasetBuilder`]) and a resume's [`ScanSkip`]        |
//! | `footer`  | reading a footer (one request for most files; on object stores the first |
//! |           | files' requested together, while the schema's is read), row counts       |
//! | `evolve`  | files of differing schemas read as one: nulls, widening (a visible rule)   |
//! | `partitions` | hive-style `key=value` directories as columns; a filter decided per file |
//! | `schema`  | a file's schema for the scan: options applied, projection, flat columns    |
//! | `open`    | a file's footer turned into its read plan (`OpenedFile`), cached           |
//! | `prune`   | the units of a file a filter may match (statistics, page index)            |
//! | `plan`    | the units as a host engine sees them ([`ScanUnit`]), a scan of some of them |
//! | `driver`  | units in flight under `prefetch`, their batches forwarded in order         |
//! | `fetch_ahead` | on object stores: units' chunks requested ahead of decoding, how far measured |
//! | `accounting` | what a scan charges to a host's memory pool, unit by unit               |
//! | `decode`  | one unit decoded: forebay's flat decoders, the parquet crate for the rest  |
//! | `row_ranges` | chosen rows of chosen row groups, in the caller's order (training)      |
//! | `page_locations` | where the pages are in files without a page index, found once  |
//! | `selectivity` | a filtered unit decoded whole then filtered, or through a RowFilter    |
//! | `stream`  | what the caller holds: [`ScanStream`] of [`ProvenancedBatch`]es            |
//! | `runtime` | the tokio runtime all of it runs on, and [`block_on`]                      |
//! | `metrics` | counters of what was read and pruned                                       |
//!
//! This module holds [`ParquetDataset`] (the public face) and the state the phases share.

mod accounting;
mod builder;
mod decode;
mod driver;
mod evolve;
mod fetch_ahead;
mod footer;
mod metrics;
mod open;
mod page_locations;
mod partitions;
mod plan;
mod prune;
mod row_ranges;
mod runtime;
mod schema;
mod selectivity;
mod stream;

pub use builder::{AllSkips, ParquetDatasetBuilder, ScanSkip};
pub use decode::DEFAULT_MAX_COLUMN_CHUNK_BYTES;
pub use metrics::ScanMetricsSnapshot;
pub use plan::{ColumnStatistics, ScanUnit};
pub use row_ranges::{FileRowGroups, RowRange};
pub use runtime::{block_on, runtime};
pub use stream::{BatchProvenance, BlockingScan, ProvenancedBatch, RecordBatchIter, ScanStream};

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::RecordBatch;
use arrow_schema::{SchemaRef, TimeUnit};
use futures::{FutureExt, StreamExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection};
use parquet::arrow::ProjectionMask;
use tokio::sync::mpsc;

use crate::error::{ParquetError, Result};
use crate::flat::FlatType;
use crate::io::{FileEntry, IoMetrics};
use crate::pages::PageBuffers;
use crate::predicate::{BoundPredicate, Predicate};
use crate::row_filter::{RowFilterHook, ScanRowFilter};
use crate::source::{DatasetSource, DEFAULT_FILE_EXTENSIONS};

use builder::Skip;
use driver::drive;
use footer::footer_rows;
use metrics::ScanMetrics;
use runtime::panic_message;

/// A lazily read Parquet dataset: files resolved, footers read on demand and cached.
/// Cheap to clone; every scan shares the metadata cache and counters.
///
/// ```
/// use std::sync::Arc;
/// use forebay_parquet::arrow_array::{ArrayRef, Int64Array, RecordBatch};
/// use forebay_parquet::parquet::arrow::ArrowWriter;
/// use forebay_parquet::{DatasetSource, ParquetDataset, Predicate};
///
/// let dir = std::env::temp_dir().join(format!("forebay-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
/// let batch = RecordBatch::try_from_iter([("id", ids)])?;
/// let mut writer = ArrowWriter::try_new(std::fs::File::create(dir.join("a.parquet"))?, batch.schema(), None)?;
/// writer.write(&batch)?;
/// writer.close()?;
///
/// let dataset = ParquetDataset::builder(DatasetSource::uris([dir.display().to_string()]))
///     .with_filter(Predicate::gt("id", 989))
///     .build()?;
/// assert_eq!(dataset.count_rows()?, 10);
/// let rows: usize = dataset
///     .scan()
///     .blocking_iter()
///     .map(|b| b.map(|b| b.batch.num_rows()))
///     .sum::<Result<_, _>>()?;
/// assert_eq!(rows, 10);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ParquetDataset {
    inner: Arc<DatasetInner>,
}

/// What every scan of a dataset shares: options, files, the footer cache, counters.
struct DatasetInner {
    options: ParquetDatasetBuilder,
    files: Vec<FileEntry>,
    io: Arc<IoMetrics>,
    /// Shared with a dataset derived only to push a limit down (`with_limit`).
    scan_metrics: Arc<ScanMetrics>,
    threads: usize,
    prefetch: usize,
    /// Units whose data is fetched ahead of their decoding, on object stores (see
    /// `fetch_ahead`): the builder's, else set from the first file once it is open.
    fetch_ahead: AtomicUsize,
    coalesce_gap: Option<u64>,
    /// Footer + plan per file index: each footer is read once per dataset.
    opened: Mutex<HashMap<usize, Arc<OpenedFile>>>,
    /// Tails of files requested before their footers are read (see
    /// `DatasetInner::request_footers_ahead`), by file index.
    tails_ahead: Mutex<HashMap<usize, footer::TailAhead>>,
    schema: OnceLock<SchemaRef>,
    /// Decompression buffers recycled from page to page (see `pages`).
    page_buffers: Arc<PageBuffers>,
    /// What the filter kept of the rows it saw (see `selectivity`).
    filter_selectivity: Arc<selectivity::FilterSelectivity>,
    /// Hive-style partition columns, when read and the files have some (see `partitions`).
    partitions: Option<Arc<partitions::Partitions>>,
    /// The columns read from the files (`with_columns` without partition keys; None: all).
    file_columns: Option<Vec<String>>,
    /// The file whose footer gives the dataset's schema (and the scan's estimates): the
    /// first one not ruled out by its partition values (the first, without).
    schema_file: usize,
}

impl Drop for DatasetInner {
    /// Requests made ahead for footers nobody will read stop with the dataset.
    fn drop(&mut self) {
        let tails = self
            .tails_ahead
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        for tail in tails.values() {
            tail.abort();
        }
    }
}

/// Everything needed to read one file's row groups, derived once from its footer.
struct OpenedFile {
    entry: FileEntry,
    index: usize,
    reader_meta: ArrowReaderMetadata,
    projection: ProjectionMask,
    /// Position in the decoded batch of each output column, in output order.
    reorder: Vec<usize>,
    /// The schema of the batches it decodes (its selected columns, in output order).
    output_schema: SchemaRef,
    /// With schema evolution (`evolve`): how its batches become the dataset's schema. Set
    /// once the dataset's schema is known.
    adapter: OnceLock<evolve::Adapter>,
    filter: Option<(ProjectionMask, BoundPredicate)>,
    /// A row group read whole (every row, no filter in the decoder).
    whole: WholeDecode,
    /// With a filter: a row group read whole and then filtered (see `selectivity`).
    filtered_whole: Option<FilteredWhole>,
    /// Where its pages are, found when part of a row group is read and the file has no
    /// offset index (see `page_locations`).
    page_locations: page_locations::PageLocations,
    /// The dataset's partition columns, whose values for this file are added to its batches.
    partitions: Option<Arc<partitions::Partitions>>,
}

/// How a row group read whole is decoded.
#[derive(Clone)]
struct WholeDecode {
    /// The leaves read.
    projection: ProjectionMask,
    /// The decoded batch: one column per root read, in file order.
    schema: SchemaRef,
    /// Columns of the decoded batch that forebay's own decoders may read (see `flat`); the
    /// parquet crate decodes the rest.
    flat_columns: Vec<FlatColumn>,
}

/// How a row group is decoded whole and then filtered: with the filter's columns the scan
/// does not return, dropped after filtering.
struct FilteredWhole {
    decode: WholeDecode,
    /// The decoded columns the scan returns (positions in `decode`'s batch, in the plain
    /// decoded order); None: all of them.
    returned: Option<Vec<usize>>,
}

/// A column of a file that forebay's own decoder may read.
#[derive(Clone)]
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
            fetch_ahead: None,
            num_threads: None,
            dictionary_columns: Vec::new(),
            int96_unit: TimeUnit::Nanosecond,
            skip: None,
            row_filter: None,
            coalesce_gap: None,
            use_page_index: true,
            for_row_ranges: false,
            flat_decoder: true,
            file_extensions: Some(
                DEFAULT_FILE_EXTENSIONS
                    .iter()
                    .map(|e| e.to_string())
                    .collect(),
            ),
            max_column_chunk_bytes: DEFAULT_MAX_COLUMN_CHUNK_BYTES,
            limit: None,
            schema: None,
            union_schema: false,
            runtime: None,
            memory_pool: None,
            hive_partitioning: false,
            hive_schema: None,
            partition_base: Vec::new(),
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
        if let Some(output) = self
            .inner
            .partitions
            .as_ref()
            .and_then(|p| p.output_schema())
        {
            return output;
        }
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

    /// The same dataset (its files and cached footers) yielding at most `rows` rows a scan
    /// (the smaller of this and a limit it has; see
    /// [`ParquetDatasetBuilder::with_limit`]): a host's limit right after the scan, pushed
    /// into it, so that it neither starts nor fetches ahead row groups past the limit. Its
    /// scans count in this dataset's metrics.
    pub fn with_limit(&self, rows: u64) -> ParquetDataset {
        let mut options = self.inner.options.clone();
        options.limit = Some(options.limit.map_or(rows, |limit| limit.min(rows)));
        // The same scan as far as the caller can tell: its counters are this dataset's.
        self.derived(options, self.inner.scan_metrics.clone())
    }

    /// The same dataset (its files and cached footers) skipping what `skip` says on top of
    /// what it skips already (a task's [`ByteRangeSplit`](crate::ByteRangeSplit) after a
    /// resume's finished input). Its metrics start from zero.
    pub fn and_skip(&self, skip: Arc<dyn ScanSkip>) -> ParquetDataset {
        let skip = match &self.inner.options.skip {
            Some(Skip(present)) => Arc::new(AllSkips(vec![present.clone(), skip])),
            None => skip,
        };
        self.with_skip(skip)
    }

    /// The same dataset (its files and cached footers) dropping rows by `filter` while
    /// decoding (see [`ScanRowFilter`]). Its metrics start from zero.
    pub fn with_row_filter(&self, filter: Arc<dyn ScanRowFilter>) -> ParquetDataset {
        let mut options = self.inner.options.clone();
        options
            .row_filter
            .get_or_insert_with(RowFilterHook::default)
            .rows = Some(filter);
        self.with_options(options)
    }

    /// This dataset's files and cached footers under other scan options (ones that change
    /// neither the files nor how a footer is planned); its metrics start from zero.
    fn with_options(&self, options: ParquetDatasetBuilder) -> ParquetDataset {
        self.derived(options, Arc::default())
    }

    /// [`with_options`](Self::with_options), counting scans in `scan_metrics`.
    fn derived(
        &self,
        options: ParquetDatasetBuilder,
        scan_metrics: Arc<ScanMetrics>,
    ) -> ParquetDataset {
        let inner = &self.inner;
        let schema = OnceLock::new();
        if let Some(s) = inner.schema.get() {
            let _ = schema.set(s.clone());
        }
        let opened = inner.opened.lock().expect("cache lock").clone();
        // Tails requested ahead go to the derived dataset, which is the one scanned (as a
        // resume or a hashing worker does); those of files it skips stay here, for another
        // derived dataset (each worker of a checkpoint load skips the others' files).
        let tails_ahead: HashMap<usize, footer::TailAhead> = {
            let mut here = inner.tails_ahead.lock().expect("tails lock");
            let wanted: Vec<usize> = here
                .keys()
                .copied()
                .filter(|&index| {
                    options
                        .skip
                        .as_ref()
                        .is_none_or(|skip| !skip.0.skip_file(&inner.files[index]))
                        && !inner.excluded_by_partition(index)
                })
                .collect();
            wanted
                .into_iter()
                .filter_map(|index| here.remove(&index).map(|tail| (index, tail)))
                .collect()
        };
        ParquetDataset {
            inner: Arc::new(DatasetInner {
                options,
                files: inner.files.clone(),
                io: inner.io.clone(),
                scan_metrics,
                threads: inner.threads,
                prefetch: inner.prefetch,
                fetch_ahead: AtomicUsize::new(inner.fetch_ahead.load(Ordering::Relaxed)),
                coalesce_gap: inner.coalesce_gap,
                opened: Mutex::new(opened),
                tails_ahead: Mutex::new(tails_ahead),
                schema,
                page_buffers: inner.page_buffers.clone(),
                filter_selectivity: Default::default(),
                partitions: inner.partitions.clone(),
                file_columns: inner.file_columns.clone(),
                schema_file: inner.schema_file,
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

    /// The hive partition columns read from the files' directories (see
    /// [`with_hive_partitioning`](ParquetDatasetBuilder::with_hive_partitioning)), if any.
    pub fn partition_schema(&self) -> Option<SchemaRef> {
        self.inner.partitions.as_ref().map(|p| p.schema.clone())
    }

    /// The files (indices into [`files`](Self::files)) the filter's terms on hive partition
    /// columns rule out: a scan neither opens nor reads them.
    pub fn files_pruned_by_partition(&self) -> Vec<usize> {
        (0..self.inner.files.len())
            .filter(|&i| self.inner.excluded_by_partition(i))
            .collect()
    }

    /// Whether the filter is decided by hive partition values alone: it keeps every row of
    /// some files and drops the others whole (see
    /// [`with_hive_partitioning`](ParquetDatasetBuilder::with_hive_partitioning)).
    pub fn filter_keeps_whole_files(&self) -> bool {
        self.inner.filter_keeps_whole_files()
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
            files_pruned_by_partition: m.files_pruned_by_partition.load(Ordering::Relaxed),
            row_groups_skipped: m.row_groups_skipped.load(Ordering::Relaxed),
            flat_decoder_chunks: m.flat_decoder_chunks.load(Ordering::Relaxed),
            row_groups_pages_located: m.row_groups_pages_located.load(Ordering::Relaxed),
            row_groups_filtered_after_decoding: m
                .row_groups_filtered_after_decoding
                .load(Ordering::Relaxed),
            io: self.inner.io.snapshot(),
        }
    }

    /// An upper estimate of the memory a scan holds internally, from the first file's footer:
    /// the selected column chunks of `prefetch` row groups in flight, the decoded batches
    /// waiting in each row group's channel (up to 2) and in the scan's output channel (2).
    /// A caller that accounts for memory (the engine) reserves this for the scan as a whole.
    pub fn scan_window_bytes(&self) -> u64 {
        self.scan_window_bytes_fetching_ahead(self.fetch_ahead())
    }

    /// [`scan_window_bytes`](Self::scan_window_bytes) of a scan fetching at most `units` row
    /// groups ahead of their decoding ([`scan_fetching_ahead`](Self::scan_fetching_ahead)).
    pub fn scan_window_bytes_fetching_ahead(&self, units: usize) -> u64 {
        let opened = self.inner.opened.lock().expect("cache lock");
        let Some(file) = opened.get(&self.inner.schema_file) else {
            return 0;
        };
        let SelectedSizes {
            compressed,
            uncompressed,
            rows,
            groups,
        } = SelectedSizes::of(file);
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
        // Small remote files fetched whole with their footers wait for their units: at most
        // the files opened ahead of the scan.
        let whole_files_ahead = if self.inner.fetched_whole(&file.entry) {
            self.inner.files_opened_ahead_after(&file.entry, units) as u64 * file.entry.size
        } else {
            0
        };
        // Column chunks fetched ahead of their decoding (remote files, see `fetch_ahead`).
        let fetched_ahead = self.inner.fetch_ahead_for(file, units) as u64 * per_group;
        prefetch * (per_group + 2 * per_batch) + 2 * per_batch + whole_files_ahead + fetched_ahead
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
        let all = self.block_on(footer_rows(self.inner.clone())).ok()?;
        Some(self.inner.options.limit.map_or(all, |limit| all.min(limit)))
    }

    /// Row groups a scan keeps in flight (fetched or decoding; bounds its memory).
    pub fn prefetch(&self) -> usize {
        self.inner.prefetch
    }

    /// Batches a scan decodes at once: when its consumer takes a batch, this many new ones
    /// may be allocated before the consumer sees any of them.
    /// Row groups whose data a scan requests ahead of their decoding on object stores (see
    /// [`ParquetDatasetBuilder::with_fetch_ahead`]).
    pub fn fetch_ahead(&self) -> usize {
        self.inner.fetch_ahead.load(Ordering::Relaxed)
    }

    pub fn decode_threads(&self) -> usize {
        self.inner.threads
    }

    /// Number of rows a scan yields: from footers alone when there is no filter (leaving
    /// out what a [`ScanSkip`] skips), otherwise by scanning only the filters' columns.
    pub fn count_rows(&self) -> Result<u64> {
        let this = self.clone();
        self.block_on(async move { this.count_rows_async().await })
    }

    /// [`Self::count_rows`] for async callers.
    pub async fn count_rows_async(&self) -> Result<u64> {
        let all = self.count_all_rows().await?;
        Ok(self.inner.options.limit.map_or(all, |limit| all.min(limit)))
    }

    /// Wait from a blocking caller for `fut`, run on the dataset's runtime.
    pub(super) fn block_on<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        forebay_io::block_on_in(&self.inner.options.runtime_handle(), fut)
    }

    fn has_filters(&self) -> bool {
        self.inner.options.filter.is_some() || self.inner.options.row_filter.is_some()
    }

    async fn count_all_rows(&self) -> Result<u64> {
        let decided_by_partitions =
            self.inner.options.row_filter.is_none() && self.filter_keeps_whole_files();
        if !self.has_filters() || decided_by_partitions {
            return footer_rows(self.inner.clone()).await;
        }
        let mut options = self.inner.options.clone();
        let mut columns = options
            .filter
            .as_ref()
            .map_or_else(Vec::new, |f| f.columns());
        if let Some(f) = &options.row_filter {
            columns.extend(f.columns());
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
        self.scan_fetching_ahead(self.fetch_ahead())
    }

    /// [`scan`](Self::scan), requesting the data of at most `units` row groups ahead of
    /// their decoding on object stores instead of the dataset's
    /// [`fetch_ahead`](Self::fetch_ahead) (a caller with a memory cap fitting the scan's
    /// window, [`scan_window_bytes_fetching_ahead`](Self::scan_window_bytes_fetching_ahead)).
    pub fn scan_fetching_ahead(&self, units: usize) -> ScanStream {
        let (tx, rx) = mpsc::channel(2);
        let inner = self.inner.clone();
        let driver = self.inner.options.runtime_handle().spawn(async move {
            let tx_err = tx.clone();
            let run = AssertUnwindSafe(drive(inner, tx, units))
                .catch_unwind()
                .await;
            if let Err(panic) = run {
                let _ = tx_err
                    .send(Err(ParquetError::InvalidArgument(format!(
                        "internal error in the scan driver: {}",
                        panic_message(&panic)
                    ))))
                    .await;
            }
        });
        ScanStream::new(rx, self.schema(), driver, self.inner.options.limit)
    }

    /// The most rows a scan yields ([`with_limit`](ParquetDatasetBuilder::with_limit)).
    pub fn limit(&self) -> Option<u64> {
        self.inner.options.limit
    }
}

/// The selected column chunks of a file, summed over its row groups.
struct SelectedSizes {
    compressed: u64,
    uncompressed: u64,
    rows: u64,
    groups: u64,
}

impl SelectedSizes {
    fn of(file: &OpenedFile) -> Self {
        let mut sizes = SelectedSizes {
            compressed: 0,
            uncompressed: 0,
            rows: 0,
            groups: 0,
        };
        for rg in file.reader_meta.metadata().row_groups() {
            sizes.groups += 1;
            sizes.rows += rg.num_rows().max(0) as u64;
            for (leaf, column) in rg.columns().iter().enumerate() {
                if file.projection.leaf_included(leaf) {
                    sizes.compressed += column.compressed_size().max(0) as u64;
                    sizes.uncompressed += column.uncompressed_size().max(0) as u64;
                }
            }
        }
        sizes
    }
}

/// What the scan decodes as one piece: a row group of a file, or the rows of it a page-index
/// selection keeps.
#[derive(Clone)]
struct Unit {
    file: Arc<str>,
    file_index: usize,
    row_group: usize,
    first_row: u64,
    selection: Option<RowSelection>,
}

impl OpenedFile {
    /// A decoded batch of this file as a batch of the dataset (adapted to its schema when
    /// files may differ).
    fn finish_batch(&self, batch: RecordBatch, row_group: usize) -> Result<RecordBatch> {
        let batch = match self.adapter.get() {
            Some(adapter) => adapter.apply(&batch, row_group)?,
            None => batch,
        };
        match &self.partitions {
            Some(partitions) => partitions.assemble(self.index, &batch, &self.entry.uri),
            None => Ok(batch),
        }
    }
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
