//! What flows between stages: a record batch, where its rows came from, its position, and
//! the memory reservation it holds.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use forebay_parquet::BatchProvenance;

use crate::error::BatchLabel;
use crate::lineage::UnitTicket;
use crate::memory::{MemoryConsumer, Reservation};

/// The rows of one source batch that a pipeline batch covers.
#[derive(Debug, Clone)]
pub struct Origin {
    /// Where the source batch came from (None for sources other than Parquet).
    pub provenance: Option<BatchProvenance>,
    /// Position of the source batch in the source's order.
    pub source_seq: u64,
    /// Rows of that source batch covered, counted from its first row.
    pub rows: std::ops::Range<usize>,
    /// The input unit these rows come from, in checkpointed runs (see `lineage`): every
    /// batch holds its own reference.
    pub(crate) ticket: Option<Arc<UnitTicket>>,
    /// In checkpointed runs, the input position of the source batch's first row within its
    /// row group (see `positions`): row `r` of the source batch is at `position + r`.
    pub(crate) position: Option<u64>,
}

impl PartialEq for Origin {
    fn eq(&self, other: &Self) -> bool {
        self.provenance == other.provenance
            && self.source_seq == other.source_seq
            && self.rows == other.rows
    }
}

impl Eq for Origin {}

/// A batch in flight. Its reservation is charged to whoever holds it (a stage or a queue)
/// and released when it is dropped or handed to the caller.
pub struct EngineBatch {
    pub batch: RecordBatch,
    /// Position among the batches of the edge it travels on (the source's order, or the
    /// order of the tasks of the stage that produced it); used to restore order.
    pub seq: u64,
    /// The source rows it covers (several when batches were re-chunked together). Each batch
    /// owns its origins (cloning a batch's origins clones their lineage references).
    pub origin: Vec<Origin>,
    pub(crate) reservation: Reservation,
}

impl fmt::Debug for EngineBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineBatch")
            .field("rows", &self.batch.num_rows())
            .field("seq", &self.seq)
            .field("origin", &self.origin)
            .finish()
    }
}

impl EngineBatch {
    /// Charge `holder` for this batch from now on.
    pub(crate) fn move_to(&self, holder: &MemoryConsumer) {
        self.reservation.move_to(holder);
    }

    /// A description of the batch for error messages: its position and source rows.
    pub fn label(&self) -> BatchLabel {
        label(self.seq, &self.origin)
    }

    /// The batch without its reservation (it leaves the pool's accounting).
    pub fn into_batch(self) -> RecordBatch {
        self.batch
    }

    /// Take the lineage references of its origins (to release them through the book).
    pub(crate) fn take_tickets(&mut self) -> Vec<Arc<UnitTicket>> {
        self.origin
            .iter_mut()
            .filter_map(|o| o.ticket.take())
            .collect()
    }
}

/// "batch 7 (file a.parquet, row group 2, rows 0..65536)".
pub(crate) fn label(seq: u64, origin: &[Origin]) -> BatchLabel {
    let mut text = format!("batch {seq}");
    let parts: Vec<String> = origin
        .iter()
        .take(3)
        .map(|o| match &o.provenance {
            Some(p) => {
                let first = p.first_row.map_or(String::new(), |first| {
                    format!(
                        ", rows {}..{}",
                        first + o.rows.start as u64,
                        first + o.rows.end as u64
                    )
                });
                format!("file {}, row group {}{first}", p.file, p.row_group)
            }
            None => format!("source batch {}, rows {:?}", o.source_seq, o.rows),
        })
        .collect();
    if !parts.is_empty() {
        text.push_str(" (");
        text.push_str(&parts.join("; "));
        if origin.len() > 3 {
            text.push_str(&format!("; and {} more", origin.len() - 3));
        }
        text.push(')');
    }
    BatchLabel(text)
}

/// A copy of `batch` whose buffers are new allocations of this process (for batches read
/// out of the object store, whose regions should be freed at once).
pub(crate) fn deep_copy(batch: &RecordBatch) -> RecordBatch {
    use arrow_array::{make_array, Array};
    use arrow_data::transform::MutableArrayData;
    let columns = batch
        .columns()
        .iter()
        .map(|column| {
            let data = column.to_data();
            let mut copy = MutableArrayData::new(vec![&data], false, data.len());
            copy.try_extend(0, 0, data.len())
                .expect("copying an array into a buffer sized for it");
            make_array(copy.freeze())
        })
        .collect();
    RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
    .expect("a copy has the schema and length of its original")
}
