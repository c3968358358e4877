//! Fetching the column chunks of row groups ahead of their decoding, on object stores.
//!
//! Decoding is bounded by the cores: `prefetch` units (threads + 2) decode at once. On an
//! object store each request waits a round trip before its first byte, so those few units
//! alone leave the link idle between waves (4 requests, then 80 ms of nothing). The scan
//! therefore requests the data of up to `fetch_ahead` more units while they wait their turn
//! to decode, and serves their reads from those bytes:
//!
//! ```text
//!  units in order:  [ decoding: prefetch ][ fetched ahead: fetch_ahead ][ planned ... ]
//!                     reads served from      requests in flight or         nothing yet
//!                     bytes fetched ahead    bytes waiting
//! ```
//!
//! Only where every byte fetched is read: remote files, scans without a filter or a row
//! filter (either may drop a row group after its footer or dictionary, and its data would
//! have been fetched for nothing). The bytes waiting are counted in the scan's window
//! ([`ParquetDataset::scan_window_bytes`](super::ParquetDataset::scan_window_bytes)), which
//! a caller with a memory cap reserves, and can shrink by scanning with
//! [`ParquetDataset::scan_fetching_ahead`](super::ParquetDataset::scan_fetching_ahead).

use std::ops::Range;
use std::sync::Arc;

use super::decode::check_chunk_sizes;
use super::{DatasetInner, OpenedFile, Unit};
use crate::error::Result;
use crate::io::{coalesce_ranges, FetchedRanges, ObjectFileReader};

/// Units fetched ahead of decoding on object stores by default: with `prefetch` (4 on 2
/// cores) ~16 requests in flight, what polars keeps (BENCHMARKS.md, session 31: 21-23).
pub(super) const REMOTE_FETCH_AHEAD: usize = 12;

impl DatasetInner {
    /// Units of `file` a scan fetching `units` ahead fetches ahead of their decoding (0:
    /// none).
    pub(super) fn fetch_ahead_for(&self, file: &OpenedFile, units: usize) -> usize {
        let plain_scan = self.options.filter.is_none() && self.options.row_filter.is_none();
        if plain_scan && file.entry.local_path.is_none() {
            units
        } else {
            0
        }
    }
}

/// Request the selected column chunks of `unit` (coalesced as its decoder would), now; not
/// those of a unit its decoding will refuse as too large (nothing of it is ever fetched).
pub(super) fn fetch_unit(
    inner: &Arc<DatasetInner>,
    file: &Arc<OpenedFile>,
    unit: &Unit,
) -> Option<tokio::task::JoinHandle<Result<FetchedRanges>>> {
    check_chunk_sizes(inner, file, &unit.file, unit.row_group).ok()?;
    let metadata = file.reader_meta.metadata().row_group(unit.row_group);
    let ranges: Vec<Range<u64>> = metadata
        .columns()
        .iter()
        .enumerate()
        .filter(|(leaf, _)| file.projection.leaf_included(*leaf))
        .map(|(_, column)| {
            let (start, len) = column.byte_range();
            start..start + len
        })
        .collect();
    let merged = coalesce_ranges(&ranges, inner.coalesce_gap_for(&file.entry));
    let reader = ObjectFileReader::new(file.entry.clone(), inner.io.clone(), 0);
    Some(tokio::spawn(async move {
        let fetched =
            futures::future::try_join_all(merged.iter().map(|r| reader.fetch(r.clone()))).await?;
        Ok(merged.into_iter().zip(fetched).collect())
    }))
}
