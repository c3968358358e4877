//! Reading footers: one request for most files, a lenient retry for odd ones, and the row
//! counts footers alone give. On an object store the first files' footers are requested
//! while the dataset's schema (the first footer) is read, not one round trip after it
//! ([`DatasetInner::request_footers_ahead`]).

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use parquet::basic::ConvertedType;
use parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataOptions, ParquetMetaDataReader,
    ParquetStatisticsPolicy,
};

use super::DatasetInner;
use crate::error::{ParquetError, Result};
use crate::io::{FileEntry, IoMetrics, ObjectFileReader};
use crate::repair;

/// Bytes fetched from the end of a file in the first footer request. Most footers (and often
/// the page index just before them) fit, so one request per file is the common case.
pub(super) const FOOTER_PREFETCH: usize = 64 * 1024;
/// Footers fetched concurrently ahead of the scan (more for small files fetched whole: see
/// [`DatasetInner::files_opened_ahead`]).
pub(super) const FOOTER_CONCURRENCY: usize = 16;

/// The most small files fetched whole at once. Measured (1,000 files of ~100 KB through the
/// latency proxy in front of `ranged_moto.py`, seconds at 30 / 80 ms): 16 at once 2.5 / 5.7,
/// 32: 2.2 / 3.2, 64: 2.1 / 2.3, 128: 2.1 / 2.3, 256: 2.8-3.1 / 2.9-4.0 (the server's
/// threads thrash). A store's own limit may be higher; a host's connections and file
/// descriptors are not free either.
pub(super) const MOST_FILES_OPENED_AHEAD: usize = 64;
/// Files on an object store up to this size are fetched whole by the scan's footer request,
/// and their data read from those bytes: one request a file instead of two. At 200 MB/s a
/// MiB takes ~5 ms, less than one round trip to any object store (20-100 ms), even when only
/// a few of the file's columns are wanted.
pub(super) const WHOLE_FILE_MAX: u64 = 1 << 20;

/// A file's footer, and the whole file when the request for the footer fetched all of it.
pub(super) struct Footer {
    pub(super) metadata: Arc<ParquetMetaData>,
    pub(super) whole_file: Option<bytes::Bytes>,
}

/// Rows of the row groups a scan reads (what a [`ScanSkip`] leaves), from the footers
/// (read concurrently and cached).
pub(super) async fn footer_rows(inner: Arc<DatasetInner>) -> Result<u64> {
    let skip = inner.options.skip.clone();
    let opened = inner.open_in_order(inner.files_not_skipped());
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

/// The bytes at the end of `entry` its footer request fetches: [`FOOTER_PREFETCH`], or the
/// whole file when `whole_if_small` and the file is small and remote ([`WHOLE_FILE_MAX`]).
fn tail_range(entry: &FileEntry, whole_if_small: bool) -> std::ops::Range<u64> {
    let whole = whole_if_small && entry.local_path.is_none() && entry.size <= WHOLE_FILE_MAX;
    let tail_len = if whole {
        entry.size
    } else {
        (FOOTER_PREFETCH as u64).min(entry.size)
    };
    entry.size - tail_len..entry.size
}

/// The tail of a file requested before anything asked for its footer (see
/// [`DatasetInner::request_footers_ahead`]).
pub(super) type TailAhead = tokio::task::JoinHandle<Result<bytes::Bytes>>;

impl DatasetInner {
    /// On an object store, request the tails of the files the scan opens first (after file
    /// `first`, which the caller is opening now), so their footers do not wait a round trip
    /// behind the first one: a dataset's schema comes from its first footer, and the scan
    /// opens the others only after that. The scan's own footer reads take these tails
    /// ([`read_footer`]'s `ahead`) instead of requesting them again. As many as the scan
    /// opens at once ([`FOOTER_CONCURRENCY`]); files the scan skips are not requested. A
    /// small file is requested whole, as the scan would ([`WHOLE_FILE_MAX`]; with a tail
    /// alone its data would cost another round trip): a dataset built only to list its
    /// files or learn its schema (as `forebay.ray`'s driver does) fetches up to 15 MiB for
    /// nothing, in parallel, once.
    pub(super) fn request_footers_ahead(self: &Arc<Self>, first: usize) {
        let whole_if_small = self.options.filter.is_none();
        let mut ahead = self.tails_ahead.lock().expect("tails lock");
        for index in self
            .files_not_skipped()
            .into_iter()
            .filter(|&i| i != first && self.files[i].local_path.is_none())
            .take(FOOTER_CONCURRENCY - 1)
        {
            let entry = self.files[index].clone();
            if entry.size < 12 {
                continue; // read_footer names it as not Parquet without a request
            }
            let reader = ObjectFileReader::for_footer(entry.clone(), self.io.clone());
            let range = tail_range(&entry, whole_if_small);
            ahead.insert(
                index,
                tokio::spawn(async move { reader.fetch(range).await }),
            );
        }
    }

    /// Files a scan fetching `units` ahead opens at once (their footers in flight or read,
    /// waiting for their turn): [`FOOTER_CONCURRENCY`], or, when the first file is fetched
    /// whole with its footer (small, remote, no filter), as many as `units` (at most
    /// [`MOST_FILES_OPENED_AHEAD`]): then a file's footer request is its data request, and
    /// the fetch-ahead allowance is spent on files (1,000 files of 100 KB at 80 ms: 16 at a
    /// time is ~63 round trips one after another).
    /// The scan's window counts their bytes (`ParquetDataset::scan_window_bytes`).
    pub(super) fn files_opened_ahead(&self, units: usize) -> usize {
        let first = self
            .opened
            .lock()
            .expect("cache lock")
            .get(&self.schema_file)
            .cloned();
        match first {
            Some(first) => self.files_opened_ahead_after(&first.entry, units),
            None => FOOTER_CONCURRENCY,
        }
    }

    /// [`files_opened_ahead`](Self::files_opened_ahead) of a dataset whose first file is
    /// `first`.
    pub(super) fn files_opened_ahead_after(&self, first: &FileEntry, units: usize) -> usize {
        if self.fetched_whole(first) {
            units.clamp(FOOTER_CONCURRENCY, MOST_FILES_OPENED_AHEAD)
        } else {
            FOOTER_CONCURRENCY
        }
    }

    /// Whether the scan fetches `entry` whole with its footer.
    pub(super) fn fetched_whole(&self, entry: &FileEntry) -> bool {
        entry.local_path.is_none() && entry.size <= WHOLE_FILE_MAX && self.options.filter.is_none()
    }

    /// The tail of file `index` requested ahead, if it was (taken: each is used once).
    pub(super) fn take_tail_ahead(&self, index: usize) -> Option<TailAhead> {
        self.tails_ahead.lock().expect("tails lock").remove(&index)
    }
}

/// Read `entry`'s footer: one request for its tail (the whole file when `whole_if_small` and
/// the file is small and remote, see [`WHOLE_FILE_MAX`]), more only when the footer does not
/// fit in it. `ahead`: that tail, requested earlier ([`DatasetInner::request_footers_ahead`]).
pub(super) async fn read_footer(
    entry: &FileEntry,
    io: &Arc<IoMetrics>,
    with_page_index: bool,
    whole_if_small: bool,
    ahead: Option<TailAhead>,
) -> Result<Footer> {
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
    let wanted = tail_range(entry, whole_if_small);
    let tail = match ahead {
        // Requested for the scan (a small file whole when unfiltered); read otherwise (no
        // whole file wanted, or a tail where one was), it serves as well.
        Some(task) => match task.await {
            Ok(fetched) => fetched?,
            Err(_cancelled) => reader.fetch(wanted.clone()).await?,
        },
        None => reader.fetch(wanted.clone()).await?,
    };
    let tail_start = entry.size - tail.len() as u64;
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
                    ParquetError::Corrupt {
                        path,
                        reason,
                        source,
                        ..
                    } => ParquetError::Corrupt {
                        path,
                        row_group: None,
                        reason: format!("cannot read the footer: {reason}"),
                        source,
                    },
                    other => other,
                })
            }
        },
    };
    let metadata = read_intervals_as_bytes(metadata, &fetch, entry.size, policy).await;
    let metadata = repair::repair_metadata(metadata).map_err(|reason| ParquetError::Corrupt {
        path: path.clone(),
        row_group: None,
        reason,
        source: None,
    })?;
    let metadata = repair::measure_short_chunks(metadata, &fetch.reader, entry.size, &path).await?;
    Ok(Footer {
        metadata: Arc::new(metadata),
        // The whole file, when it was wanted and the tail is all of it (a small remote file).
        whole_file: (whole_if_small && entry.local_path.is_none() && fetch.tail_start == 0)
            .then_some(fetch.tail),
    })
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

/// The footer decoded again without its INTERVAL annotations when it has any, so that those
/// columns read as `fixed_size_binary[12]` (months, days, milliseconds as stored), as pyarrow
/// reads them: arrow-rs reads an annotated column as `interval[day_time]` and drops the
/// months ([`repair::compact::drop_interval_annotations`]). Unchanged if it has none, or if
/// the rewrite cannot be read (then the column reads as arrow-rs reads it).
async fn read_intervals_as_bytes(
    metadata: ParquetMetaData,
    fetch: &FooterFetch,
    file_size: u64,
    policy: PageIndexPolicy,
) -> ParquetMetaData {
    let has_interval = metadata
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .any(|c| c.converted_type() == ConvertedType::INTERVAL);
    if !has_interval {
        return metadata;
    }
    let Some(footer) = footer_bytes(fetch, file_size).await else {
        return metadata;
    };
    let Some(rewritten) = repair::compact::drop_interval_annotations(&footer) else {
        return metadata;
    };
    let Ok(decoded) = ParquetMetaDataReader::decode_metadata(&rewritten.footer) else {
        return metadata;
    };
    let mut reader =
        ParquetMetaDataReader::new_with_metadata(decoded).with_page_index_policy(policy);
    match reader.load_page_index(fetch.clone()).await {
        Ok(()) => reader.finish().unwrap_or(metadata),
        Err(_) => metadata,
    }
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
