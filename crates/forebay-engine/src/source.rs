//! Where a pipeline's batches come from: a forebay-parquet scan (with each batch's
//! provenance), or any iterator of batches.
//!
//! ```text
//!  ParquetDataset::scan ──► source thread ──reserve (waits for room: backpressure)──► queue
//!     │ the scan's own prefetch window (column chunks, decoded batches in its channels)
//!     └─ reserved for the whole run as plain bytes, estimated from the footer
//! ```
//!
//! The source is the only holder that waits for room in the pool, leaving headroom for what
//! the stages downstream allocate.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use forebay_parquet::ParquetDataset;

use crate::batch::{EngineBatch, Origin};
use crate::error::{BatchLabel, EngineError, Result, UserError};
use crate::lineage::{FileTicket, LineageBook, UnitTicket};
use crate::memory::{batch_memory, Admission};
use crate::queue::BatchQueue;
use crate::resources::RunResources;
use crate::stats::StageCounters;

/// Batches from a Rust iterator (for tests and embedders with their own data).
pub type BatchIterator =
    Box<dyn Iterator<Item = std::result::Result<RecordBatch, UserError>> + Send>;

/// The input of a pipeline.
pub enum Source {
    /// A Parquet dataset, scanned in order (file, then row group).
    Parquet(ParquetDataset),
    /// Batches of one schema from an iterator.
    Batches {
        schema: SchemaRef,
        batches: BatchIterator,
    },
}

impl Source {
    /// The schema of the source's batches.
    pub fn schema(&self) -> SchemaRef {
        match self {
            Source::Parquet(d) => d.schema(),
            Source::Batches { schema, .. } => schema.clone(),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Source::Parquet(_) => "read_parquet",
            Source::Batches { .. } => "source",
        }
    }
}

/// The source's holds on the file and row group it is emitting (checkpointed runs): each
/// is released through the lineage book once all of it has been emitted, so that it can
/// complete when every batch derived from it is done.
struct Holds {
    book: Arc<LineageBook>,
    file: Option<Arc<FileTicket>>,
    unit: Option<Arc<UnitTicket>>,
}

impl Holds {
    /// The ticket of the unit a batch comes from; moving to another unit (or file) means
    /// the previous one was emitted in full (the scan is ordered).
    fn unit(&mut self, file_index: usize, row_group: usize) -> Arc<UnitTicket> {
        if let Some(u) = &self.unit {
            if u.file.file_index == file_index && u.row_group == row_group {
                return u.clone();
            }
            let done = self.unit.take().expect("checked");
            self.book.release(vec![done]);
        }
        if self
            .file
            .as_ref()
            .is_some_and(|f| f.file_index != file_index)
        {
            let done = self.file.take().expect("checked");
            self.book.release_file(done);
        }
        let file = self
            .file
            .get_or_insert_with(|| self.book.file(file_index))
            .clone();
        let unit = self.book.unit(&file, row_group);
        self.unit = Some(unit.clone());
        unit
    }

    fn finish(mut self) {
        if let Some(u) = self.unit.take() {
            self.book.release(vec![u]);
        }
        if let Some(f) = self.file.take() {
            self.book.release_file(f);
        }
    }
}

/// The share of the memory cap a scan's window may take by fetching ahead (1 / this).
const WINDOW_SHARE: usize = 4;

/// How many row groups a scan of `dataset` may fetch ahead of its decoding (object stores)
/// with its window within `budget` bytes: the window is charged to the pool at once, and a
/// window near the cap would leave the batches no room.
fn fetch_ahead_within(dataset: &ParquetDataset, budget: usize) -> usize {
    let ahead = dataset.fetch_ahead();
    let window = dataset.scan_window_bytes_fetching_ahead(ahead) as usize;
    if ahead == 0 || window <= budget {
        return ahead;
    }
    let base = dataset.scan_window_bytes_fetching_ahead(0) as usize;
    let per_unit = (window - base).div_ceil(ahead).max(1);
    budget.saturating_sub(base) / per_unit
}

/// Read the source into `output` until it ends, downstream stops, or the run is cancelled.
/// `downstream_workers`: the workers of the stages and the sink, each of which may allocate
/// about a batch of its own.
///
/// Each batch is admitted with headroom for what will be allocated before the pool's next
/// look at the process: a batch per downstream worker, and a batch per decoding thread of
/// the scan (taking a batch from the scan lets it decode the next ones at once).
pub(crate) fn run_source(
    source: Source,
    output: Arc<BatchQueue>,
    resources: RunResources,
    counters: Arc<StageCounters>,
    downstream_workers: usize,
) -> Result<()> {
    let cancel = resources.cancel_token().clone();
    let name = source.name();
    let holder = resources.pool().consumer(name);
    let decoders = match &source {
        Source::Parquet(dataset) => dataset.decode_threads(),
        Source::Batches { .. } => 0,
    };
    let admit = |batch: &RecordBatch| {
        let headroom = (downstream_workers + decoders) * batch_memory(batch);
        holder.reserve_batch(
            batch,
            Admission::Wait {
                headroom,
                cancel: &cancel,
            },
        )
    };
    match source {
        Source::Parquet(dataset) => {
            let ahead = fetch_ahead_within(&dataset, resources.pool().limit() / WINDOW_SHARE);
            let window = dataset.scan_window_bytes_fetching_ahead(ahead) as usize;
            let _window = resources
                .pool()
                .consumer(format!("{name} (scan prefetch window)"))
                .reserve_bytes(window, Admission::Now)?;
            let mut scan = dataset.scan_fetching_ahead(ahead);
            let mut seq = 0u64;
            let mut lineage = resources.lineage().map(|book| Holds {
                book: book.clone(),
                file: None,
                unit: None,
            });
            let positions = resources.positions().cloned();
            // Input positions (checkpointed runs, see `positions`): the unit being read,
            // and how many of its rows the scan emitted before this batch.
            let mut unit: Option<(usize, usize)> = None;
            let mut unit_rows = 0u64;
            loop {
                // The source's busy time: waiting for the scan (reads and decoding), not for
                // room in the pool.
                let started = std::time::Instant::now();
                let Some(item) = scan.next_blocking() else {
                    break;
                };
                counters.record_busy(started.elapsed());
                cancel.check()?;
                let item = item?;
                let rows = item.batch.num_rows();
                let (file_index, row_group) =
                    (item.provenance.file_index, item.provenance.row_group);
                if unit != Some((file_index, row_group)) {
                    unit = Some((file_index, row_group));
                    unit_rows = 0;
                }
                let first = unit_rows;
                unit_rows += rows as u64;
                counters.record_in(rows);
                // The runs of rows no earlier commit consumed.
                let kept = match &positions {
                    Some(c) if rows > 0 => c.keep(&item.provenance.file, row_group, first, rows),
                    _ if rows > 0 => std::iter::once(0..rows).collect(),
                    _ => Vec::new(),
                };
                if kept.is_empty() {
                    // A row group the scan's row filter emptied (a resume's done ids), or
                    // rows earlier commits consumed: held like any unit, it completes once
                    // the scan moves past it.
                    if let Some(l) = lineage.as_mut() {
                        l.unit(file_index, row_group);
                    }
                    continue;
                }
                for run in kept {
                    let batch = if run.len() == rows {
                        item.batch.clone()
                    } else {
                        item.batch.slice(run.start, run.len())
                    };
                    let reservation = admit(&batch)?;
                    let ticket = lineage.as_mut().map(|l| l.unit(file_index, row_group));
                    let n = batch.num_rows();
                    let batch = EngineBatch {
                        batch,
                        seq,
                        origin: vec![Origin {
                            provenance: Some(item.provenance.clone()),
                            source_seq: seq,
                            rows: run,
                            position: ticket.as_ref().map(|_| first),
                            ticket,
                        }],
                        reservation,
                    };
                    seq += 1;
                    counters.record_out(n);
                    if !output.push(batch, &cancel)? {
                        return Ok(()); // downstream has all it needs (holds dropped: incomplete)
                    }
                }
            }
            if let Some(l) = lineage {
                l.finish(); // every unit was emitted in full
            }
        }
        Source::Batches { schema, batches } => {
            for (seq, item) in batches.enumerate() {
                cancel.check()?;
                let seq = seq as u64;
                let batch = item.map_err(|error| EngineError::UserFunction {
                    stage: name.to_string(),
                    batch: BatchLabel(format!("source batch {seq}")),
                    error,
                })?;
                if batch.schema() != schema {
                    return Err(EngineError::BadOutput {
                        stage: name.to_string(),
                        batch: BatchLabel(format!("source batch {seq}")),
                        reason: format!(
                            "schema {:?} differs from the source's {:?}",
                            batch.schema(),
                            schema
                        ),
                    });
                }
                let rows = batch.num_rows();
                let reservation = admit(&batch)?;
                counters.record_in(rows);
                counters.record_out(rows);
                let batch = EngineBatch {
                    batch,
                    seq,
                    origin: vec![Origin {
                        provenance: None,
                        source_seq: seq,
                        rows: 0..rows,
                        ticket: None,
                        position: None,
                    }],
                    reservation,
                };
                if !output.push(batch, &cancel)? {
                    break;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;
    use forebay_io::location::put_memory_object;
    use forebay_parquet::DatasetSource;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    /// A dataset on an object store (memory://): 2 files of 16 row groups of 64 Ki int64s.
    fn remote_dataset(name: &str) -> ParquetDataset {
        let batch = RecordBatch::try_from_iter([(
            "id",
            Arc::new(Int64Array::from_iter_values(0..1 << 20)) as _,
        )])
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1 << 16))
            .build();
        for k in 0..2 {
            let mut bytes = Vec::new();
            let mut writer =
                ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props.clone())).unwrap();
            writer.write(&batch).unwrap();
            writer.close().unwrap();
            put_memory_object(&format!("memory://{name}/part-{k}.parquet"), bytes).unwrap();
        }
        ParquetDataset::builder(DatasetSource::uris([format!("memory://{name}/")]))
            .build()
            .unwrap()
    }

    #[test]
    fn a_scan_fetches_ahead_only_what_fits_its_share_of_the_cap() {
        let dataset = remote_dataset("fetch-ahead-within");
        let ahead = dataset.fetch_ahead();
        assert!(ahead > 0, "object stores fetch ahead by default");
        let full = dataset.scan_window_bytes_fetching_ahead(ahead) as usize;
        let none = dataset.scan_window_bytes_fetching_ahead(0) as usize;
        assert!(none < full);
        // Room for it all, for none of it, and for about half of it.
        assert_eq!(fetch_ahead_within(&dataset, full), ahead);
        assert_eq!(fetch_ahead_within(&dataset, none), 0);
        assert_eq!(fetch_ahead_within(&dataset, 0), 0);
        let half = fetch_ahead_within(&dataset, none + (full - none) / 2);
        assert!(half > 0 && half < ahead, "{half} of {ahead}");
        assert!(
            dataset.scan_window_bytes_fetching_ahead(half) as usize <= none + (full - none) / 2
        );
        // What it reads does not depend on how far ahead it fetches.
        let rows = |units| -> usize {
            dataset
                .scan_fetching_ahead(units)
                .blocking_iter()
                .map(|b| b.unwrap().batch.num_rows())
                .sum()
        };
        assert_eq!(rows(0), 2 << 20);
        assert_eq!(rows(half), 2 << 20);
    }
}
