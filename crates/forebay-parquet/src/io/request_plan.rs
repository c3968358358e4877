//! Which requests fetch a set of byte ranges of a remote file: a request against its bytes.
//!
//! On an object store every request waits a round trip before its first byte, and every
//! byte fetched crosses the link (and is paid for across regions). Two column chunks with a
//! gap between them can be one request (the gap's bytes wasted) or two (one more round trip,
//! which runs in parallel with the other when the scan keeps enough requests in flight). A
//! column chunk much longer than a connection moves in one round trip is faster as parts
//! fetched in parallel:
//!
//! ```text
//!  selected:  [A]·[B]·········gap 0.9 MiB··········[C]   [D: 40 MiB ..........................]
//!  requests:  [A·B]                                [C]   [D 1   ][D 2   ][D 3   ][D 4   ][D 5 ]
//!              a small gap rides along      a long gap: its own request   parts in parallel
//! ```
//!
//! The rules ([`plan_requests`], [`split_for_parallel`]):
//! * gaps of at most [`ALWAYS_MERGE_GAP`] are always fetched (they cost less than any request);
//! * longer gaps are merged smallest first while the bytes wasted stay within
//!   [`WASTED_BYTES_SHARE`] of the selected bytes (or [`SMALL_READ_WASTE`], whichever is more:
//!   pages a page index picked out of a chunk are small, and a request each would cost more
//!   than the gaps), and never a gap longer than the link moves in one round trip
//!   ([`LinkEstimate::bytes_per_round_trip`]): such a gap costs more time than the request it
//!   saves even on a single connection;
//! * a range of at least twice [`LinkEstimate::part_bytes`] is fetched as parts of about that
//!   size at once, and put back together.
//!
//! The link is measured, not configured: every GET of a dataset records its size and time
//! into a [`LinkEstimate`] (small ones measure the round trip, large ones the bandwidth of a
//! connection). A caller that wants the old fixed rule passes
//! [`RangePolicy::MergeGapsUpTo`] (`ParquetDatasetBuilder::with_coalesce_gap`).

use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

/// Gaps this short are fetched with their neighbours whatever the budget: at 100 MB/s they
/// take ~0.16 ms, less than the overhead of any request.
pub const ALWAYS_MERGE_GAP: u64 = 16 << 10;

/// The bytes merging may waste, as a share of the selected bytes of one plan.
pub const WASTED_BYTES_SHARE: f64 = 0.125;

/// The bytes merging may waste in a plan whatever its selected bytes: ~2.5 ms at 100 MB/s,
/// less than a round trip to any object store.
pub const SMALL_READ_WASTE: u64 = 256 << 10;

/// The smallest part a long range is split into: requests stay large.
pub const MIN_PART_BYTES: u64 = 8 << 20;

/// What the link is assumed to be before anything is measured: a round trip to S3 from
/// within its region, and what one connection to it moves.
const DEFAULT_ROUND_TRIP: Duration = Duration::from_millis(30);
const DEFAULT_BYTES_PER_SECOND: f64 = 100e6;

/// Responses of at most this many bytes measure the round trip (their transfer is short).
const ROUND_TRIP_SAMPLE_MAX_BYTES: u64 = 256 << 10;
/// Responses of at least this many bytes measure the bandwidth of a connection.
const BANDWIDTH_SAMPLE_MIN_BYTES: u64 = 512 << 10;
/// Weight of a new sample in the moving averages.
const SAMPLE_WEIGHT: f64 = 0.2;

/// How the ranges a reader asks for become requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangePolicy {
    /// Merge ranges closer than this many bytes; never split (0: only the bytes asked for;
    /// what positioned reads of local files use).
    MergeGapsUpTo(u64),
    /// Weigh each gap against a request at the link's measured round trip and bandwidth,
    /// and split long ranges (the rules above). The default on object stores.
    Planned,
}

/// The round trip and the bandwidth of one connection, measured from the responses of a
/// dataset's requests (moving averages). Shared by the files of a dataset.
#[derive(Debug, Default)]
pub struct LinkEstimate {
    measured: Mutex<Measured>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Measured {
    round_trip_secs: Option<f64>,
    bytes_per_second: Option<f64>,
}

fn moving_average(old: Option<f64>, sample: f64) -> f64 {
    match old {
        Some(old) => old + SAMPLE_WEIGHT * (sample - old),
        None => sample,
    }
}

impl LinkEstimate {
    /// Record a response of `bytes` that took `elapsed` from request to its last byte.
    pub fn record(&self, bytes: u64, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let mut measured = self.measured.lock().unwrap_or_else(|e| e.into_inner());
        if bytes <= ROUND_TRIP_SAMPLE_MAX_BYTES {
            measured.round_trip_secs = Some(moving_average(measured.round_trip_secs, secs));
        } else if bytes >= BANDWIDTH_SAMPLE_MIN_BYTES {
            let round_trip = measured
                .round_trip_secs
                .unwrap_or(DEFAULT_ROUND_TRIP.as_secs_f64());
            // The transfer is what the response took beyond a round trip; a response faster
            // than the estimated round trip says the bandwidth is at least its bytes over a
            // tenth of its time.
            let transfer = (secs - round_trip).max(secs / 10.0).max(1e-6);
            let rate = bytes as f64 / transfer;
            measured.bytes_per_second = Some(moving_average(measured.bytes_per_second, rate));
        }
    }

    /// The measured round trip (the default, 30 ms, before any small response).
    pub fn round_trip(&self) -> Duration {
        let measured = *self.measured.lock().unwrap_or_else(|e| e.into_inner());
        measured
            .round_trip_secs
            .map_or(DEFAULT_ROUND_TRIP, Duration::from_secs_f64)
    }

    /// The measured bytes per second of one connection (the default, 100 MB/s, before any
    /// large response).
    pub fn bytes_per_second(&self) -> f64 {
        let measured = *self.measured.lock().unwrap_or_else(|e| e.into_inner());
        measured
            .bytes_per_second
            .unwrap_or(DEFAULT_BYTES_PER_SECOND)
    }

    /// What one connection moves in one round trip: a gap longer than this costs more time
    /// to fetch than a request of its own.
    pub fn bytes_per_round_trip(&self) -> u64 {
        (self.round_trip().as_secs_f64() * self.bytes_per_second()) as u64
    }

    /// The size of the parts a long range is fetched in: what a connection moves in a round
    /// trip (so each part takes at most about two round trips), at least [`MIN_PART_BYTES`].
    pub fn part_bytes(&self) -> u64 {
        self.bytes_per_round_trip().max(MIN_PART_BYTES)
    }
}

/// Merge byte ranges into requests: two ranges whose gap is at most `max_gap` bytes are
/// fetched as one. Returns the merged ranges sorted by start.
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

/// The requests that fetch `ranges` under `policy` (see the module's rules), sorted by
/// start; every range lies inside one request.
pub fn plan_requests(
    ranges: &[Range<u64>],
    policy: RangePolicy,
    link: &LinkEstimate,
) -> Vec<Range<u64>> {
    let exact = match policy {
        RangePolicy::MergeGapsUpTo(max_gap) => return coalesce_ranges(ranges, max_gap),
        RangePolicy::Planned => coalesce_ranges(ranges, 0),
    };
    if exact.len() < 2 {
        return exact;
    }
    let selected: u64 = exact.iter().map(|r| r.end - r.start).sum();
    let mut budget = ((selected as f64 * WASTED_BYTES_SHARE) as u64).max(SMALL_READ_WASTE);
    let longest_worth_merging = link.bytes_per_round_trip();
    let gap = |i: usize| exact[i + 1].start - exact[i].end;
    let mut by_length: Vec<usize> = (0..exact.len() - 1).collect();
    by_length.sort_by_key(|&i| gap(i));
    let mut merge_after = vec![false; exact.len() - 1];
    for i in by_length {
        let length = gap(i);
        if length > ALWAYS_MERGE_GAP && (length > budget || length > longest_worth_merging) {
            break; // every later gap is at least as long
        }
        budget = budget.saturating_sub(length);
        merge_after[i] = true;
    }
    let mut requests: Vec<Range<u64>> = Vec::with_capacity(exact.len());
    for (i, range) in exact.into_iter().enumerate() {
        match requests.last_mut() {
            Some(last) if merge_after[i - 1] => last.end = range.end,
            _ => requests.push(range),
        }
    }
    requests
}

/// The parts `range` is fetched in at once under `policy`: itself, unless the policy is
/// [`RangePolicy::Planned`] and it spans at least two of [`LinkEstimate::part_bytes`].
pub fn split_for_parallel(
    range: &Range<u64>,
    policy: RangePolicy,
    link: &LinkEstimate,
) -> Vec<Range<u64>> {
    let len = range.end.saturating_sub(range.start);
    let part = link.part_bytes();
    if policy != RangePolicy::Planned || len < 2 * part {
        return vec![range.clone()];
    }
    let parts = len.div_ceil(part);
    let each = len.div_ceil(parts);
    (0..parts)
        .map(|k| range.start + k * each..(range.start + (k + 1) * each).min(range.end))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn measured_link(round_trip_ms: u64, bytes_per_second: f64) -> LinkEstimate {
        let link = LinkEstimate::default();
        link.record(1024, Duration::from_millis(round_trip_ms));
        let big = 64 * MIB;
        let transfer = big as f64 / bytes_per_second;
        link.record(
            big,
            Duration::from_millis(round_trip_ms) + Duration::from_secs_f64(transfer),
        );
        link
    }

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

    #[test]
    fn the_link_is_measured_from_small_and_large_responses() {
        let link = measured_link(30, 200e6);
        assert_eq!(link.round_trip(), Duration::from_millis(30));
        let measured = link.bytes_per_second();
        assert!((measured - 200e6).abs() < 1e6, "{measured}");
        assert!(link.bytes_per_round_trip().abs_diff(6_000_000) < 1000);
        // Mid-sized responses measure neither; the averages move by a fifth per sample.
        link.record(300 << 10, Duration::from_secs(5));
        assert_eq!(link.round_trip(), Duration::from_millis(30));
        link.record(1024, Duration::from_millis(80));
        assert_eq!(link.round_trip(), Duration::from_millis(40));
        let fresh = LinkEstimate::default();
        assert_eq!(fresh.round_trip(), DEFAULT_ROUND_TRIP);
        assert_eq!(fresh.bytes_per_second(), DEFAULT_BYTES_PER_SECOND);
    }

    #[test]
    fn a_gap_is_merged_only_while_its_bytes_cost_less_than_a_request() {
        let link = measured_link(30, 200e6);
        // Two 1 MiB column chunks 0.95 MB apart (lineitem's l_orderkey, l_extendedprice):
        // merging would nearly double the bytes, so two requests.
        let two_columns = [0..MIB, MIB + 950_000..2 * MIB + 950_000];
        assert_eq!(
            plan_requests(&two_columns, RangePolicy::Planned, &link),
            two_columns.to_vec()
        );
        // A short gap rides along; the budget takes the shortest gaps first.
        let ranges = [
            0..MIB,
            MIB + 4096..2 * MIB,
            2 * MIB + 200_000..3 * MIB,
            4 * MIB..5 * MIB,
        ];
        assert_eq!(
            plan_requests(&ranges, RangePolicy::Planned, &link),
            vec![0..3 * MIB, 4 * MIB..5 * MIB],
            "4 KiB and 200 KB gaps fit 1/8 of 4 MiB; the 1 MiB gap does not"
        );
        // Many tiny gaps merge even past the budget.
        let pages: Vec<Range<u64>> = (0..10).map(|k| k * 1100..k * 1100 + 1000).collect();
        assert_eq!(
            plan_requests(&pages, RangePolicy::Planned, &link),
            vec![0..10_900]
        );
        // A gap longer than a round trip's bytes is never merged, whatever the budget.
        let slow = measured_link(10, 100.0 * MIB as f64); // 1 MiB a round trip
        let huge = [0..100 * MIB, 100 * MIB + 2 * MIB..200 * MIB];
        assert_eq!(
            plan_requests(&huge, RangePolicy::Planned, &slow),
            huge.to_vec()
        );
        // The fixed rule is the old one.
        assert_eq!(
            plan_requests(&two_columns, RangePolicy::MergeGapsUpTo(MIB), &link),
            vec![0..2 * MIB + 950_000]
        );
        // Every asked range lies in one request; unordered input is fine.
        let unordered = [5 * MIB..6 * MIB, 0..MIB, MIB + 10..MIB + 20];
        let planned = plan_requests(&unordered, RangePolicy::Planned, &link);
        for r in &unordered {
            assert_eq!(
                planned
                    .iter()
                    .filter(|p| p.start <= r.start && r.end <= p.end)
                    .count(),
                1
            );
        }
    }

    #[test]
    fn a_long_range_is_split_into_parts_fetched_at_once() {
        let link = measured_link(30, 200e6); // 6 MB a round trip: parts of MIN_PART_BYTES
        let short = 0..2 * MIN_PART_BYTES - 1;
        assert_eq!(
            split_for_parallel(&short, RangePolicy::Planned, &link),
            vec![short.clone()]
        );
        let long = 100..100 + 40 * MIB;
        let parts = split_for_parallel(&long, RangePolicy::Planned, &link);
        assert_eq!(parts.len(), 5);
        assert_eq!(parts.first().unwrap().start, long.start);
        assert_eq!(parts.last().unwrap().end, long.end);
        assert!(parts.windows(2).all(|w| w[0].end == w[1].start));
        assert!(parts.iter().all(|p| p.end - p.start <= MIN_PART_BYTES));
        assert_eq!(
            split_for_parallel(&long, RangePolicy::MergeGapsUpTo(MIB), &link),
            vec![long.clone()]
        );
        // A fast, far link moves more in a round trip: larger parts.
        let far = measured_link(80, 400e6); // 32 MB a round trip
        assert_eq!(
            split_for_parallel(&long, RangePolicy::Planned, &far).len(),
            1
        );
        let longer = 0..200 * MIB;
        assert_eq!(
            split_for_parallel(&longer, RangePolicy::Planned, &far).len(),
            7
        );
    }
}
