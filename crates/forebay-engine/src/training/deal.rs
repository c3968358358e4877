//! Dealing an epoch's sample sequence to ranks (and to the loader workers of a rank).
//!
//! ```text
//!  sequence, from `consumed` on:  [ step 0: W × b samples          ][ step 1 ] ... [ rest < W × b ]
//!                                   rank 0 │ rank 1 │ … │ rank W-1                    drop: not dealt
//!                                   b      │ b      │   │ b                           pad: dealt, filled
//!                                                                                     from the epoch's start
//!  a rank's batches j = 0, 1, 2, … go to its loader workers round-robin: worker j mod k
//! ```
//!
//! Every rank gets the same number of full batches in an epoch, whatever the row counts: a
//! step is dealt whole or not at all. Steps are counted from where the epoch was resumed
//! (`consumed`, the samples every rank together took), so a resume with another world size
//! deals the rest of the very same sequence: concatenating, step after step, the ranks'
//! batches in rank order gives the sequence back.

use std::ops::Range;

use crate::error::{EngineError, Result};

/// What happens to the samples at the end of an epoch that do not fill a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remainder {
    /// They are not delivered this epoch.
    Drop,
    /// The last step is dealt whole, filled with samples from the start of the epoch's
    /// sequence (they are delivered twice in that epoch).
    Pad,
}

/// One consumer's share of the sequence: rank `rank` of `world_size`, loader worker
/// `worker` of `workers`, `batch_size` samples per batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub world_size: u64,
    pub rank: u64,
    pub workers: u64,
    pub worker: u64,
    pub batch_size: u64,
    pub remainder: Remainder,
}

impl Share {
    /// Check the numbers make sense (a clear error names the wrong one).
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(EngineError::InvalidArgument(what));
        if self.world_size == 0 {
            return bad("world_size must be at least 1".into());
        }
        if self.rank >= self.world_size {
            return bad(format!(
                "rank {} is not below world_size {}",
                self.rank, self.world_size
            ));
        }
        if self.workers == 0 || self.worker >= self.workers {
            return bad(format!(
                "loader worker {} of {}: must be below the number of workers (≥ 1)",
                self.worker, self.workers
            ));
        }
        if self.batch_size == 0 {
            return bad("batch_size must be at least 1".into());
        }
        Ok(())
    }

    /// Samples in one step (all ranks' batches).
    pub fn step(&self) -> u64 {
        self.world_size * self.batch_size
    }

    /// Batches each rank gets from an epoch of `rows` samples of which `consumed` are taken.
    pub fn rank_batches(&self, rows: u64, consumed: u64) -> u64 {
        let left = rows.saturating_sub(consumed);
        match self.remainder {
            Remainder::Drop => left / self.step(),
            Remainder::Pad => left.div_ceil(self.step()),
        }
    }

    /// Batches this worker yields (its rank's batches j with j mod workers == worker).
    pub fn worker_batches(&self, rows: u64, consumed: u64) -> u64 {
        let n = self.rank_batches(rows, consumed);
        if n > self.worker {
            (n - self.worker).div_ceil(self.workers)
        } else {
            0
        }
    }

    /// The sequence positions of this worker's `i`-th batch, as at most two ranges (the
    /// second when a padded batch wraps to the start of the epoch). Positions are below
    /// `rows`.
    pub fn batch_positions(&self, rows: u64, consumed: u64, i: u64) -> Vec<Range<u64>> {
        let j = self.worker + i * self.workers;
        let start = consumed + j * self.step() + self.rank * self.batch_size;
        let end = start + self.batch_size;
        let mut ranges = Vec::with_capacity(2);
        // Padding: positions past the end continue from the start of the sequence (again
        // and again if the epoch is smaller than a batch).
        let mut p = start;
        while p < end {
            let at = p % rows;
            let take = (rows - at).min(end - p);
            match ranges.last_mut() {
                Some(Range { end: last_end, .. }) if *last_end == at => *last_end += take,
                _ => ranges.push(at..at + take),
            }
            p += take;
        }
        ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn share(world_size: u64, rank: u64, workers: u64, worker: u64, b: u64, pad: bool) -> Share {
        Share {
            world_size,
            rank,
            workers,
            worker,
            batch_size: b,
            remainder: if pad { Remainder::Pad } else { Remainder::Drop },
        }
    }

    proptest! {
        /// Every rank (and every worker) gets full batches, the same number per rank, and
        /// the batches of all ranks and workers, step by step in rank order, are the
        /// sequence from `consumed` on (to the drop point, or whole and padded).
        #[test]
        fn ranks_get_equal_full_batches_covering_the_sequence(
            rows in 1u64..3_000, consumed_frac in 0.0f64..1.0, world in 1u64..=16,
            workers in 1u64..=4, b in 1u64..64, pad in any::<bool>(),
        ) {
            let consumed = ((rows as f64) * consumed_frac) as u64;
            let first = share(world, 0, 1, 0, b, pad);
            let n = first.rank_batches(rows, consumed);
            let mut dealt: Vec<Vec<u64>> = vec![Vec::new(); n as usize * world as usize];
            for rank in 0..world {
                prop_assert_eq!(share(world, rank, 1, 0, b, pad).rank_batches(rows, consumed), n);
                let mut total = 0;
                for worker in 0..workers {
                    let s = share(world, rank, workers, worker, b, pad);
                    for i in 0..s.worker_batches(rows, consumed) {
                        let positions: Vec<u64> = s.batch_positions(rows, consumed, i)
                            .into_iter().flatten().collect();
                        prop_assert_eq!(positions.len() as u64, b);
                        let j = worker + i * workers;
                        dealt[(j * world + rank) as usize] = positions;
                        total += 1;
                    }
                }
                prop_assert_eq!(total, n);
            }
            let flat: Vec<u64> = dealt.into_iter().flatten().collect();
            let expected: Vec<u64> = if pad {
                (consumed..consumed + n * world * b).map(|p| p % rows).collect()
            } else {
                (consumed..consumed + n * world * b).collect()
            };
            prop_assert_eq!(&flat, &expected);
            if pad {
                prop_assert!(consumed + n * world * b >= rows);
            } else {
                prop_assert!(rows - consumed - n * world * b < world * b);
            }
        }
    }

    #[test]
    fn wrong_numbers_are_refused() {
        assert!(share(0, 0, 1, 0, 8, false).validate().is_err());
        assert!(share(4, 4, 1, 0, 8, false).validate().is_err());
        assert!(share(4, 1, 2, 2, 8, false).validate().is_err());
        assert!(share(4, 1, 1, 0, 0, false).validate().is_err());
        assert!(share(4, 3, 2, 1, 8, true).validate().is_ok());
    }
}
