//! Byte-range I/O against object_store, instrumented.
//!
//! Every read forebay makes of a Parquet file goes through `ObjectFileReader`, which
//! implements the parquet crate's [`AsyncFileReader`]. It does three things the stock
//! `ParquetObjectReader` does not:
//!
//! * it counts requests and bytes into [`IoMetrics`] (footer reads separately), so tests and
//!   users can see that each footer is read once and that column chunks are coalesced;
//! * it coalesces the column-chunk ranges the decoder asks for with an explicit gap policy
//!   ([`coalesce_ranges`]): ranges closer than `coalesce_gap` bytes become one request, so with
//!   a gap of 0 only the selected column chunks' bytes are ever fetched;
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

/// Counters of the requests a dataset made. Shared by every file of a dataset.
#[derive(Debug, Default)]
pub struct IoMetrics {
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

/// Merge sorted-or-unsorted byte ranges into requests: two ranges whose gap is at most
/// `max_gap` bytes are fetched as one. Returns the merged ranges sorted by start.
pub fn coalesce_ranges(ranges: &[Range<u64>], max_gap: u64) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = ranges.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for range in sorted {
        match merged.last_mut() {
            Some(last) if range.start <= last.end.saturating_add(max_gap) => {
                last.end = last.end.max(range.end);
            }
            _ => merged.push(range),
        }
    }
    merged
}

/// Byte ranges of a file already fetched, each with its bytes.
pub(crate) type FetchedRanges = Vec<(Range<u64>, Bytes)>;

/// [`AsyncFileReader`] over one [`FileEntry`], counting into [`IoMetrics`].
#[derive(Clone)]
pub(crate) struct ObjectFileReader {
    file: FileEntry,
    metrics: Arc<IoMetrics>,
    coalesce_gap: u64,
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
    pub(crate) fn new(file: FileEntry, metrics: Arc<IoMetrics>, coalesce_gap: u64) -> Self {
        Self {
            file,
            metrics,
            coalesce_gap,
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
            coalesce_gap: 0,
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

    /// Serve reads inside `fetched` (ranges of this file with their bytes) from them.
    pub(crate) fn with_fetched(mut self, fetched: FetchedRanges) -> Self {
        self.fetched = fetched
            .into_iter()
            .filter(|(range, bytes)| range.end - range.start == bytes.len() as u64)
            .collect();
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
        let within = self
            .fetched
            .iter()
            .find(|(have, _)| have.start <= range.start && range.end <= have.end);
        if let Some((have, bytes)) = within {
            let from = (range.start - have.start) as usize;
            return Ok(bytes.slice(from..from + (range.end - range.start) as usize));
        }
        let len = range.end - range.start;
        let uri = || self.file.uri.to_string();
        let bytes = match &self.file.local_path {
            Some(path) if self.purpose == ReadPurpose::Data => {
                crate::local::read_range(path.clone(), range)
                    .await
                    .map_err(|e| ParquetError::from_local_io(uri(), e))?
            }
            _ => self
                .file
                .store
                .get_range(&self.file.location, range)
                .await
                .map_err(|e| ParquetError::from_store(uri(), e))?,
        };
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
            let (served, to_fetch): (Vec<Option<Bytes>>, Vec<Range<u64>>) =
                ranges.iter().map(|r| self.split_prefetched(r)).unzip();
            let merged = coalesce_ranges(&to_fetch, self.coalesce_gap);
            let fetched =
                futures::future::try_join_all(merged.iter().map(|r| self.fetch(r.clone())))
                    .await
                    .map_err(to_parquet_err)?;
            // Slice each requested range out of the merged request that covers it, after the
            // part of it that was already fetched.
            let slice_fetched = |r: &Range<u64>| {
                if r.start == r.end {
                    return Bytes::new();
                }
                let idx = merged.partition_point(|m| m.start <= r.start) - 1;
                let m = &merged[idx];
                let start = (r.start - m.start) as usize;
                let end = (r.end - m.start) as usize;
                fetched[idx].slice(start..end)
            };
            Ok(served
                .into_iter()
                .zip(&to_fetch)
                .map(|(prefix, rest)| match prefix {
                    None => slice_fetched(rest),
                    Some(prefix) if rest.start == rest.end => prefix,
                    Some(prefix) => [prefix, slice_fetched(rest)].concat().into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesce_merges_adjacent_and_close_ranges_only() {
        let ranges = vec![10..20, 0..10, 50..60, 25..30];
        assert_eq!(coalesce_ranges(&ranges, 0), vec![0..20, 25..30, 50..60]);
        assert_eq!(coalesce_ranges(&ranges, 5), vec![0..30, 50..60]);
        assert_eq!(coalesce_ranges(&ranges, 100), vec![0..60]);
        // overlapping and empty ranges
        assert_eq!(coalesce_ranges(&[0..10, 5..8, 3..3], 0), vec![0..10]);
        assert!(coalesce_ranges(&[], 0).is_empty());
    }
}
