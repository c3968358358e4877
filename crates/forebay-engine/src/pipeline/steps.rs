//! The steps the pipeline runs itself: `limit`, and the shaping of `iter_batches` (re-chunk
//! or shuffle, drop the last partial batch).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::batch::EngineBatch;
use crate::error::{EngineError, Result};
use crate::queue::BatchQueue;
use crate::rechunk::{Chunks, Rechunker};
use crate::resources::RunResources;
use crate::shuffle::LocalShuffler;
use crate::stats::StageCounters;

use super::{IterOptions, Step};

/// Pass `rows` rows through, then stop upstream.
///
/// In a checkpointed run, once the limit is reached no input unit or file completes (the
/// lineage book is poisoned): the rest of a cut batch, batches still queued and rows not
/// yet read are never written, so a unit whose last written batch is released after this
/// point must not count as finished. Resumes read such units again and drop their rows
/// done by position or id.
pub(super) fn limit(
    rows: u64,
    input: &BatchQueue,
    output: &BatchQueue,
    resources: &RunResources,
    counters: &StageCounters,
) -> Result<()> {
    let cancel = resources.cancel_token();
    let reached = || {
        if let Some(book) = resources.lineage() {
            book.poison();
        }
    };
    let mut left = rows;
    if left == 0 {
        reached();
    }
    while left > 0 {
        let Some(mut batch) = input.pop(cancel)? else {
            return Ok(());
        };
        counters.record_in(batch.batch.num_rows());
        let n = batch.batch.num_rows() as u64;
        if n >= left {
            // Before the batch goes on: its commit must not complete its unit.
            reached();
        }
        if n > left {
            let keep = left as usize;
            batch.batch = batch.batch.slice(0, keep);
            batch.origin = crate::rechunk::split_origin(&batch.origin, keep).0;
        }
        left -= (batch.batch.num_rows() as u64).min(left);
        counters.record_out(batch.batch.num_rows());
        if !output.push(batch, cancel)? {
            break;
        }
    }
    input.close_receiver();
    Ok(())
}

/// A checkpointed job's `limit(n)` is n input rows over all its runs, not n more each run:
/// each limit of a resumed run passes only the rows the checkpoint's commits have not
/// accounted for (`rows_done`; limits come before any map, so they count the same input
/// rows). Rows of commits that did not happen were not counted: they are passed again.
/// Returns a message when a limit is used up (the run writes nothing).
pub(super) fn resume_limits(
    steps: &mut [Step],
    rows_done: Option<u64>,
    checkpoint: &str,
) -> Result<Option<String>> {
    let mut used_up = None;
    for step in steps {
        let Step::Limit(rows) = step else { continue };
        let Some(done) = rows_done else {
            return Err(EngineError::InvalidArgument(format!(
                "the checkpoint {checkpoint} holds commits that did not count their input \
                 rows (forebay.ray's of rows without positions, or an older forebay's), so a \
                 resumed limit({rows}) cannot tell how many rows it has left: drop limit(), \
                 or start a new checkpoint"
            )));
        };
        if done >= *rows {
            used_up = Some(format!(
                "the checkpoint {checkpoint} records {done} input rows written, and this job \
                 is limited to {rows}: this run writes nothing (delete the checkpoint \
                 directory to run it again from the start)"
            ));
        }
        *rows = rows.saturating_sub(done);
    }
    Ok(used_up)
}

/// The iter_batches step: re-chunk (into zero-copy slices) or shuffle, drop the last
/// partial batch if asked, and feed the prefetch queue the caller reads. Each item of that
/// queue is one output batch as the slices that make it up, or a run of output batches cut
/// from one input batch (see [`Chunks`]).
pub(super) fn shape(
    input: &BatchQueue,
    ready: &BatchQueue<Chunks>,
    resources: &RunResources,
    holder: &crate::memory::MemoryConsumer,
    options: &IterOptions,
    counters: &StageCounters,
    rows_out: &AtomicU64,
) -> Result<()> {
    let cancel = resources.cancel_token();
    let deliver_all = |chunks: Vec<Chunks>| -> Result<bool> {
        let rows: Vec<usize> = chunks.iter().flat_map(Chunks::batch_rows).collect();
        if !ready.push_all(chunks, cancel)? {
            return Ok(false);
        }
        for n in rows {
            counters.record_out(n);
            rows_out.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(true)
    };
    let deliver = |pieces: Vec<EngineBatch>| deliver_all(vec![Chunks::Pieces(pieces)]);
    if let Some((buffer_rows, seed)) = options.local_shuffle {
        let batch_size = options.batch_size.unwrap_or(256);
        let mut shuffler = LocalShuffler::new(buffer_rows, batch_size, seed, holder.clone());
        while let Some(b) = input.pop(cancel)? {
            counters.record_in(b.batch.num_rows());
            shuffler.push(b);
            while let Some(out) = shuffler.next_batch(false)? {
                if !deliver(vec![out])? {
                    input.close_receiver();
                    return Ok(());
                }
            }
        }
        while let Some(out) = shuffler.next_batch(true)? {
            if options.drop_last && out.batch.num_rows() < batch_size {
                break;
            }
            if !deliver(vec![out])? {
                break;
            }
        }
        return Ok(());
    }
    let mut rechunker = options
        .batch_size
        .map(|n| Rechunker::new("iter_batches", n, holder.clone()));
    while let Some(b) = input.pop(cancel)? {
        counters.record_in(b.batch.num_rows());
        let out = match rechunker.as_mut() {
            Some(r) => r.push_runs(b)?,
            None => vec![Chunks::Pieces(vec![b])],
        };
        // What one input batch gives goes in together: slices of memory already held, it
        // adds nothing to the pool, and the caller takes it without waiting for this thread
        // in between (with the default prefetch of one batch, 256-row batches otherwise cost
        // two thread switches each).
        if !deliver_all(out)? {
            input.close_receiver();
            return Ok(());
        }
    }
    if let Some(rest) = rechunker
        .as_mut()
        .map(|r| r.finish_pieces())
        .transpose()?
        .flatten()
    {
        let partial = options
            .batch_size
            .is_some_and(|n| rest.iter().map(|b| b.batch.num_rows()).sum::<usize>() < n);
        if !(options.drop_last && partial) {
            deliver(rest)?;
        }
    }
    Ok(())
}
