//! Building and running a pipeline: source → steps → sink, one thread group per step,
//! bounded queues between them, one memory pool for the run.
//!
//! ```text
//!  source ─► q ─► map "a" ─► q ─► limit ─► q ─► map "b" ─► q ─► sink
//!   thread        dispatcher      thread       dispatcher        iter_batches: shaping thread ─► prefetch queue ─► caller
//!                 + workers                    + workers         write_parquet: writer workers ─► files
//! ```
//!
//! The first error of any thread cancels the run: every waiting thread wakes within ~50 ms
//! and exits, the caller gets that error. Dropping a [`BatchStream`] (or calling `cancel`)
//! stops the run the same way.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::batch::EngineBatch;
use crate::commit::{Checkpoint, CommitLog, ResumeReport};
use crate::error::{EngineError, Result};
use crate::events::{EventSink, PipelineEvent};
use crate::lineage::LineageBook;
use crate::locations::check_write_locations;
use crate::memory::{CancelToken, MemoryPool};
use crate::progress::Progress;
use crate::queue::BatchQueue;
use crate::rechunk::Rechunker;
use crate::resources::{RunResources, StoreSettings};
use crate::resume_filter::ResumeFilter;
use crate::shuffle::LocalShuffler;
use crate::source::{run_source, Source};
use crate::stage::{spawn_stage, MapStage};
use crate::stats::{ResumeStats, WriteStats};
use crate::stats::{RunStats, StageCounters, StageStats};
use crate::writer::{run_writer, write_stats, OutputTarget, ParquetSink};

/// Default memory limit of a run: a quarter of the machine's memory, at least 256 MiB.
pub fn default_memory_limit() -> usize {
    let total = total_memory().unwrap_or(8 << 30);
    (total / 4).max(256 << 20)
}

fn total_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// How a run behaves.
#[derive(Clone)]
pub struct PipelineOptions {
    /// The pool's hard cap on bytes in flight.
    pub memory_limit: usize,
    /// Keep the source's order through concurrent stages.
    pub preserve_order: bool,
    /// Batches a queue between two steps may hold.
    pub queue_batches: usize,
    /// Draw a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
    /// Directory for spilled batches (default: the system temp dir).
    pub spill_dir: Option<PathBuf>,
    /// Capacity of the run's object store (worker exchange, held batches); default a
    /// quarter of the memory limit. Charged to the pool when the store is created.
    pub store_capacity: Option<usize>,
    pub events: Option<EventSink>,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            memory_limit: default_memory_limit(),
            preserve_order: false,
            queue_batches: 2,
            progress: false,
            spill_dir: None,
            store_capacity: None,
            events: None,
        }
    }
}

impl std::fmt::Debug for PipelineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineOptions")
            .field("memory_limit", &self.memory_limit)
            .field("preserve_order", &self.preserve_order)
            .field("queue_batches", &self.queue_batches)
            .field("progress", &self.progress)
            .field("spill_dir", &self.spill_dir)
            .field("store_capacity", &self.store_capacity)
            .finish()
    }
}

enum Step {
    Map(MapStage),
    Limit(u64),
}

impl Step {
    fn name(&self) -> String {
        match self {
            Step::Map(m) => m.name.clone(),
            Step::Limit(n) => format!("limit({n})"),
        }
    }
    fn workers(&self) -> usize {
        match self {
            Step::Map(m) => m.concurrency,
            Step::Limit(_) => 1,
        }
    }
}

/// A pipeline being described: a source and steps; run it with [`iter`](Pipeline::iter) or
/// [`write_parquet`](Pipeline::write_parquet).
pub struct Pipeline {
    source: Source,
    steps: Vec<Step>,
    options: PipelineOptions,
}

/// How `iter` shapes the batches it hands out.
#[derive(Debug, Clone)]
pub struct IterOptions {
    /// Rows per batch (re-chunked; the last may be smaller). `None`: as produced.
    pub batch_size: Option<usize>,
    /// Batches ready ahead of the caller.
    pub prefetch_batches: usize,
    /// Drop the last batch if it is smaller than `batch_size`.
    pub drop_last: bool,
    /// `(buffer rows, seed)`: shuffle rows within a buffer of at least this many rows.
    pub local_shuffle: Option<(usize, Option<u64>)>,
}

impl Default for IterOptions {
    fn default() -> Self {
        IterOptions {
            batch_size: None,
            prefetch_batches: 4,
            drop_last: false,
            local_shuffle: None,
        }
    }
}

impl Pipeline {
    pub fn new(source: Source) -> Pipeline {
        Pipeline {
            source,
            steps: Vec::new(),
            options: PipelineOptions::default(),
        }
    }

    /// Apply a map stage.
    pub fn map(mut self, stage: MapStage) -> Pipeline {
        self.steps.push(Step::Map(stage));
        self
    }

    /// Stop after `rows` rows (upstream stops reading once they are through).
    pub fn limit(mut self, rows: u64) -> Pipeline {
        self.steps.push(Step::Limit(rows));
        self
    }

    pub fn with_options(mut self, options: PipelineOptions) -> Pipeline {
        self.options = options;
        self
    }

    pub fn with_memory_limit(mut self, bytes: usize) -> Pipeline {
        self.options.memory_limit = bytes;
        self
    }

    pub fn with_preserve_order(mut self, preserve: bool) -> Pipeline {
        self.options.preserve_order = preserve;
        self
    }

    pub fn with_progress(mut self, progress: bool) -> Pipeline {
        self.options.progress = progress;
        self
    }

    pub fn with_events(mut self, events: EventSink) -> Pipeline {
        self.options.events = Some(events);
        self
    }

    /// The source's schema (the output's, when no step changes columns).
    pub fn source_schema(&self) -> SchemaRef {
        self.source.schema()
    }

    /// Start the run and stream its output.
    pub fn iter(self, iter: IterOptions) -> Result<BatchStream> {
        if iter.batch_size == Some(0) {
            return Err(EngineError::InvalidArgument(
                "batch_size must be at least 1".into(),
            ));
        }
        let options = self.options.clone();
        let (mut run, last) = self.start("iter_batches", 0, None)?;
        let ready_holder = run.resources.pool().consumer("iter_batches (prefetched)");
        let ready: Arc<BatchQueue<Vec<EngineBatch>>> = Arc::new(BatchQueue::new(
            ready_holder,
            iter.prefetch_batches.max(1),
            usize::MAX,
            1,
        ));
        run.resources.register_queue(ready.clone());
        let shaping_holder = run.resources.pool().consumer("iter_batches");
        let counters = run.add_counters("iter_batches");
        let (resources, ready_in, rows) =
            (run.resources.clone(), ready.clone(), run.rows_out.clone());
        run.spawn("iter_batches", move || {
            let result = shape(
                &last,
                &ready_in,
                &resources,
                &shaping_holder,
                &iter,
                &counters,
                &rows,
            );
            ready_in.sender_done();
            result
        });
        run.start_progress("iter_batches", options.progress);
        Ok(BatchStream {
            ready,
            run: Some(run),
            last_stats: None,
        })
    }

    /// Run to completion, writing Parquet files; returns what was written.
    pub fn write_parquet(self, sink: ParquetSink) -> Result<WriteStats> {
        self.start_write(sink)?.wait()
    }

    /// Start writing; the caller waits with [`RunningWrite::wait_timeout`] (to stay
    /// responsive, e.g. to Ctrl-C) or [`RunningWrite::wait`].
    pub fn start_write(self, sink: ParquetSink) -> Result<RunningWrite> {
        if let Source::Parquet(dataset) = &self.source {
            let deletes = sink.mode == crate::writer::WriteMode::Overwrite;
            check_write_locations(dataset, &sink.root, None, deletes)?;
        }
        self.start_write_inner(sink, None)
    }

    /// Write exactly once and resumably: each file commits with the ids of its rows and the
    /// inputs it finishes (see the `commit` module docs). A run started again after any
    /// interruption recovers the checkpoint, skips finished input files and row groups
    /// unread and drops rows whose id is done, right after the source.
    pub fn write_parquet_checkpointed(
        self,
        sink: ParquetSink,
        checkpoint: Checkpoint,
    ) -> Result<WriteStats> {
        self.start_write_checkpointed(sink, checkpoint)?.wait()
    }

    /// [`write_parquet_checkpointed`](Self::write_parquet_checkpointed), waited on by the
    /// caller.
    pub fn start_write_checkpointed(
        mut self,
        sink: ParquetSink,
        checkpoint: Checkpoint,
    ) -> Result<RunningWrite> {
        let Source::Parquet(dataset) = &self.source else {
            return Err(EngineError::InvalidArgument(
                "checkpointed writes read Parquet (a source with file provenance)".into(),
            ));
        };
        check_write_locations(dataset, &sink.root, Some(&checkpoint.path), false)?;
        let book = Arc::new(LineageBook::default());
        let output = crate::storage::Dir::open(&sink.root, &sink.storage_options)
            .map_err(|e| EngineError::write("write_parquet", e.path, e.reason))?;
        let prepared = CommitLog::prepare(&checkpoint, output, dataset, book.clone())?;
        let inputs = dataset.files().len();
        if inputs > 0 && prepared.report.files_done == inputs {
            if let Some(events) = &self.options.events {
                events(&PipelineEvent::Warning {
                    message: format!(
                        "the checkpoint {} records every one of the {inputs} input file(s) as \
                         finished: this job is done, and this run writes nothing (delete the \
                         checkpoint directory to run it again from the start)",
                        checkpoint.path
                    ),
                });
            }
        }
        let id_column = checkpoint.id_column.clone();
        // Finished rows are dropped inside the scan, as their ids are decoded: they go no
        // further, and the rest of their columns is never decoded.
        let resume_filter = Arc::new(ResumeFilter::new(prepared.index.clone(), &id_column));
        let dataset = prepared.dataset.with_row_filter(resume_filter.clone());
        for step in &mut self.steps {
            if let Step::Map(m) = step {
                if !m.required_columns.contains(&id_column) {
                    m.required_columns.push(id_column.clone());
                }
            }
        }
        self.source = Source::Parquet(dataset.clone());
        let commits = CheckpointRun {
            log: prepared.log.clone(),
            delete_on_success: checkpoint.delete_on_success,
            report: prepared.report,
            io_before: dataset.metrics().io,
            dataset,
            resume_filter,
        };
        let sink = sink.with_unique_column(id_column);
        self.start_write_inner(sink, Some((book, commits)))
    }

    fn start_write_inner(
        self,
        sink: ParquetSink,
        checkpoint: Option<(Arc<LineageBook>, CheckpointRun)>,
    ) -> Result<RunningWrite> {
        let (book, commits) = match checkpoint {
            Some((book, run)) => (Some(book), Some(run)),
            None => (None, None),
        };
        let target = Arc::new(OutputTarget::open(
            sink,
            commits.as_ref().map(|c| c.log.clone()),
        )?);
        let workers = target.concurrency();
        let progress = self.options.progress;
        let (mut run, last) = self.start("write_parquet", workers, book)?;
        let counters = run.add_counters("write_parquet");
        let holder = run.resources.pool().consumer("write_parquet");
        for worker in 0..workers {
            let (target, last, resources, holder, rows) = (
                target.clone(),
                last.clone(),
                run.resources.clone(),
                holder.clone(),
                run.rows_out.clone(),
            );
            let counters = counters.clone();
            run.spawn("write_parquet", move || {
                run_writer(target, worker, last, resources, holder, rows, &counters)?;
                Ok(())
            });
        }
        if let Some(c) = &commits {
            let resume_filter = c.resume_filter.clone();
            run.rows_settled_early = Some(Arc::new(move || resume_filter.rows_dropped()));
        }
        run.start_progress("write_parquet", progress);
        Ok(RunningWrite {
            run: Some(run),
            target,
            commits,
            last_stats: None,
        })
    }

    /// Start the source and the steps; returns the run and the queue after the last step.
    fn start(
        self,
        sink_name: &str,
        sink_workers: usize,
        lineage: Option<Arc<LineageBook>>,
    ) -> Result<(Run, Arc<BatchQueue>)> {
        let Pipeline {
            source,
            steps,
            options,
        } = self;
        if options.memory_limit == 0 {
            return Err(EngineError::InvalidArgument(
                "memory_limit must be positive".into(),
            ));
        }
        let pool = MemoryPool::for_process(options.memory_limit);
        let store_capacity = options.store_capacity.unwrap_or(options.memory_limit / 4);
        let resources = RunResources::new(
            pool,
            StoreSettings {
                capacity: store_capacity,
                spill_dir: options.spill_dir.clone(),
            },
            options.events.clone(),
        );
        let resources = match lineage {
            Some(book) => resources.with_lineage(book),
            None => resources,
        };
        let mut names = vec![source.name().to_string()];
        names.extend(steps.iter().map(Step::name));
        names.push(sink_name.to_string());
        resources.emit(PipelineEvent::Started {
            stages: names,
            memory_limit: options.memory_limit as u64,
        });
        let mut run = Run {
            resources,
            threads: Vec::new(),
            started: Instant::now(),
            counters: Vec::new(),
            rows_out: Arc::new(AtomicU64::new(0)),
            progress: None,
            known_rows: None,
            rows_settled_early: None,
        };
        if let Source::Parquet(d) = &source {
            let d = d.clone();
            // Exact; a checkpointed write counts the done ids it drops as settled.
            run.known_rows = Some(Box::new(move || d.rows_to_read()));
        }
        // Downstream workers, for the source's headroom.
        let downstream: usize =
            steps.iter().map(Step::workers).sum::<usize>() + sink_workers.max(1);
        let queue_bytes = (options.memory_limit / 8).max(1);
        let new_queue = |run: &Run, after: &str, senders: usize| {
            let q = Arc::new(BatchQueue::new(
                run.resources
                    .pool()
                    .consumer(format!("queue after {after}")),
                options.queue_batches,
                queue_bytes,
                senders,
            ));
            run.resources.register_queue(q.clone());
            q
        };
        let source_name = source.name().to_string();
        let mut queue = new_queue(&run, &source_name, 1);
        let counters = run.add_counters(&source_name);
        {
            let (q, resources) = (queue.clone(), run.resources.clone());
            run.spawn(&source_name, move || {
                let r = run_source(source, q.clone(), resources, counters, downstream);
                q.sender_done();
                r
            });
        }
        let reorder_budget = options.memory_limit / 8;
        for step in steps {
            let name = step.name();
            let next = new_queue(&run, &name, step.workers());
            let counters = run.add_counters(&name);
            match step {
                Step::Map(stage) => {
                    let threads = spawn_stage(
                        stage,
                        queue.clone(),
                        next.clone(),
                        run.resources.clone(),
                        counters,
                        options.preserve_order,
                        reorder_budget,
                    );
                    run.threads.extend(threads);
                }
                Step::Limit(rows) => {
                    let (input, output, resources) =
                        (queue.clone(), next.clone(), run.resources.clone());
                    run.spawn(&name, move || {
                        let r = limit(rows, &input, &output, &resources, &counters);
                        output.sender_done();
                        r
                    });
                }
            }
            queue = next;
        }
        Ok((run, queue))
    }
}

/// Pass `rows` rows through, then stop upstream.
fn limit(
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
fn shape(
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

/// The threads and shared state of a run.
struct Run {
    resources: RunResources,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
    counters: Vec<(String, Arc<StageCounters>)>,
    /// Rows delivered by the sink (progress, final statistics).
    rows_out: Arc<AtomicU64>,
    progress: Option<Progress>,
    known_rows: Option<Box<dyn FnOnce() -> Option<u64> + Send>>,
    /// Rows of the known total that end without reaching the sink (done ids a checkpointed
    /// write drops while reading), so that the bar still ends at its total.
    rows_settled_early: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
}

impl Run {
    fn add_counters(&mut self, name: &str) -> Arc<StageCounters> {
        let c = Arc::new(StageCounters::default());
        self.counters.push((name.to_string(), c.clone()));
        c
    }

    /// Run `body` on a thread; its error (or panic) fails the run.
    fn spawn(&mut self, name: &str, body: impl FnOnce() -> Result<()> + Send + 'static) {
        let resources = self.resources.clone();
        let label = name.to_string();
        let handle = std::thread::Builder::new()
            .name(format!("forebay-{name}"))
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

    fn start_progress(&mut self, label: &str, enabled: bool) {
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

    fn cancel(&self) {
        self.resources.cancel();
    }

    fn is_finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }

    /// Wait for every thread; the run's error (if any) and its statistics.
    fn finish(mut self) -> (Option<EngineError>, RunStats) {
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

    fn stats(&self) -> RunStats {
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

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// The output of a running pipeline, batch by batch. Dropping it stops the run.
pub struct BatchStream {
    ready: Arc<BatchQueue<Vec<EngineBatch>>>,
    run: Option<Run>,
    last_stats: Option<RunStats>,
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
fn free_in_background<T: Send + 'static>(value: T) {
    let _ = std::thread::Builder::new()
        .name("forebay-free".into())
        .spawn(move || drop(value));
}

/// What a checkpointed write keeps for its end.
struct CheckpointRun {
    log: Arc<CommitLog>,
    delete_on_success: bool,
    report: ResumeReport,
    dataset: forebay_parquet::ParquetDataset,
    /// The dataset's I/O counters when the run started (they count every scan of it).
    io_before: forebay_parquet::IoMetricsSnapshot,
    resume_filter: Arc<ResumeFilter>,
}

/// A write in progress.
pub struct RunningWrite {
    run: Option<Run>,
    target: Arc<OutputTarget>,
    commits: Option<CheckpointRun>,
    last_stats: Option<RunStats>,
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
        let finished = self
            .commits
            .as_ref()
            .map(|c| c.log.finish(c.delete_on_success));
        if let Some(Err(e)) = finished {
            self.release_checkpoint();
            return Err(e);
        }
        if let Some(c) = &self.commits {
            let m = c.dataset.metrics();
            written.resume = Some(ResumeStats {
                report: c.report.clone(),
                rows_skipped_by_id: c.resume_filter.rows_dropped(),
                files_skipped: m.files_skipped,
                row_groups_skipped: m.row_groups_skipped,
                bytes_read: (m.io.data_bytes + m.io.footer_bytes)
                    - (c.io_before.data_bytes + c.io_before.footer_bytes),
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
            log,
            dataset,
            resume_filter,
            ..
        }) = self.commits.take()
        {
            log.release();
            drop(log);
            free_in_background((dataset, resume_filter));
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
