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
//! Before that, where the footer shows an id column chunk entirely dictionary-encoded (the
//! default of pyarrow and Spark while a chunk's dictionary stays under their page limit,
//! 1 MB: up to ~100 K distinct short ids per row group), the scan hands the filter the
//! chunk's dictionary: if every id in it is done the row group is dropped without reading
//! its data pages; if none is, its rows are read without a probe each.
//!
//! A stage after the source (`MapStage::checkpoint_filter`, still what embedders use on
//! their own sources) would get each batch fully decoded: on a resume whose inputs are mostly
//! done (the id-only checkpoint of Ray Data's layout, or the seed workload) most of a scan's
//! work would be decoding columns of rows about to be dropped.

use std::sync::atomic::{AtomicU64, Ordering};

use arrow_arith::boolean::not;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use forebay_checkpoint::SharedCheckpointIndex;
use forebay_parquet::{RowFilterError, RowGroupDecision, ScanRowFilter};

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

    /// For each id: whether the checkpoint index holds it (no nulls in the result).
    fn done(&self, ids: &dyn Array) -> Result<BooleanArray, RowFilterError> {
        let index = self
            .index
            .read()
            .map_err(|_| "checkpoint_filter: the checkpoint index was poisoned by a panic")?;
        Ok(index
            .contains(ids)
            .map_err(|e| format!("checkpoint_filter: {e}"))?)
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
        let done = self.done(batch.column(0).as_ref())?;
        self.dropped
            .fetch_add(done.true_count() as u64, Ordering::Relaxed);
        // `contains` has no nulls, so neither has its negation: no row is dropped by a null.
        Ok(not(&done)?)
    }

    /// An empty index decides nothing: reading dictionaries would only cost time.
    fn decides_by_values(&self) -> bool {
        self.index.read().is_ok_and(|index| !index.is_empty())
    }

    /// A row group whose every distinct id is done is dropped unread; one whose ids are
    /// all new is read without a probe per row.
    fn decide_by_values(
        &self,
        values: &ArrayRef,
        rows: u64,
    ) -> Result<RowGroupDecision, RowFilterError> {
        if values.is_empty() {
            return Ok(RowGroupDecision::RowByRow);
        }
        let done = self.done(values.as_ref())?.true_count();
        Ok(if done == values.len() {
            self.dropped.fetch_add(rows, Ordering::Relaxed);
            RowGroupDecision::DropAll
        } else if done == 0 {
            RowGroupDecision::KeepAll
        } else {
            RowGroupDecision::RowByRow
        })
    }
}
