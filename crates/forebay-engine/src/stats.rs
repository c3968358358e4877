//! Per-stage counters of a run, and the statistics reported after it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::errored::{ErroredRow, SAMPLES};

/// Counters a stage updates while it runs.
#[derive(Debug, Default)]
pub(crate) struct StageCounters {
    rows_in: AtomicU64,
    rows_out: AtomicU64,
    batches_in: AtomicU64,
    batches_out: AtomicU64,
    busy_nanos: AtomicU64,
    spilled_bytes: AtomicU64,
    rows_errored: AtomicU64,
    /// The first [`SAMPLES`] errored rows.
    errored_samples: Mutex<Vec<ErroredRow>>,
}

impl StageCounters {
    pub(crate) fn record_in(&self, rows: usize) {
        self.rows_in.fetch_add(rows as u64, Ordering::Relaxed);
        self.batches_in.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn record_out(&self, rows: usize) {
        self.rows_out.fetch_add(rows as u64, Ordering::Relaxed);
        self.batches_out.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn record_busy(&self, elapsed: Duration) {
        self.busy_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }
    pub(crate) fn record_spill(&self, bytes: u64) {
        self.spilled_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    /// Count rows the function failed on; keep the first ones. Returns the stage's count
    /// so far and the rows kept from these (to report).
    pub(crate) fn record_errored(&self, rows: Vec<ErroredRow>) -> (u64, Vec<ErroredRow>) {
        let total = self
            .rows_errored
            .fetch_add(rows.len() as u64, Ordering::Relaxed)
            + rows.len() as u64;
        let mut samples = self
            .errored_samples
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let room = SAMPLES.saturating_sub(samples.len());
        let kept: Vec<ErroredRow> = rows.into_iter().take(room).collect();
        samples.extend(kept.iter().cloned());
        (total, kept)
    }
    pub(crate) fn spilled(&self) -> u64 {
        self.spilled_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn snapshot(&self, name: &str, peak_bytes: u64, held_bytes: u64) -> StageStats {
        StageStats {
            name: name.to_string(),
            rows_in: self.rows_in.load(Ordering::Relaxed),
            rows_out: self.rows_out.load(Ordering::Relaxed),
            batches_in: self.batches_in.load(Ordering::Relaxed),
            batches_out: self.batches_out.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.busy_nanos.load(Ordering::Relaxed)),
            peak_bytes,
            held_bytes,
            spilled_bytes: self.spilled_bytes.load(Ordering::Relaxed),
            rows_errored: self.rows_errored.load(Ordering::Relaxed),
            errored: self
                .errored_samples
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

/// What one stage did in a run.
#[derive(Debug, Clone, PartialEq)]
pub struct StageStats {
    pub name: String,
    pub rows_in: u64,
    pub rows_out: u64,
    pub batches_in: u64,
    pub batches_out: u64,
    /// Time spent inside the stage's function, summed over its workers.
    pub busy: Duration,
    /// The most memory the stage (and its queues and buffers) held at once.
    pub peak_bytes: u64,
    /// Memory it holds now (0 after the run).
    pub held_bytes: u64,
    /// Bytes moved out of memory by the stage (reorder buffer, held batches).
    pub spilled_bytes: u64,
    /// Rows its function failed on and that were set aside (`on_error="skip"`).
    pub rows_errored: u64,
    /// The first of them (up to [`SAMPLES`](crate::errored::SAMPLES)), with their errors.
    pub errored: Vec<ErroredRow>,
}

/// What a run did, stage by stage.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStats {
    pub stages: Vec<StageStats>,
    pub wall: Duration,
    pub memory_limit: u64,
    /// The most memory in flight at once (the pool's charges, leaving out the reserved
    /// arena of the run's object store).
    pub peak_bytes: u64,
    /// Bytes the object store wrote to spill files.
    pub store_spilled_bytes: u64,
}

/// One published file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
}

/// What a write did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteStats {
    pub rows: u64,
    pub files: Vec<WrittenFile>,
    pub bytes: u64,
    /// Files of rows set aside under `_dead_letter/` (see `dead_letter`).
    pub dead_letter_files: Vec<WrittenFile>,
    pub seconds: f64,
    /// For a checkpointed write: what it found done and skipped.
    pub resume: Option<ResumeStats>,
}

/// What a checkpointed write skipped of its input.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumeStats {
    pub report: crate::commit::ResumeReport,
    /// Rows read but dropped because their id was done (a checkpoint whose rows are known
    /// only by id: written by forebay.ray, an older forebay, or Ray Data).
    pub rows_skipped_by_id: u64,
    /// Rows read but dropped because an earlier commit consumed their input position
    /// (rows of row groups an interrupted run left unfinished).
    pub rows_skipped_by_position: u64,
    /// Input files skipped unread (neither footer nor data fetched).
    pub files_skipped: u64,
    /// Row groups skipped unread.
    pub row_groups_skipped: u64,
    /// Bytes of input the dataset fetched (footers and column chunks), from its opening:
    /// on an object store small files are fetched whole with their footers while the
    /// dataset's schema is read, before the run starts, and their data then costs no
    /// request. (A dataset written twice counts both runs.)
    pub bytes_read: u64,
}
