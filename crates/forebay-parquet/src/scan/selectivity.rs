//! How a filtered row group is decoded, chosen by the filter's measured selectivity.
//!
//! ```text
//!  filter keeps few rows (Q6: ~2 %)          filter keeps most rows (Q1: ~98 %)
//!  ────────────────────────────────          ──────────────────────────────────
//!  the parquet crate's RowFilter:            decode the row group whole (forebay's flat
//!  decode the filter's columns, then         decoders, no selection), then drop the rows
//!  only the selected rows of the others      the filter rejects with arrow's filter kernel
//! ```
//!
//! A selection that keeps most rows is a long run of short reads and skips: slower than
//! decoding every value with forebay's decoders and copying the kept ones. Filter columns
//! the scan does not return are decoded with the others and dropped after filtering
//! (`FilteredWhole`). Which case a scan
//! is in is measured, not guessed from statistics: every batch the filter evaluates (in the
//! RowFilter, or after decoding whole) adds its rows in and kept to the dataset's counters,
//! so the row groups that start before anything is measured go through the RowFilter, and
//! later ones are decoded whole while the filter has kept at least [`WHOLE_WHEN_KEPT`] of the
//! rows (a dataset sorted so that later row groups are filtered harder switches back).

use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::{ArrayRef, RecordBatch};

use super::FilteredWhole;
use crate::error::{corrupt, corrupt_from, Result};
use crate::predicate::BoundPredicate;

/// Decode filtered row groups whole once the filter has kept at least this fraction of the
/// rows it saw.
pub(super) const WHOLE_WHEN_KEPT: f64 = 0.5;

/// Rows a dataset's filter saw and kept, over every scan of it.
#[derive(Debug, Default)]
pub(super) struct FilterSelectivity {
    rows_in: AtomicU64,
    rows_kept: AtomicU64,
}

impl FilterSelectivity {
    /// Whether the next filtered row group is decoded whole, then filtered.
    pub(super) fn decode_whole(&self) -> bool {
        let rows_in = self.rows_in.load(Ordering::Relaxed);
        let kept = self.rows_kept.load(Ordering::Relaxed);
        rows_in > 0 && kept as f64 >= WHOLE_WHEN_KEPT * rows_in as f64
    }

    /// The filter kept `kept` of `rows_in` rows it evaluated.
    pub(super) fn record(&self, rows_in: u64, kept: u64) {
        self.rows_in.fetch_add(rows_in, Ordering::Relaxed);
        self.rows_kept.fetch_add(kept, Ordering::Relaxed);
    }
}

/// The rows of a batch decoded by `decoded`'s plan (`columns` in its order) that `filter`
/// keeps, in the columns the scan returns.
pub(super) fn keep_matching(
    decoded: &FilteredWhole,
    columns: Vec<ArrayRef>,
    filter: &BoundPredicate,
    measured: &FilterSelectivity,
    path: &str,
    row_group: usize,
) -> Result<(usize, Vec<ArrayRef>)> {
    let batch = RecordBatch::try_new(decoded.decode.schema.clone(), columns)
        .map_err(|e| corrupt_from(path, Some(row_group), e))?;
    let keep = filter
        .evaluate(&batch)
        .map_err(|e| corrupt(path, Some(row_group), format!("evaluating the filter: {e}")))?;
    measured.record(batch.num_rows() as u64, keep.true_count() as u64);
    let kept = if keep.true_count() == batch.num_rows() {
        batch
    } else {
        arrow_select::filter::filter_record_batch(&batch, &keep)
            .map_err(|e| corrupt_from(path, Some(row_group), e))?
    };
    let returned = match &decoded.returned {
        None => kept.columns().to_vec(),
        Some(positions) => positions.iter().map(|&i| kept.column(i).clone()).collect(),
    };
    Ok((kept.num_rows(), returned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_decoding_follows_what_the_filter_kept() {
        let measured = FilterSelectivity::default();
        assert!(
            !measured.decode_whole(),
            "nothing measured yet: the RowFilter"
        );
        measured.record(1000, 980);
        assert!(measured.decode_whole());
        measured.record(3000, 0);
        assert!(
            !measured.decode_whole(),
            "the filter got selective: back to the RowFilter"
        );
    }
}
