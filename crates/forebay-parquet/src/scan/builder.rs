//! How a dataset is read: the builder's options, and the skip a resume passes in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arrow_schema::{SchemaRef, TimeUnit};
use parquet::file::metadata::ParquetMetaData;

use super::partitions::{FileFilter, Partitions};
use super::runtime::default_threads;
use super::{DatasetInner, ParquetDataset};
use crate::error::{ParquetError, Result};
use crate::io::{FileEntry, IoMetrics};
use crate::predicate::Predicate;
use crate::row_filter::{ArrowPredicates, RowFilterHook, ScanRowFilter};
use crate::source::{place_under_bases, resolve, DatasetSource};
use forebay_io::block_on_in;
use forebay_io::memory::MemoryPool;

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

/// Skips that add up: a file or row group is skipped when any of them skips it.
#[derive(Clone)]
pub struct AllSkips(pub Vec<Arc<dyn ScanSkip>>);

impl ScanSkip for AllSkips {
    fn skip_file(&self, file: &FileEntry) -> bool {
        self.0.iter().any(|s| s.skip_file(file))
    }

    fn skip_row_group(&self, file: &FileEntry, row_group: usize) -> bool {
        self.0.iter().any(|s| s.skip_row_group(file, row_group))
    }

    fn skip_row_group_in(
        &self,
        file: &FileEntry,
        footer: &ParquetMetaData,
        row_group: usize,
    ) -> bool {
        self.0
            .iter()
            .any(|s| s.skip_row_group_in(file, footer, row_group))
    }
}

/// A [`ScanSkip`] in the builder (which derives `Debug`).
#[derive(Clone)]
pub(super) struct Skip(pub(super) Arc<dyn ScanSkip>);

impl std::fmt::Debug for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScanSkip")
    }
}

/// How to read a dataset. Build with [`ParquetDataset::builder`].
#[derive(Debug, Clone)]
pub struct ParquetDatasetBuilder {
    pub(super) source: DatasetSource,
    pub(super) columns: Option<Vec<String>>,
    pub(super) filter: Option<Predicate>,
    pub(super) batch_size: usize,
    pub(super) prefetch: Option<usize>,
    pub(super) fetch_ahead: Option<usize>,
    pub(super) num_threads: Option<usize>,
    pub(super) dictionary_columns: Vec<String>,
    pub(super) int96_unit: TimeUnit,
    pub(super) skip: Option<Skip>,
    pub(super) row_filter: Option<RowFilterHook>,
    pub(super) coalesce_gap: Option<u64>,
    pub(super) use_page_index: bool,
    pub(super) for_row_ranges: bool,
    pub(super) flat_decoder: bool,
    /// Endings of the names a directory listing keeps (None: every name).
    pub(super) file_extensions: Option<Vec<String>>,
    /// The most one selected column chunk may decompress to (its footer's size).
    pub(super) max_column_chunk_bytes: u64,
    /// The most rows a scan yields (None: all).
    pub(super) limit: Option<u64>,
    /// The dataset's schema, files adapted to it (see `evolve`).
    pub(super) schema: Option<SchemaRef>,
    /// The dataset's schema is the union of its files' (see `evolve`).
    pub(super) union_schema: bool,
    /// Where the scan's tasks run (None: forebay-io's `handle()`).
    pub(super) runtime: Option<tokio::runtime::Handle>,
    /// The host's pool the scan charges what it holds (None: no accounting).
    pub(super) memory_pool: Option<Arc<dyn MemoryPool>>,
    /// Files' `key=value` directories give columns (see `partitions`).
    pub(super) hive_partitioning: bool,
    /// The types of some or all partition keys (the others inferred).
    pub(super) hive_schema: Option<SchemaRef>,
    /// Directories above files named on their own, for their partition values.
    pub(super) partition_base: Vec<String>,
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
    /// The rows of the others are filtered in the decoder while the filter is selective,
    /// and after decoding the row group whole once it has been measured to keep most rows
    /// (see `row_groups_filtered_after_decoding` in [`ParquetDataset::metrics`]).
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

    /// The most row groups whose column chunks are requested ahead of their decoding when
    /// they are on an object store, beyond the `prefetch` ones decoding (0: none; default:
    /// as many of the first file's row groups as 256 MiB of their selected chunks holds,
    /// 32 to 256). Each request waits a round trip before its first byte: more in flight
    /// keep a slow link busy. How many are is measured: a scan starts as many ahead as its
    /// cores decode in a round trip (at least 8) and goes deeper whenever decoding waits
    /// for data, shallower while data waits for decoding. Applies
    /// to scans without a row filter, to row groups without a page selection (a filter's
    /// columns are fetched with the returned ones); the most is counted in
    /// [`ParquetDataset::scan_window_bytes`].
    pub fn with_fetch_ahead(mut self, units: usize) -> Self {
        self.fetch_ahead = Some(units);
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
    /// groups are counted in [`ScanMetricsSnapshot`](super::ScanMetricsSnapshot).
    pub fn with_skip(mut self, skip: Arc<dyn ScanSkip>) -> Self {
        self.skip = Some(Skip(skip));
        self
    }

    /// Drop rows by the caller's own test while decoding (see [`ScanRowFilter`]): the other
    /// columns are decoded only for the rows it keeps. Applied after [`Self::with_filter`].
    pub fn with_row_filter(mut self, filter: Arc<dyn ScanRowFilter>) -> Self {
        self.row_filter
            .get_or_insert_with(RowFilterHook::default)
            .rows = Some(filter);
        self
    }

    /// Drop rows by a host's own predicates while decoding (see [`ArrowPredicates`]): the
    /// parquet crate's `ArrowPredicate`s, made per row group. Applied after
    /// [`Self::with_filter`] and [`Self::with_row_filter`].
    pub fn with_arrow_predicates(mut self, predicates: Arc<dyn ArrowPredicates>) -> Self {
        self.row_filter
            .get_or_insert_with(RowFilterHook::default)
            .arrow = Some(predicates);
        self
    }

    /// Merge column-chunk reads separated by at most this many bytes into one request, and
    /// never split one. Default: 0 for local files (only selected bytes are read); on object
    /// stores, requests planned against the link's measured round trip and bandwidth (a gap
    /// is fetched only while the bytes it wastes stay within 1/8 of the bytes selected (or
    /// 256 KiB, when little is selected) and
    /// cost less time than a request; long column chunks are fetched as parts at once: see
    /// [`plan_requests`](crate::plan_requests)).
    pub fn with_coalesce_gap(mut self, bytes: u64) -> Self {
        self.coalesce_gap = Some(bytes);
        self
    }

    /// Use the page index (when files have one) to skip pages inside row groups. Default on.
    pub fn with_page_index(mut self, enabled: bool) -> Self {
        self.use_page_index = enabled;
        self
    }

    /// The dataset is to be read by
    /// [`scan_row_ranges`](crate::ParquetDataset::scan_row_ranges): read each footer's page
    /// index too (when files have one), so that a range of a row group fetches and decodes
    /// only the pages holding its rows.
    pub fn for_row_ranges(mut self) -> Self {
        self.for_row_ranges = true;
        self
    }

    /// Decode flat (top-level, required or nullable) integer, date, timestamp, float,
    /// decimal, string and binary columns with forebay's own decoders when a row group is read whole
    /// (default: on). Off, the parquet crate decodes
    /// every column; the output is the same (kept for comparison and as an escape hatch).
    pub fn with_flat_decoder(mut self, enabled: bool) -> Self {
        self.flat_decoder = enabled;
        self
    }

    /// Which files of a listed directory (or prefix) are read: those whose name ends with
    /// one of `extensions` (case-insensitive; `"parquet"` and `".parquet"` alike), or every
    /// file with `None`. Default [`DEFAULT_FILE_EXTENSIONS`](crate::DEFAULT_FILE_EXTENSIONS), so that a stray `README` or
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
    /// [`DEFAULT_MAX_COLUMN_CHUNK_BYTES`](super::DEFAULT_MAX_COLUMN_CHUNK_BYTES)): a larger one fails the scan with
    /// [`ParquetError::TooLarge`] before any of it is fetched. Arrow arrays index their
    /// values with 32-bit offsets, so a chunk past 2 GiB could not be decoded anyway; without
    /// the check a tiny file of highly compressible strings allocates gigabytes first.
    pub fn with_max_column_chunk_bytes(mut self, bytes: u64) -> Self {
        self.max_column_chunk_bytes = bytes.max(1);
        self
    }

    /// Read every file as `schema` (its columns by name, in its order): a column a file
    /// lacks is read as nulls (the field must be nullable), and one whose type differs is
    /// widened by the rule in the `evolve` module docs (`int32` → `int64`, `float32` →
    /// `float64`, `utf8` → `large_utf8`, ...); anything else fails the scan with
    /// [`ParquetError::SchemaMismatch`] naming the file and the column. Columns a file has
    /// beyond `schema` are not read. `with_columns` then picks among `schema`'s columns
    /// (top-level names only); a filter's columns must be in every file.
    pub fn with_schema(mut self, schema: SchemaRef) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Read the files as the union of their schemas: every column any file has, by name, in
    /// order of first appearance, of the widest type its files hold (the widening rule of
    /// [`with_schema`](Self::with_schema)); where a file lacks a column, nulls. Every
    /// footer is read when the dataset is built (in parallel; the scans reuse them). Files
    /// whose types for one column do not widen to one another are an error naming both.
    pub fn with_union_schema(mut self) -> Self {
        self.union_schema = true;
        self
    }

    /// Read hive-style partition columns: a listed file under `key=value` directories
    /// (`table/year=2024/part-0.parquet`) has a column `key` holding `value` in every row,
    /// after its own columns unless [`with_columns`](Self::with_columns) orders them; int64
    /// when every value is an integer, else strings; `__HIVE_DEFAULT_PARTITION__` is null.
    /// A filter's terms on them are decided per file before its footer is read (files
    /// ruled out are not read). See the `partitions` module for the rules and the errors.
    pub fn with_hive_partitioning(mut self) -> Self {
        self.hive_partitioning = true;
        self
    }

    /// With [`with_hive_partitioning`](Self::with_hive_partitioning): the types of partition
    /// keys (by name; keys it does not name are inferred), their values parsed from the
    /// path (a value that does not parse is an error naming the file and the key). A field
    /// that is not nullable makes `__HIVE_DEFAULT_PARTITION__` an error. Naming a key no
    /// directory gives is an error. A host that reads a dataset in pieces passes the
    /// whole dataset's schema, so that every piece types its keys alike.
    pub fn with_hive_schema(mut self, schema: SchemaRef) -> Self {
        self.hive_schema = Some(schema);
        self
    }

    /// With [`with_hive_partitioning`](Self::with_hive_partitioning): files named on their
    /// own (not found by listing a directory or glob) under one of these directories take
    /// their partition values from the directories between (pyarrow's
    /// `partition_base_dir`); the longest base holding a file counts.
    pub fn with_partition_base<I, S>(mut self, bases: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.partition_base = bases.into_iter().map(Into::into).collect();
        self
    }

    /// Whether files may differ from the dataset's schema (`with_schema`, `with_union_schema`).
    pub(super) fn evolves(&self) -> bool {
        self.schema.is_some() || self.union_schema
    }

    /// Yield at most `rows` rows from each scan (after the filters), in scan order: the
    /// scan stops reading once it has them, and without a filter it does not start row
    /// groups past the limit (their row counts are in the footers). `count_rows` counts at
    /// most `rows`.
    pub fn with_limit(mut self, rows: u64) -> Self {
        self.limit = Some(rows);
        self
    }

    /// Run the scans' I/O and decoding on `runtime` (a host engine's), instead of the
    /// process's forebay runtime (forebay-io's [`handle`](forebay_io::handle): the host's
    /// given to [`use_host_runtime`](forebay_io::use_host_runtime), or forebay's own pool).
    /// Blocking calls ([`build`](Self::build), [`ParquetDataset::count_rows`], iterating a
    /// [`ScanStream::blocking_iter`](crate::ScanStream::blocking_iter)) then wait for it.
    pub fn with_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Charge what each scan holds to a host's memory pool: before a row group's data is
    /// requested, the scan asks the pool for its estimated size (column chunks fetched and
    /// the batches decoded from them, from the footer); it gives it back once those batches
    /// are handed to the consumer. When the pool refuses, the scan waits for row groups in
    /// flight to finish; when nothing is in flight, the scan ends with
    /// [`ParquetError::MemoryRefused`] naming the file and row group.
    pub fn with_memory_pool(mut self, pool: Arc<dyn MemoryPool>) -> Self {
        self.memory_pool = Some(pool);
        self
    }

    /// The runtime the dataset's tasks run on.
    pub(super) fn runtime_handle(&self) -> tokio::runtime::Handle {
        self.runtime.clone().unwrap_or_else(forebay_io::handle)
    }

    /// Resolve the files and read the first file's footer (for the schema).
    pub fn build(self) -> Result<ParquetDataset> {
        block_on_in(&self.runtime_handle(), self.build_async())
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
        if let Some(columns) = &self.columns {
            let mut seen = std::collections::HashSet::new();
            if let Some(twice) = columns.iter().find(|c| !seen.insert(c.as_str())) {
                return Err(ParquetError::InvalidArgument(format!(
                    "columns names '{twice}' twice; a column is read once (name each at most once)"
                )));
            }
        }
        if self.prefetch == Some(0) || self.num_threads == Some(0) {
            return Err(ParquetError::InvalidArgument(
                "prefetch and num_threads must be at least 1".into(),
            ));
        }
        let io = Arc::new(IoMetrics::default());
        let mut files = resolve(&self.source, self.file_extensions.as_deref(), &io).await?;
        let partitions = if self.hive_partitioning {
            if !self.partition_base.is_empty() {
                place_under_bases(&mut files, &self.source, &self.partition_base)?;
            }
            Partitions::discover(
                &files,
                self.hive_schema.as_ref(),
                self.filter.as_ref(),
                self.columns.as_deref(),
            )?
            .map(Arc::new)
        } else {
            None
        };
        let file_columns = match &partitions {
            Some(partitions) => partitions.file_columns(),
            None => self.columns.clone(),
        };
        let threads = self
            .num_threads
            .unwrap_or_else(default_threads)
            .min(default_threads())
            .max(1);
        let inner = Arc::new(DatasetInner {
            io,
            scan_metrics: Arc::default(),
            threads,
            prefetch: self.prefetch.unwrap_or(threads + 2),
            fetch_ahead: AtomicUsize::new(
                self.fetch_ahead
                    .unwrap_or(*super::fetch_ahead::REMOTE_FETCH_AHEAD_UNITS.start()),
            ),
            coalesce_gap: self.coalesce_gap,
            opened: Mutex::new(HashMap::new()),
            tails_ahead: Mutex::new(HashMap::new()),
            schema: OnceLock::new(),
            page_buffers: Arc::default(),
            filter_selectivity: Default::default(),
            schema_file: (0..files.len())
                .find(|&i| {
                    partitions
                        .as_ref()
                        .is_none_or(|p| !matches!(p.filter_of(i), FileFilter::Excluded))
                })
                .unwrap_or(0),
            partitions,
            file_columns,
            files,
            options: self,
        });
        let files_schema = if inner.options.evolves() {
            super::evolve::dataset_schema(&inner).await?
        } else {
            inner.request_footers_ahead(inner.schema_file);
            let first = inner.open(inner.schema_file).await?;
            let _ = inner.schema.set(first.output_schema.clone());
            first.output_schema.clone()
        };
        if let Some(partitions) = &inner.partitions {
            partitions.finish(&files_schema)?;
        }
        if inner.options.fetch_ahead.is_none() {
            if let Some(first) = inner
                .opened
                .lock()
                .expect("cache lock")
                .get(&inner.schema_file)
            {
                let units = super::fetch_ahead::default_fetch_ahead(first);
                inner.fetch_ahead.store(units, Ordering::Relaxed);
            }
        }
        Ok(ParquetDataset { inner })
    }
}
