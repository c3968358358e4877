//! The output of `iter`: a [`BatchStream`] the caller pulls batches from.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;

use super::run::Run;
use crate::batch::EngineBatch;
use crate::error::{EngineError, Result};
use crate::memory::CancelToken;
use crate::queue::BatchQueue;
use crate::stats::RunStats;

/// The output of a running pipeline, batch by batch. Dropping it stops the run.
pub struct BatchStream {
    pub(super) ready: Arc<BatchQueue<Vec<EngineBatch>>>,
    pub(super) run: Option<Run>,
    pub(super) last_stats: Option<RunStats>,
}

/// The result of waiting for a batch for a while.
pub enum Poll {
    /// One output batch, as the zero-copy slices that make it up (usually one; an exact
    /// `batch_size` chunk spanning source batches has several). Their rows, in order, are
    /// the batch.
    Batch(Vec<RecordBatch>),
    /// Nothing yet; ask again.
    Pending,
    /// The run ended successfully.
    Done,
}

impl BatchStream {
    /// The next batch, waiting at most `timeout` (so that a caller can check for Ctrl-C).
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Poll> {
        let Some(run) = &self.run else {
            return Ok(Poll::Done);
        };
        let cancel: CancelToken = run.resources.cancel_token().clone();
        match self.ready.pop_timeout(&cancel, timeout) {
            Ok(Ok(Some(pieces))) => Ok(Poll::Batch(
                pieces.into_iter().map(EngineBatch::into_batch).collect(),
            )),
            Ok(Err(())) => Ok(Poll::Pending),
            Ok(Ok(None)) | Err(_) => {
                let run = self.run.take().expect("checked");
                match run.finish() {
                    (Some(e), stats) => {
                        self.last_stats = Some(stats);
                        Err(e)
                    }
                    (None, stats) => {
                        self.last_stats = Some(stats);
                        Ok(Poll::Done)
                    }
                }
            }
        }
    }

    /// Stop the run now (threads exit within ~50 ms; worker processes are stopped).
    pub fn cancel(&mut self) {
        if let Some(run) = self.run.take() {
            run.resources.fail(EngineError::Cancelled);
            let (_, stats) = run.finish();
            self.last_stats = Some(stats);
        }
    }

    /// Statistics: live while running, final after the end.
    pub fn stats(&self) -> Option<RunStats> {
        match &self.run {
            Some(run) => Some(run.stats()),
            None => self.last_stats.clone(),
        }
    }

    /// A snapshot of the memory pool while running (for tests and diagnostics).
    pub fn memory(&self) -> Option<crate::memory::PoolSnapshot> {
        self.run.as_ref().map(|r| r.resources.pool().snapshot())
    }
}

/// Batches as single record batches (pieces of one output batch are concatenated; use
/// [`BatchStream::next_timeout`] to receive them without that copy).
impl Iterator for BatchStream {
    type Item = Result<RecordBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.next_timeout(Duration::from_secs(3600)) {
                Ok(Poll::Batch(pieces)) => {
                    if pieces.len() == 1 {
                        return pieces.into_iter().next().map(Ok);
                    }
                    let schema = pieces[0].schema();
                    return Some(
                        crate::concat::concat_batches(&schema, &pieces).map_err(|e| {
                            EngineError::BadOutput {
                                stage: "iter_batches".into(),
                                batch: Default::default(),
                                reason: format!("batches of different schemas: {e}"),
                            }
                        }),
                    );
                }
                Ok(Poll::Pending) => continue,
                Ok(Poll::Done) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// Drop `value` on a short-lived thread (or here, if no thread can be started: a failed
/// spawn drops the closure, and `value` with it).
pub(super) fn free_in_background<T: Send + 'static>(value: T) {
    let _ = std::thread::Builder::new()
        .name(forebay_io::threads::thread_name("free"))
        .spawn(move || drop(value));
}
