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
//! How far ahead is measured, not fixed ([`FetchDepth`]): the scan starts as many units
//! ahead as its cores would decode in one round trip of the link (measured by the footer
//! requests; [`DECODED_BYTES_PER_SECOND_PER_THREAD`] assumed), at least
//! [`INITIAL_FETCH_AHEAD`], and doubles that (up to `fetch_ahead`, the most the
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

/// The most bytes of column chunks fetched ahead of decoding on object stores by default:
/// the most units fetched ahead is as many of the first file's row groups (their selected
/// chunks) as this holds, within [`REMOTE_FETCH_AHEAD_UNITS`] (how many are is measured:
/// [`FetchDepth`]). A memory cap narrows it (`ParquetDataset::scan_fetching_ahead`).
pub const REMOTE_FETCH_AHEAD_BYTES: u64 = 256 << 20;

/// The fewest and the most units fetched ahead by default, whatever their size: at least as
/// deep as a scan may start, and not so many requests at once that a store throttles them.
pub const REMOTE_FETCH_AHEAD_UNITS: std::ops::RangeInclusive<usize> = 32..=256;

/// The default most units fetched ahead for a dataset whose first file is `file` (see
/// [`REMOTE_FETCH_AHEAD_BYTES`]).
pub(super) fn default_fetch_ahead(file: &OpenedFile) -> usize {
    let sizes = super::SelectedSizes::of(file);
    let per_unit = (sizes.compressed / sizes.groups.max(1)).max(1);
    let units = (REMOTE_FETCH_AHEAD_BYTES / per_unit).min(usize::MAX as u64) as usize;
    units.clamp(
        *REMOTE_FETCH_AHEAD_UNITS.start(),
        *REMOTE_FETCH_AHEAD_UNITS.end(),
    )
}

/// The fewest units fetched ahead when a scan starts.
pub const INITIAL_FETCH_AHEAD: usize = 8;

/// Decoded bytes a core makes of a unit per second, assumed when a scan starts (before
/// anything is decoded) to size its first requests: what the decoders of flat columns do on
/// one core, about. The depth then follows what is measured.
pub const DECODED_BYTES_PER_SECOND_PER_THREAD: f64 = 1e9;

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

    /// Size the start for the link: enough units ahead to keep `threads` cores decoding for
    /// one `round_trip`, units of `decoded_bytes` each (at least the initial depth, at most
    /// the most allowed). Only before any unit started.
    pub(super) fn start_for_link(
        &mut self,
        round_trip: std::time::Duration,
        decoded_bytes: u64,
        threads: usize,
    ) {
        let per_unit = decoded_bytes.max(1) as f64
            / (DECODED_BYTES_PER_SECOND_PER_THREAD * threads.max(1) as f64);
        let units = (round_trip.as_secs_f64() / per_unit).ceil() as usize;
        self.now = units.max(INITIAL_FETCH_AHEAD).min(self.most);
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

/// The bytes decoding `row_group` of `file` makes (its read columns' uncompressed size).
pub(super) fn decoded_bytes(file: &OpenedFile, row_group: usize) -> u64 {
    let metadata = file.reader_meta.metadata().row_group(row_group);
    metadata
        .columns()
        .iter()
        .enumerate()
        .filter(|(leaf, _)| reads(file, *leaf))
        .map(|(_, column)| column.uncompressed_size().max(0) as u64)
        .sum()
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

    #[test]
    fn a_scan_starts_as_deep_as_its_cores_decode_in_a_round_trip() {
        let ms = std::time::Duration::from_millis;
        // 2 cores decode 2 MB units at ~1,000 a second: 80 ms is ~80 units, capped at 32.
        let mut far = FetchDepth::new(32);
        far.start_for_link(ms(80), 2_000_000, 2);
        assert_eq!(far.now(), 32);
        // 10 ms and 20 MB units: ~1 unit a round trip, so the initial 8.
        let mut near = FetchDepth::new(32);
        near.start_for_link(ms(10), 20_000_000, 2);
        assert_eq!(near.now(), INITIAL_FETCH_AHEAD);
        // In between: 30 ms, 4 MB units on 2 cores: 15.
        let mut between = FetchDepth::new(32);
        between.start_for_link(ms(30), 4_000_000, 2);
        assert_eq!(between.now(), 15);
        // Never past the most the caller allows (nor above none).
        let mut none = FetchDepth::new(0);
        none.start_for_link(ms(80), 1, 2);
        assert_eq!(none.now(), 0);
    }
}
