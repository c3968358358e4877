//! The resume filter of a checkpointed write, run inside the scan: finished rows are dropped
//! as their id column is decoded, before the rest of the row is.
//!
//! ```text
//!  row group ──decode id──► CheckpointIndex::contains ──► done rows dropped (counted)
//!                                                            │ rows not done
//!                                 decode the other columns ◄─┘ ──► source ──► stages
//!  every row done ──► one empty batch ──► the source completes the unit (no stage sees it)
//! ```
//!
//! A stage after the source (`MapStage::checkpoint_filter`, still what embedders use on
//! their own sources) would get each batch fully decoded: on a resume whose inputs are mostly
//! done (the id-only checkpoint of Ray Data's layout, or the seed workload) most of a scan's
//! work would be decoding columns of rows about to be dropped.

use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{BooleanArray, RecordBatch};
use arrow::compute::not;
use forebay_checkpoint::SharedCheckpointIndex;
use forebay_parquet::{RowFilterError, ScanRowFilter};

/// Drops rows whose id the checkpoint index holds; counts them.
pub(crate) struct ResumeFilter {
    index: SharedCheckpointIndex,
    /// `[id column]`.
    columns: Vec<String>,
    dropped: AtomicU64,
}

impl ResumeFilter {
    pub(crate) fn new(index: SharedCheckpointIndex, id_column: &str) -> ResumeFilter {
        ResumeFilter {
            index,
            columns: vec![id_column.to_string()],
            dropped: AtomicU64::new(0),
        }
    }

    /// Rows dropped so far because their id was done.
    pub(crate) fn rows_dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl ScanRowFilter for ResumeFilter {
    fn columns(&self) -> &[String] {
        &self.columns
    }

    fn keep(&self, batch: &RecordBatch) -> Result<BooleanArray, RowFilterError> {
        let index = self
            .index
            .read()
            .map_err(|_| "checkpoint_filter: the checkpoint index was poisoned by a panic")?;
        let done = index
            .contains(batch.column(0).as_ref())
            .map_err(|e| format!("checkpoint_filter: {e}"))?;
        self.dropped
            .fetch_add(done.true_count() as u64, Ordering::Relaxed);
        // `contains` has no nulls, so neither has its negation: no row is dropped by a null.
        Ok(not(&done)?)
    }
}
