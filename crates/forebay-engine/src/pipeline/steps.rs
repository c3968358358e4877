//! The steps the pipeline runs itself: `limit`, and the shaping of `iter_batches` (re-chunk
//! or shuffle, drop the last partial batch).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::batch::EngineBatch;
use crate::error::Result;
use crate::queue::BatchQueue;
use crate::rechunk::Rechunker;
use crate::resources::RunResources;
use crate::shuffle::LocalShuffler;
use crate::stats::StageCounters;

use super::IterOptions;

/// Pass `rows` rows through, then stop upstream.
pub(super) fn limit(
    rows: u64,
    input: &BatchQueue,
    output: &BatchQueue,
    resources: &RunResources,
    counters: &StageCounters,
) -> Result<()> {
    let cancel = resources.cancel_token();
    let mut left = rows;
    while left > 0 {
        let Some(mut batch) = input.pop(cancel)? else {
            return Ok(());
        };
        counters.record_in(batch.batch.num_rows());
        let n = batch.batch.num_rows() as u64;
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

/// The iter_batches step: re-chunk (into zero-copy pieces) or shuffle, drop the last
/// partial batch if asked, and feed the prefetch queue the caller reads. Each item of that
/// queue is one output batch: the slices that make it up.
pub(super) fn shape(
    input: &BatchQueue,
    ready: &BatchQueue<Vec<EngineBatch>>,
    resources: &RunResources,
    holder: &crate::memory::MemoryConsumer,
    options: &IterOptions,
    counters: &StageCounters,
    rows_out: &AtomicU64,
) -> Result<()> {
    let cancel = resources.cancel_token();
    let deliver = |pieces: Vec<EngineBatch>| -> Result<bool> {
        let rows: usize = pieces.iter().map(|b| b.batch.num_rows()).sum();
        counters.record_out(rows);
        rows_out.fetch_add(rows as u64, Ordering::Relaxed);
        ready.push(pieces, cancel)
    };
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
            Some(r) => r.push_pieces(b)?,
            None => vec![vec![b]],
        };
        for pieces in out {
            if !deliver(pieces)? {
                input.close_receiver();
                return Ok(());
            }
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
