//! Byte-range I/O against object_store, instrumented.
//!
//! Every read forebay makes of a Parquet file goes through `ObjectFileReader`, which
//! implements the parquet crate's [`AsyncFileReader`]. It does three things the stock
//! `ParquetObjectReader` does not:
//!
//! * it counts requests and bytes into [`IoMetrics`] (footer reads separately), so tests and
//!   users can see that each footer is read once and that column chunks are coalesced;
//! * it turns the column-chunk ranges the decoder asks for into requests by a
//!   [`RangePolicy`]: on object stores a gap is fetched only where its bytes cost less than a
//!   request at the link's measured round trip and bandwidth, and a long chunk is fetched as
//!   parts at once (`request_plan`); a local file gets only the bytes asked for;
//! * it hands out metadata from the dataset's cache instead of re-reading the footer.
//!
//! Column chunks of local files bypass object_store (see `local.rs`); everything else, and
//! every footer, is an object_store request.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use futures::future::{BoxFuture, FutureExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, Length};

use crate::error::ParquetError;

mod request_plan;

pub use request_plan::{
    coalesce_ranges, plan_requests, split_for_parallel, LinkEstimate, RangePolicy,
    ALWAYS_MERGE_GAP, MIN_PART_BYTES, SMALL_READ_WASTE, WASTED_BYTES_SHARE,
};

/// Counters of the requests a dataset made, and what their responses measured of the link.
/// Shared by every file of a dataset.
#[derive(Debug, Default)]
pub struct IoMetrics {
    /// The round trip and bandwidth measured from every GET (`request_plan`).
    pub(crate) link: LinkEstimate,
    requests: AtomicU64,
    bytes: AtomicU64,
    footer_requests: AtomicU64,
    footer_bytes: AtomicU64,
    list_requests: AtomicU64,
    head_requests: AtomicU64,
}

/// A point-in-time copy of [`IoMetrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoMetricsSnapshot {
    /// Ranged GET requests for data pages (after coalescing).
    pub data_requests: u64,
    /// Bytes those data requests returned.
    pub data_bytes: u64,
    /// GET requests made while reading footers and page indexes.
    pub footer_requests: u64,
    /// Bytes read while reading footers and page indexes.
    pub footer_bytes: u64,
    /// LIST requests (directories and globs).
    pub list_requests: u64,
    /// HEAD requests (explicitly named files, to learn their size).
    pub head_requests: u64,
}

impl IoMetrics {
    pub fn snapshot(&self) -> IoMetricsSnapshot {
        IoMetricsSnapshot {
            data_requests: self.requests.load(Ordering::Relaxed),
            data_bytes: self.bytes.load(Ordering::Relaxed),
            footer_requests: self.footer_requests.load(Ordering::Relaxed),
            footer_bytes: self.footer_bytes.load(Ordering::Relaxed),
            list_requests: self.list_requests.load(Ordering::Relaxed),
            head_requests: self.head_requests.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn record_list(&self) {
        self.list_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_head(&self) {
        self.head_requests.fetch_add(1, Ordering::Relaxed);
    }

    fn record_get(&self, purpose: ReadPurpose, bytes: u64) {
        let (requests, total) = match purpose {
            ReadPurpose::Footer => (&self.footer_requests, &self.footer_bytes),
            ReadPurpose::Data => (&self.requests, &self.bytes),
        };
        requests.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// One Parquet file of a dataset: where it lives and how big it is.
#[derive(Debug, Clone)]
pub struct FileEntry {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) location: Path,
    /// What to call the file in messages and provenance: the URI or local path.
    pub(crate) uri: Arc<str>,
    pub(crate) size: u64,
    /// Last modification, milliseconds since the Unix epoch (from listing or HEAD).
    pub(crate) last_modified_ms: i64,
    /// The store's entity tag (S3's ETag; for local files object_store derives one from the
    /// inode, modification time and size), when it has one.
    pub(crate) e_tag: Option<Arc<str>>,
    /// The file's path when it lives on the local file system: column chunks are then read
    /// directly (see `local.rs`), footers still through `store`.
    pub(crate) local_path: Option<Arc<std::path::Path>>,
    /// The directories between the directory (or a glob's literal prefix) the file was listed
    /// under and the file (`year=2024/month=1`; empty directly under it), read for hive-style
    /// partition columns. `None` for a file named on its own.
    pub(crate) listed_under: Option<Arc<str>>,
}

impl FileEntry {
    /// The file's URI (or absolute local path) as shown in errors and provenance.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The file's size in bytes, from listing or HEAD.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Last modification time, milliseconds since the Unix epoch.
    pub fn last_modified_ms(&self) -> i64 {
        self.last_modified_ms
    }

    /// The store's entity tag, when it has one (changes whenever the object is rewritten).
    pub fn e_tag(&self) -> Option<&str> {
        self.e_tag.as_deref()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadPurpose {
    Footer,
    Data,
}

/// Byte ranges of a file already fetched, each with its bytes.
pub(crate) type FetchedRanges = Vec<(Range<u64>, Bytes)>;

/// [`AsyncFileReader`] over one [`FileEntry`], counting into [`IoMetrics`].
#[derive(Clone)]
pub(crate) struct ObjectFileReader {
    file: FileEntry,
    metrics: Arc<IoMetrics>,
    /// How the ranges a decoder asks for become requests.
    ranges: RangePolicy,
    purpose: ReadPurpose,
    /// Metadata from the dataset cache; `get_metadata` never reads the footer again.
    metadata: Option<Arc<ParquetMetaData>>,
    /// Bytes already fetched for this reader's decoder (a dictionary page the scan read
    /// first): a requested range starting where they start is served from them, and only
    /// its remainder is fetched.
    prefetched: Option<(Range<u64>, Bytes)>,
    /// Ranges of the file fetched already (the whole of a small file on an object store,
    /// fetched with its footer; column chunks fetched ahead of decoding): a read inside one
    /// of them is served from its bytes.
    fetched: FetchedRanges,
}

impl ObjectFileReader {
    pub(crate) fn new(file: FileEntry, metrics: Arc<IoMetrics>, ranges: RangePolicy) -> Self {
        Self {
            file,
            metrics,
            ranges,
            purpose: ReadPurpose::Data,
            metadata: None,
            prefetched: None,
            fetched: Vec::new(),
        }
    }

    pub(crate) fn for_footer(file: FileEntry, metrics: Arc<IoMetrics>) -> Self {
        Self {
            file,
            metrics,
            ranges: RangePolicy::MergeGapsUpTo(0),
            purpose: ReadPurpose::Footer,
            metadata: None,
            prefetched: None,
            fetched: Vec::new(),
        }
    }

    pub(crate) fn with_metadata(mut self, metadata: Arc<ParquetMetaData>) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// Serve reads inside `fetched` (ranges of this file with their bytes) from them, too.
    pub(crate) fn with_fetched(mut self, fetched: FetchedRanges) -> Self {
        self.fetched.extend(
            fetched
                .into_iter()
                .filter(|(range, bytes)| range.end - range.start == bytes.len() as u64),
        );
        self
    }

    /// Serve `bytes` (the file's `range`, already fetched) to the decoder instead of
    /// fetching them again.
    pub(crate) fn with_prefetched(mut self, range: Range<u64>, bytes: Bytes) -> Self {
        self.prefetched = Some((range, bytes));
        self
    }

    /// A requested range split into the prefix already fetched (if any) and the rest, still
    /// to fetch.
    fn split_prefetched(&self, range: &Range<u64>) -> (Option<Bytes>, Range<u64>) {
        match &self.prefetched {
            Some((have, bytes)) if range.start == have.start => {
                let served = range.end.min(have.end);
                let prefix = bytes.slice(..(served - have.start) as usize);
                (Some(prefix), served..range.end)
            }
            _ => (None, range.clone()),
        }
    }

    pub(crate) async fn fetch(&self, range: Range<u64>) -> Result<Bytes, ParquetError> {
        if range.end > self.file.size {
            return Err(ParquetError::Corrupt {
                path: self.file.uri.to_string(),
                row_group: None,
                reason: format!(
                    "metadata points at bytes {}..{} but the file has only {} bytes (truncated?)",
                    range.start, range.end, self.file.size
                ),
                source: None,
            });
        }
        if let Some(bytes) = self.already_fetched(&range) {
            return Ok(bytes);
        }
        if let (Some(path), ReadPurpose::Data) = (&self.file.local_path, self.purpose) {
            let len = range.end - range.start;
            let bytes = crate::local::read_range(path.clone(), range)
                .await
                .map_err(|e| ParquetError::from_local_io(self.file.uri.to_string(), e))?;
            self.metrics.record_get(self.purpose, len);
            return Ok(bytes);
        }
        let parts = split_for_parallel(&range, self.ranges, &self.metrics.link);
        if parts.len() == 1 {
            return self.get_from_store(range).await;
        }
        let fetched =
            futures::future::try_join_all(parts.into_iter().map(|p| self.get_from_store(p)))
                .await?;
        let mut whole = bytes::BytesMut::with_capacity((range.end - range.start) as usize);
        for part in fetched {
            whole.extend_from_slice(&part);
        }
        Ok(whole.freeze())
    }

    /// The bytes of `range` when it lies inside a range fetched already.
    fn already_fetched(&self, range: &Range<u64>) -> Option<Bytes> {
        let (have, bytes) = self
            .fetched
            .iter()
            .find(|(have, _)| have.start <= range.start && range.end <= have.end)?;
        let from = (range.start - have.start) as usize;
        Some(bytes.slice(from..from + (range.end - range.start) as usize))
    }

    /// One GET of `range`, counted and timed (the time measures the link).
    async fn get_from_store(&self, range: Range<u64>) -> Result<Bytes, ParquetError> {
        let len = range.end - range.start;
        let started = std::time::Instant::now();
        let bytes = self
            .file
            .store
            .get_range(&self.file.location, range)
            .await
            .map_err(|e| ParquetError::from_store(self.file.uri.to_string(), e))?;
        self.metrics.link.record(len, started.elapsed());
        self.metrics.record_get(self.purpose, len);
        Ok(bytes)
    }
}

fn to_parquet_err(err: ParquetError) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(err))
}

impl AsyncFileReader for ObjectFileReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move { self.fetch(range).await.map_err(to_parquet_err) }.boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            // Each range: a prefix served from the prefetched dictionary page, the rest from
            // ranges fetched ahead, else from the requests planned for what is left.
            let (served, rests): (Vec<Option<Bytes>>, Vec<Range<u64>>) =
                ranges.iter().map(|r| self.split_prefetched(r)).unzip();
            let rests_fetched: Vec<Option<Bytes>> =
                rests.iter().map(|r| self.already_fetched(r)).collect();
            let to_fetch: Vec<Range<u64>> = rests
                .iter()
                .zip(&rests_fetched)
                .filter(|(_, have)| have.is_none())
                .map(|(r, _)| r.clone())
                .collect();
            let requests = plan_requests(&to_fetch, self.ranges, &self.metrics.link);
            let fetched =
                futures::future::try_join_all(requests.iter().map(|r| self.fetch(r.clone())))
                    .await
                    .map_err(to_parquet_err)?;
            // Slice a range out of the request that covers it.
            let slice_fetched = |r: &Range<u64>| {
                if r.start == r.end {
                    return Bytes::new();
                }
                let idx = requests.partition_point(|m| m.start <= r.start) - 1;
                let m = &requests[idx];
                let start = (r.start - m.start) as usize;
                let end = (r.end - m.start) as usize;
                fetched[idx].slice(start..end)
            };
            Ok(served
                .into_iter()
                .zip(rests.iter().zip(rests_fetched))
                .map(|(prefix, (rest, have))| {
                    let rest = have.unwrap_or_else(|| slice_fetched(rest));
                    match prefix {
                        None => rest,
                        Some(prefix) if rest.is_empty() => prefix,
                        Some(prefix) => [prefix, rest].concat().into(),
                    }
                })
                .collect())
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            self.metadata.clone().ok_or_else(|| {
                parquet::errors::ParquetError::General(format!(
                    "{}: metadata requested before it was loaded (forebay bug)",
                    self.file.uri
                ))
            })
        }
        .boxed()
    }
}

/// The bytes fetched for one range of a file, served to the parquet crate's page reader at
/// their file offsets. A read outside the range is an error (the page claims more bytes
/// than the footer gave it).
pub(crate) struct FetchedRegion {
    start: u64,
    bytes: Bytes,
}

impl FetchedRegion {
    pub(crate) fn new(start: u64, bytes: Bytes) -> Self {
        Self { start, bytes }
    }

    fn slice(&self, start: u64, len: Option<usize>) -> parquet::errors::Result<Bytes> {
        let from = start
            .checked_sub(self.start)
            .map(|from| from as usize)
            .filter(|from| *from <= self.bytes.len());
        let to =
            from.and_then(|from| len.map_or(Some(self.bytes.len()), |len| from.checked_add(len)));
        match (from, to) {
            (Some(from), Some(to)) if to <= self.bytes.len() => Ok(self.bytes.slice(from..to)),
            _ => Err(parquet::errors::ParquetError::EOF(format!(
                "page bytes {start}.. lie outside the range fetched for them"
            ))),
        }
    }
}

impl Length for FetchedRegion {
    fn len(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

impl ChunkReader for FetchedRegion {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(self.slice(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, Some(length))
    }
}
