//! A running write (`start_write`, `start_write_checkpointed`): waited for, cancelled, and
//! on a checkpointed one, the checkpoint's finish and release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::run::Run;
use super::stream::free_in_background;
use crate::commit::{CommitLog, ResumeReport};
use crate::error::{EngineError, Result};
use crate::positions::RunPositions;
use crate::resume_filter::ResumeFilter;
use crate::stats::RunStats;
use crate::stats::{ResumeStats, WriteStats};
use crate::writer::{write_stats, OutputTarget};

/// What a checkpointed write keeps for its end.
pub(super) struct CheckpointRun {
    pub(super) log: Arc<CommitLog>,
    pub(super) delete_on_success: bool,
    pub(super) report: ResumeReport,
    pub(super) dataset: forebay_parquet::ParquetDataset,
    pub(super) done: DoneFilter,
}

/// What drops the rows earlier runs finished.
#[derive(Clone)]
pub(super) enum DoneFilter {
    /// The source, by input position.
    Positions(Arc<RunPositions>),
    /// The scan, by id.
    Ids(Arc<ResumeFilter>),
}

impl DoneFilter {
    pub(super) fn rows_dropped(&self) -> u64 {
        match self {
            DoneFilter::Positions(c) => c.rows_dropped(),
            DoneFilter::Ids(f) => f.rows_dropped(),
        }
    }

    pub(super) fn positions(&self) -> Option<Arc<RunPositions>> {
        match self {
            DoneFilter::Positions(c) => Some(c.clone()),
            DoneFilter::Ids(_) => None,
        }
    }
}

/// A write in progress.
pub struct RunningWrite {
    pub(super) run: Option<Run>,
    pub(super) target: Arc<OutputTarget>,
    pub(super) commits: Option<CheckpointRun>,
    pub(super) last_stats: Option<RunStats>,
}

impl RunningWrite {
    /// Wait up to `timeout`; `None` while still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<WriteStats>> {
        let deadline = Instant::now() + timeout;
        loop {
            let run = self.run.as_ref()?;
            if run.is_finished() {
                break;
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(self.finish())
    }

    /// Wait until the write ends.
    pub fn wait(mut self) -> Result<WriteStats> {
        loop {
            if let Some(r) = self.wait_timeout(Duration::from_secs(3600)) {
                return r;
            }
        }
    }

    fn finish(&mut self) -> Result<WriteStats> {
        let run = self.run.take().ok_or(EngineError::Cancelled)?;
        let started = run.started;
        let (error, stats) = run.finish();
        if let Some(e) = error {
            self.last_stats = Some(stats);
            // The checkpoint is free for the next run at once (the caller may keep this
            // handle alive, e.g. in a traceback).
            self.release_checkpoint();
            return Err(e);
        }
        let mut written = write_stats(&self.target, started);
        // The last completions, folded into the checkpoint (or the checkpoint deleted).
        let finished = self.commits.as_ref().map(|c| {
            let emptied = c.done.positions().map(|p| p.take_emptied());
            c.log
                .finish(c.delete_on_success, emptied.unwrap_or_default())
        });
        if let Some(Err(e)) = finished {
            self.release_checkpoint();
            return Err(e);
        }
        if let Some(c) = &self.commits {
            let m = c.dataset.metrics();
            written.resume = Some(ResumeStats {
                report: c.report.clone(),
                rows_skipped_by_id: match &c.done {
                    DoneFilter::Ids(f) => f.rows_dropped(),
                    DoneFilter::Positions(_) => 0,
                },
                rows_skipped_by_position: match &c.done {
                    DoneFilter::Positions(p) => p.rows_dropped(),
                    DoneFilter::Ids(_) => 0,
                },
                files_skipped: m.files_skipped,
                row_groups_skipped: m.row_groups_skipped,
                bytes_read: m.io.data_bytes + m.io.footer_bytes,
            });
        }
        // The checkpoint index (held by the resume filter, also through the dataset) is the
        // run's largest allocation (~10 bytes an id); returning it to the system takes
        // milliseconds nobody needs to wait for. The commit log goes here and now: it holds
        // the checkpoint's lock, which a run started right after this one must find free.
        self.release_checkpoint();
        written.seconds = started.elapsed().as_secs_f64();
        self.last_stats = Some(stats);
        Ok(written)
    }

    /// Drop the commit log (it holds the checkpoint's lock or lease, which a run started
    /// right after this one must find free) and free the index in the background.
    fn release_checkpoint(&mut self) {
        if let Some(CheckpointRun {
            log, dataset, done, ..
        }) = self.commits.take()
        {
            log.release();
            drop(log);
            free_in_background((dataset, done));
        }
    }

    /// Stop the write: files not yet published are removed.
    pub fn cancel(&mut self) {
        if let Some(run) = self.run.take() {
            run.resources.fail(EngineError::Cancelled);
            let (_, stats) = run.finish();
            self.last_stats = Some(stats);
        }
        self.release_checkpoint();
    }

    /// Statistics: live while running, final after the end.
    pub fn stats(&self) -> Option<RunStats> {
        match &self.run {
            Some(run) => Some(run.stats()),
            None => self.last_stats.clone(),
        }
    }
}
