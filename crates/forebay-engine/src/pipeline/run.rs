//! A run: its threads, the first error (which cancels the rest), its progress bar and its
//! statistics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::events::PipelineEvent;
use crate::progress::Progress;
use crate::resources::RunResources;
use crate::stats::{RunStats, StageCounters, StageStats};

/// The threads and shared state of a run.
pub(super) struct Run {
    pub(super) resources: RunResources,
    pub(super) threads: Vec<JoinHandle<()>>,
    pub(super) started: Instant,
    pub(super) counters: Vec<(String, Arc<StageCounters>)>,
    /// Rows delivered by the sink (progress, final statistics).
    pub(super) rows_out: Arc<AtomicU64>,
    pub(super) progress: Option<Progress>,
    pub(super) known_rows: Option<Box<dyn FnOnce() -> Option<u64> + Send>>,
    /// Rows of the known total that end without reaching the sink (done ids a checkpointed
    /// write drops while reading), so that the bar still ends at its total.
    pub(super) rows_settled_early: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
}

impl Run {
    pub(super) fn add_counters(&mut self, name: &str) -> Arc<StageCounters> {
        let c = Arc::new(StageCounters::default());
        self.counters.push((name.to_string(), c.clone()));
        c
    }

    /// Run `body` on a thread; its error (or panic) fails the run.
    pub(super) fn spawn(&mut self, name: &str, body: impl FnOnce() -> Result<()> + Send + 'static) {
        let resources = self.resources.clone();
        let label = name.to_string();
        let handle = std::thread::Builder::new()
            .name(forebay_io::threads::thread_name(name))
            .spawn(
                move || match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => resources.fail(e),
                    Err(panic) => resources.fail(EngineError::Worker {
                        stage: label,
                        reason: format!("internal error (please report): {}", panic_text(&panic)),
                    }),
                },
            )
            .expect("cannot start a thread");
        self.threads.push(handle);
    }

    pub(super) fn start_progress(&mut self, label: &str, enabled: bool) {
        if !enabled {
            return;
        }
        let total = self.known_rows.take().unwrap_or_else(|| Box::new(|| None));
        let store_resources = self.resources.clone();
        let counters: Vec<Arc<StageCounters>> =
            self.counters.iter().map(|(_, c)| c.clone()).collect();
        let spilled = Arc::new(move || {
            counters.iter().map(|c| c.spilled()).sum::<u64>()
                + store_resources
                    .store_if_created()
                    .and_then(|s| s.stats().ok())
                    .map_or(0, |s| s.spilled_bytes)
        });
        let rows_out = self.rows_out.clone();
        let settled_early = self.rows_settled_early.take();
        let rows_done = Arc::new(move || {
            rows_out.load(Ordering::Relaxed) + settled_early.as_ref().map_or(0, |f| f())
        });
        self.progress = Some(Progress::start(
            label.to_string(),
            rows_done,
            spilled,
            total,
        ));
    }

    pub(super) fn cancel(&self) {
        self.resources.cancel();
    }

    pub(super) fn is_finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    /// Wait for every thread; the run's error (if any) and its statistics.
    pub(super) fn finish(mut self) -> (Option<EngineError>, RunStats) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.progress = None;
        let error = self.resources.take_error();
        let stats = self.stats();
        self.resources.emit(PipelineEvent::Finished {
            rows: self.rows_out.load(Ordering::Relaxed),
            seconds: stats.wall.as_secs_f64(),
            error: error.as_ref().map(|e| e.to_string()),
        });
        (error, stats)
    }

    pub(super) fn stats(&self) -> RunStats {
        let snapshot = self.resources.pool().snapshot();
        let stages = self
            .counters
            .iter()
            .map(|(name, c)| {
                // A stage's own holders: its name, its reorder buffer, its output queue.
                let own =
                    |consumer: &str| consumer == name || consumer.starts_with(&format!("{name} ("));
                let peak = snapshot
                    .consumers
                    .iter()
                    .filter(|c| own(&c.name))
                    .map(|c| c.peak as u64)
                    .max()
                    .unwrap_or(0);
                let held = snapshot
                    .consumers
                    .iter()
                    .filter(|c| own(&c.name))
                    .map(|c| c.held as u64)
                    .sum();
                c.snapshot(name, peak, held)
            })
            .collect::<Vec<StageStats>>();
        RunStats {
            stages,
            wall: self.started.elapsed(),
            memory_limit: snapshot.limit as u64,
            peak_bytes: snapshot.peak_in_flight as u64,
            store_spilled_bytes: self
                .resources
                .store_if_created()
                .and_then(|s| s.stats().ok())
                .map_or(0, |s| s.spilled_bytes),
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.cancel();
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

pub(super) fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}
