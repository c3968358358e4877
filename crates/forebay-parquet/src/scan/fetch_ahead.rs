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
//! How far ahead is measured, not fixed ([`FetchDepth`]): the scan starts
//! [`INITIAL_FETCH_AHEAD`] units ahead and doubles that (up to `fetch_ahead`, the most the
//! caller's memory allows) whenever a unit's turn to decode comes before its data arrived,
//! i.e. whenever the link, not the cores, made decoding wait. After
//! [`SHRINK_AFTER_IN_TIME`] units in a row whose data was waiting for them, it holds one
//! unit less. So a slow link gets enough requests in flight for its round trip and
//! bandwidth, and a fast one (or slow decoding) no more bytes waiting than decoding needs.
//!
//! Only where every byte fetched is read: remote files, units without a page selection
//! (a decoder given one reads only the pages it selects), scans without a row filter (one
//! may drop a row group after its dictionary, and its data would have been fetched for
//! nothing). A filter's own columns are fetched with the returned ones; a filtered unit
//! not fetched ahead is fetched whole before its decoding ([`fetch_filtered_unit`]).
//!
//! The bytes waiting are counted in the scan's window
//! ([`ParquetDataset::scan_window_bytes`](super::ParquetDataset::scan_window_bytes)), which
//! a caller with a memory cap reserves, and can shrink by scanning with
//! [`ParquetDataset::scan_fetching_ahead`](super::ParquetDataset::scan_fetching_ahead).

use std::ops::Range;
use std::sync::Arc;

use super::{DatasetInner, OpenedFile, Unit};
use crate::error::Result;
use crate::io::{plan_requests, FetchedRanges, ObjectFileReader};

/// The most units fetched ahead of decoding on object stores by default (how many are is
/// measured: [`FetchDepth`]). At ~1-4 MB a row group that is up to ~32-128 MB waiting,
/// which a memory cap narrows (`ParquetDataset::scan_fetching_ahead`).
pub(super) const REMOTE_FETCH_AHEAD: usize = 32;

/// Units fetched ahead when a scan starts.
pub const INITIAL_FETCH_AHEAD: usize = 8;

/// Units in a row whose data was there before their decoding started, after which the scan
/// fetches one unit less ahead.
pub const SHRINK_AFTER_IN_TIME: usize = 16;

/// How many units a scan fetches ahead of decoding now, from whether units' data arrived
/// before their turn to decode (see the module's text).
#[derive(Debug, Clone)]
pub(super) struct FetchDepth {
    most: usize,
    now: usize,
    in_time_in_a_row: usize,
}

impl FetchDepth {
    /// At most `most` units ahead (0: none).
    pub(super) fn new(most: usize) -> Self {
        FetchDepth {
            most,
            now: most.min(INITIAL_FETCH_AHEAD),
            in_time_in_a_row: 0,
        }
    }

    /// Units to fetch ahead now.
    pub(super) fn now(&self) -> usize {
        self.now
    }

    /// A unit fetched ahead starts decoding; `arrived` says whether its data was there.
    pub(super) fn unit_started(&mut self, arrived: bool) {
        if arrived {
            self.in_time_in_a_row += 1;
            if self.in_time_in_a_row >= SHRINK_AFTER_IN_TIME {
                self.in_time_in_a_row = 0;
                self.now = self.now.saturating_sub(1).max(1).min(self.most);
            }
        } else {
            self.in_time_in_a_row = 0;
            self.now = (self.now * 2).max(1).min(self.most);
        }
    }
}

impl DatasetInner {
    /// Units of `file` a scan fetching `units` ahead fetches ahead of their decoding (0:
    /// none).
    pub(super) fn fetch_ahead_for(&self, file: &OpenedFile, units: usize) -> usize {
        if self.options.row_filter.is_none() && file.entry.local_path.is_none() {
            units
        } else {
            0
        }
    }
}

/// Request the selected column chunks of `unit` (planned as its decoder would), now. (The
/// driver asks first whether its decoding would refuse it as too large: nothing of such a
/// unit is ever fetched.)
pub(super) fn fetch_unit(
    inner: &Arc<DatasetInner>,
    file: &Arc<OpenedFile>,
    unit: &Unit,
) -> tokio::task::JoinHandle<Result<FetchedRanges>> {
    let (inner, file, row_group) = (inner.clone(), file.clone(), unit.row_group);
    tokio::spawn(async move {
        fetch_chunks(&inner, &file, row_group, |leaf| reads(&file, leaf), None).await
    })
}

/// Whether decoding a unit of `file` without a page selection reads `leaf`: a column it
/// returns or one its filter evaluates.
fn reads(file: &OpenedFile, leaf: usize) -> bool {
    file.projection.leaf_included(leaf)
        || file
            .filter
            .as_ref()
            .is_some_and(|(mask, _)| mask.leaf_included(leaf))
}

/// The column chunks a filtered unit's decoder will read, fetched at once, before its
/// decoding takes a core: on an object store, a file read without a page selection.
///
/// The parquet crate's filtered decoder fetches inside its decoding (the filter's columns,
/// then the others), and a unit decoding holds one of the scan's `threads` cores: so only
/// `threads` units waited on round trips at once, two after another each (a filtered scan
/// of lineitem at 80 ms took 5.7 s where polars took 0.9). Fetched here, its reads are
/// served from memory. Without a page selection the decoder reads whole chunks anyway;
/// with one (pages pruned), it reads only the pages it needs and is left to do so.
///
/// `have`: a range fetched already at the start of a chunk (the dictionary page a row
/// filter decided by): only the rest of that chunk is fetched.
pub(super) async fn fetch_filtered_unit(
    inner: &DatasetInner,
    file: &OpenedFile,
    unit: &Unit,
    have: Option<&Range<u64>>,
) -> Result<FetchedRanges> {
    if file.entry.local_path.is_some() || unit.selection.is_some() {
        return Ok(Vec::new());
    }
    fetch_chunks(inner, file, unit.row_group, |leaf| reads(file, leaf), have).await
}

/// Fetch the chunks of `row_group` whose leaves `wanted` includes, as planned requests at
/// once (of a chunk starting with `have`, the rest).
async fn fetch_chunks(
    inner: &DatasetInner,
    file: &OpenedFile,
    row_group: usize,
    wanted: impl Fn(usize) -> bool,
    have: Option<&Range<u64>>,
) -> Result<FetchedRanges> {
    let metadata = file.reader_meta.metadata().row_group(row_group);
    let ranges: Vec<Range<u64>> = metadata
        .columns()
        .iter()
        .enumerate()
        .filter(|(leaf, _)| wanted(*leaf))
        .map(|(_, column)| {
            let (start, len) = column.byte_range();
            match have {
                Some(have) if have.start == start && have.end < start + len => {
                    have.end..start + len
                }
                _ => start..start + len,
            }
        })
        .collect();
    let policy = inner.range_policy_for(&file.entry);
    let requests = plan_requests(&ranges, policy, &inner.io.link);
    let reader = ObjectFileReader::new(file.entry.clone(), inner.io.clone(), policy);
    let fetched =
        futures::future::try_join_all(requests.iter().map(|r| reader.fetch(r.clone()))).await?;
    Ok(requests.into_iter().zip(fetched).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_depth_doubles_when_decoding_waits_and_shrinks_when_data_waits() {
        let mut depth = FetchDepth::new(32);
        assert_eq!(depth.now(), INITIAL_FETCH_AHEAD);
        depth.unit_started(false);
        assert_eq!(depth.now(), 16);
        depth.unit_started(false);
        depth.unit_started(false);
        assert_eq!(depth.now(), 32, "never past the most the caller allows");
        for _ in 0..SHRINK_AFTER_IN_TIME - 1 {
            depth.unit_started(true);
        }
        assert_eq!(depth.now(), 32);
        depth.unit_started(true);
        assert_eq!(depth.now(), 31);
        // A late unit resets the count of units in time.
        for _ in 0..SHRINK_AFTER_IN_TIME - 1 {
            depth.unit_started(true);
        }
        depth.unit_started(false);
        assert_eq!(depth.now(), 32);
        for _ in 0..SHRINK_AFTER_IN_TIME * 40 {
            depth.unit_started(true);
        }
        assert_eq!(depth.now(), 1, "at least one unit ahead");
        // A caller allowing none gets none; fewer than the initial, that few.
        let mut none = FetchDepth::new(0);
        none.unit_started(false);
        assert_eq!(none.now(), 0);
        assert_eq!(FetchDepth::new(3).now(), 3);
    }
}
