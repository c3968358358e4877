//! The output of `iter`: a [`BatchStream`] the caller pulls batches from.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;

use super::run::Run;
use crate::batch::EngineBatch;
use crate::error::{EngineError, Result};
use crate::memory::CancelToken;
use crate::queue::BatchQueue;
use crate::rechunk::Chunks;
use crate::stats::RunStats;

/// The output of a running pipeline, batch by batch. Dropping it stops the run.
///
/// The batches cut from one input batch arrive as one run (see `rechunk::Chunks`): the
/// stream hands them out one by one from it without going back to the queue, or the caller
/// takes the rest of the run at once ([`BatchStream::take_rest_of_run`]) and cuts it.
pub struct BatchStream {
    pub(super) ready: Arc<BatchQueue<Chunks>>,
    pub(super) run: Option<Run>,
    pub(super) last_stats: Option<RunStats>,
    /// The batches of the current run not handed out yet, and the rows of each. Charged
    /// (to the prefetch queue's holder) until the last of them is handed out.
    pub(super) rest_of_run: Option<(EngineBatch, usize)>,
    /// The rest of a run the caller took whole: still charged until the caller asks for
    /// the next batch.
    pub(super) handed_run: Option<EngineBatch>,
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
        // The caller is done with the run it took.
        self.handed_run = None;
        let Some(run) = &self.run else {
            return Ok(Poll::Done);
        };
        let cancel: CancelToken = run.resources.cancel_token().clone();
        if cancel.is_cancelled() {
            // The run failed or stopped: its error comes before the batches left.
            self.rest_of_run = None;
        }
        if let Some((rest, each)) = self.rest_of_run.take() {
            return Ok(Poll::Batch(vec![self.cut_run(rest, each)]));
        }
        match self.ready.pop_timeout(&cancel, timeout) {
            Ok(Ok(Some(Chunks::Pieces(pieces)))) => Ok(Poll::Batch(
                pieces.into_iter().map(EngineBatch::into_batch).collect(),
            )),
            Ok(Ok(Some(Chunks::Run { run, each }))) => {
                Ok(Poll::Batch(vec![self.cut_run(run, each)]))
            }
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

    /// The first batch of `run` (of batches of `each` rows); the others wait in
    /// `rest_of_run`, still charged.
    fn cut_run(&mut self, run: EngineBatch, each: usize) -> RecordBatch {
        let rows = run.batch.num_rows();
        if rows <= each {
            return run.into_batch();
        }
        let first = run.batch.slice(0, each);
        let rest = EngineBatch {
            batch: run.batch.slice(each, rows - each),
            ..run
        };
        self.rest_of_run = Some((rest, each));
        first
    }

    /// Right after [`next_timeout`](Self::next_timeout) returned a batch of a run: the
    /// batches of the run not handed out yet, as one batch (zero-copy), and the rows of
    /// each; the caller cuts it (`slice(k * each, each)`). Its memory stays charged until
    /// the next call to `next_timeout`. `None`: no batches of a run are left.
    pub fn take_rest_of_run(&mut self) -> Option<(RecordBatch, usize)> {
        let (rest, each) = self.rest_of_run.take()?;
        let batch = rest.batch.clone();
        self.handed_run = Some(rest);
        Some((batch, each))
    }

    /// Stop the run now (threads exit within ~50 ms; worker processes are stopped).
    pub fn cancel(&mut self) {
        self.rest_of_run = None;
        self.handed_run = None;
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
