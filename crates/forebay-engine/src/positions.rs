//! Input positions: a checkpointed run records which input rows each commit consumed, so
//! that a resume drops exactly those rows, whatever their ids.
//!
//! ```text
//!  position of a row = (input file, row group, index among the rows the scan emits for
//!                       that row group: those its scan filter keeps, in file order)
//!
//!  source ──► batch of a row group, positions p..p+n ──► (rows of earlier commits dropped)
//!              Origin { ticket: (file, row group), position: p, rows: a..b }  = p+a..p+b
//!  map      one output batch per input batch (several outputs are concatenated), carrying
//!           the input's origins: it holds exactly what those positions became; an input
//!           that became nothing is recorded with the next commit (`RunPositions`)
//!  later map inputs are whole outputs of the map before, merged (never split)
//!  writer   a batch goes whole into one file: the commit records its origins' positions
//!  resume   finished row groups skipped unread (lineage); in the others, the source drops
//!           the positions earlier commits recorded
//! ```
//!
//! Why positions and not ids: "id 7 is committed" does not say which of two rows holding
//! 7 was written, so a resume that drops rows by id drops a duplicate the uninterrupted run
//! writes. Positions make the output of a resumed run the output of an uninterrupted one,
//! duplicates or not, and a resume needs no id of what was done. Ids are still written with
//! every commit (Ray Data's layout, `CheckpointFilter`); a checkpoint holding ids without
//! positions (older forebay, untagged forebay.ray commits, Ray Data's own files) is still probed by
//! id as well.
//!
//! Positions are stable across runs while the inputs (checked by their identity) and the
//! scan filter (recorded) are: the same rows reach the source in the same order.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::batch::Origin;
use crate::commit::FinishedInputs;

/// Disjoint, sorted, non-adjacent ranges of positions within one row group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct PositionRanges(Vec<(u64, u64)>);

impl PositionRanges {
    /// Add `start..end` (merging with what it touches).
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut start, mut end) = (start, end);
        // The first range that ends at or after `start` (it may touch or overlap).
        let first = self.0.partition_point(|&(_, e)| e < start);
        let mut last = first;
        while last < self.0.len() && self.0[last].0 <= end {
            start = start.min(self.0[last].0);
            end = end.max(self.0[last].1);
            last += 1;
        }
        self.0.splice(first..last, [(start, end)]);
    }

    pub(crate) fn extend(&mut self, other: &PositionRanges) {
        for &(s, e) in &other.0 {
            self.insert(s, e);
        }
    }

    /// Positions covered.
    pub(crate) fn len(&self) -> u64 {
        self.0.iter().map(|&(s, e)| e - s).sum()
    }

    /// The runs of `start..end` not covered, as offsets from `start`.
    pub(crate) fn uncovered(&self, start: u64, end: u64) -> Vec<Range<usize>> {
        let mut runs = Vec::new();
        let mut at = start;
        let first = self.0.partition_point(|&(_, e)| e <= start);
        for &(s, e) in &self.0[first..] {
            if s >= end {
                break;
            }
            if s > at {
                runs.push((at - start) as usize..(s - start) as usize);
            }
            at = at.max(e);
        }
        if at < end {
            runs.push((at - start) as usize..(end - start) as usize);
        }
        runs
    }
}

/// Positions consumed, by input file index and row group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Consumed(pub BTreeMap<(usize, usize), PositionRanges>);

impl Consumed {
    /// Add the positions of a batch's origins (those of a Parquet source in a checkpointed
    /// run; the others carry none).
    pub(crate) fn add(&mut self, origins: &[Origin]) {
        for o in origins {
            let (Some(ticket), Some(first)) = (&o.ticket, o.position) else {
                continue;
            };
            self.0
                .entry((ticket.file.file_index, ticket.row_group))
                .or_default()
                .insert(first + o.rows.start as u64, first + o.rows.end as u64);
        }
    }

    /// Positions (input rows) covered.
    pub(crate) fn rows(&self) -> u64 {
        self.0.values().map(PositionRanges::len).sum()
    }

    pub(crate) fn merge(&mut self, other: Consumed) {
        for (unit, ranges) in other.0 {
            self.0.entry(unit).or_default().extend(&ranges);
        }
    }
}

/// The input positions of a run that resumes by position: which rows earlier commits
/// consumed (the source drops them), and which rows this run's maps turned into nothing
/// (recorded with the next commit, so that a resume does not map them again).
pub(crate) struct RunPositions {
    finished: Arc<FinishedInputs>,
    dropped: AtomicU64,
    emptied: Mutex<Consumed>,
}

impl RunPositions {
    pub(crate) fn new(finished: Arc<FinishedInputs>) -> RunPositions {
        RunPositions {
            finished,
            dropped: AtomicU64::new(0),
            emptied: Mutex::new(Consumed::default()),
        }
    }

    /// A map turned the rows of these origins into nothing: they are done.
    pub(crate) fn record_emptied(&self, origins: &[Origin]) {
        self.emptied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(origins);
    }

    /// The rows maps emptied since the last call, for a commit to record. (Lost if that
    /// commit does not happen: a resume maps them again, with no output again.)
    pub(crate) fn take_emptied(&self) -> Consumed {
        std::mem::take(&mut *self.emptied.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The rows (offsets into the batch) of a batch of `rows` rows at positions
    /// `first..first + rows` of `file`'s `row_group` that no earlier commit consumed.
    pub(crate) fn keep(
        &self,
        file: &str,
        row_group: usize,
        first: u64,
        rows: usize,
    ) -> Vec<Range<usize>> {
        let kept = match self.finished.consumed(file, row_group) {
            Some(done) => done.uncovered(first, first + rows as u64),
            None => std::iter::once(0..rows).collect(),
        };
        let kept_rows: usize = kept.iter().map(|r| r.len()).sum();
        self.dropped
            .fetch_add((rows - kept_rows) as u64, Ordering::Relaxed);
        kept
    }

    /// Rows dropped so far because an earlier commit consumed them.
    pub(crate) fn rows_dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(r: &PositionRanges) -> Vec<(u64, u64)> {
        r.0.clone()
    }

    #[test]
    fn inserts_merge_what_they_touch_and_keep_order() {
        let mut r = PositionRanges::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(0, 5);
        assert_eq!(ranges(&r), vec![(0, 5), (10, 20), (30, 40)]);
        r.insert(20, 30); // touches both neighbours
        assert_eq!(ranges(&r), vec![(0, 5), (10, 40)]);
        r.insert(3, 12);
        assert_eq!(ranges(&r), vec![(0, 40)]);
        r.insert(41, 41); // empty: nothing
        r.insert(50, 60);
        r.insert(45, 55);
        assert_eq!(ranges(&r), vec![(0, 40), (45, 60)]);
        assert_eq!(r.len(), 55);
    }

    #[test]
    fn uncovered_runs_are_the_complement_within_the_batch() {
        let mut r = PositionRanges::default();
        r.insert(10, 20);
        r.insert(25, 30);
        assert_eq!(r.uncovered(0, 10), vec![0..10]);
        assert_eq!(r.uncovered(5, 35), vec![0..5, 15..20, 25..30]);
        assert_eq!(r.uncovered(10, 20), Vec::<Range<usize>>::new());
        assert_eq!(r.uncovered(12, 27), vec![8..13]);
        assert_eq!(r.uncovered(30, 40), vec![0..10]);
    }

    #[test]
    fn random_inserts_match_a_set_of_positions() {
        // A deterministic generator: no dependency for a test.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..200 {
            let mut r = PositionRanges::default();
            let mut set = std::collections::BTreeSet::new();
            for _ in 0..next(12) {
                let s = next(100);
                let e = s + next(15);
                r.insert(s, e);
                set.extend(s..e);
            }
            assert_eq!(r.len(), set.len() as u64);
            for w in r.0.windows(2) {
                assert!(w[0].1 < w[1].0, "disjoint and not adjacent: {:?}", r.0);
            }
            let (s, e) = (next(100), 100 + next(20));
            let kept: Vec<u64> = r
                .uncovered(s, e)
                .into_iter()
                .flat_map(|run| run.start as u64 + s..run.end as u64 + s)
                .collect();
            let expected: Vec<u64> = (s..e).filter(|p| !set.contains(p)).collect();
            assert_eq!(kept, expected);
        }
    }
}
