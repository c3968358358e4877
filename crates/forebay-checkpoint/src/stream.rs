//! Filtering a stream of batches on several threads, keeping the stream's order.
//!
//! A single thread probing batch after batch leaves the other cores idle while the reader
//! decodes; here `threads` workers each take the next batch from the input (numbered under
//! the input's lock), filter it against the shared index, and hand it back; the consumer
//! puts results back in input order. At most `2 × threads` finished batches wait in the
//! channel, so memory stays bounded when the consumer is slow.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use arrow_array::RecordBatch;

use crate::error::{CheckpointError, Result};
use crate::index::CheckpointIndex;

/// An index shared between threads: probes take the read lock, inserts the write lock.
pub type SharedCheckpointIndex = Arc<RwLock<CheckpointIndex>>;

type Numbered = (usize, Result<RecordBatch>);

/// Filtered batches of an input stream, in input order. Dropping it stops the workers.
pub struct FilteredBatches {
    results: Option<Receiver<Numbered>>,
    reorder: BTreeMap<usize, Result<RecordBatch>>,
    next: usize,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
}

/// Filter every batch of `input` against `index` on `threads` workers (see module docs).
/// Input errors are passed through (as [`CheckpointError::Input`]) in their position.
pub fn filter_in_parallel<I, E>(
    index: SharedCheckpointIndex,
    input: I,
    threads: usize,
) -> FilteredBatches
where
    I: Iterator<Item = std::result::Result<RecordBatch, E>> + Send + 'static,
    E: std::fmt::Display,
{
    let threads = threads.max(1);
    let input = Arc::new(Mutex::new((0usize, input)));
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = sync_channel::<Numbered>(2 * threads);
    let workers = (0..threads)
        .map(|_| {
            let (input, index, stop, tx) = (input.clone(), index.clone(), stop.clone(), tx.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let (seq, item) = {
                        let Ok(mut guard) = input.lock() else { break };
                        let (counter, iter) = &mut *guard;
                        let Some(item) = iter.next() else { break };
                        *counter += 1;
                        (*counter - 1, item)
                    };
                    let result = match item {
                        Err(e) => Err(CheckpointError::Input(e.to_string())),
                        Ok(batch) => match index.read() {
                            Ok(index) => index.filter(&batch),
                            Err(_) => Err(CheckpointError::InvalidArgument(
                                "checkpoint index poisoned by an earlier panic".into(),
                            )),
                        },
                    };
                    if tx.send((seq, result)).is_err() {
                        break; // consumer gone
                    }
                }
            })
        })
        .collect();
    FilteredBatches {
        results: Some(rx),
        reorder: BTreeMap::new(),
        next: 0,
        stop,
        workers,
    }
}

impl Iterator for FilteredBatches {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(ready) = self.reorder.remove(&self.next) {
                self.next += 1;
                return Some(ready);
            }
            let (seq, result) = self.results.as_ref()?.recv().ok()?;
            self.reorder.insert(seq, result);
        }
    }
}

impl Drop for FilteredBatches {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.results = None; // workers blocked on a full channel see the consumer is gone
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
