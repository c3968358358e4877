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
//!
//! | module   | what                                                                    |
//! |----------|-------------------------------------------------------------------------|
//! | this one | [`Pipeline`]: the steps, the options, starting a run                      |
//! | `steps`  | the steps the pipeline runs itself: `limit`, `iter_batches`' shaping     |
//! | `run`    | a run's threads, first error, progress and statistics                     |
//! | `stream` | [`BatchStream`]: what `iter` returns                                      |
//! | `write`  | [`RunningWrite`]: what `start_write` returns                              |

mod run;
mod steps;
mod stream;
mod write;

pub use stream::{BatchStream, Poll};
pub use write::RunningWrite;

use run::Run;
use steps::{limit, resume_limits, shape};
use write::{CheckpointRun, DoneFilter};

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use arrow_schema::SchemaRef;

use crate::commit::{Checkpoint, CommitLog, DoneRows, StepFingerprint};
use crate::error::{EngineError, Result};
use crate::events::{EventSink, PipelineEvent};
use crate::lineage::LineageBook;
use crate::locations::check_write_locations;
use crate::memory::MemoryPool;
use crate::positions::RunPositions;
use crate::queue::BatchQueue;
use crate::rechunk::Chunks;
use crate::resources::{RunResources, StoreSettings};
use crate::resume_filter::ResumeFilter;
use crate::source::{run_source, Source};
use crate::stage::{spawn_stage, MapStage};
use crate::stats::WriteStats;
use crate::writer::{run_writer, OutputTarget, ParquetSink};

/// Whether a stage writes dead letters (see `dead_letter`); only the first map of a write
/// may.
fn check_dead_letters(steps: &[Step], sink_name: &str) -> Result<bool> {
    let mut maps = steps.iter().filter_map(|s| match s {
        Step::Map(stage) => Some(stage),
        Step::Limit(_) => None,
    });
    let first = maps.next();
    if let Some(later) = maps.find(|s| s.dead_letter) {
        return Err(EngineError::InvalidArgument(format!(
            "stage '{}' sets rows aside to a dead-letter dataset, which only the first map \
             step can do (after a map, rows no longer say which input row they were); use \
             on_error='skip' there, or move the step first",
            later.name
        )));
    }
    let wanted = first.is_some_and(|s| s.dead_letter);
    if wanted && sink_name == "iter_batches" {
        return Err(EngineError::InvalidArgument(format!(
            "stage '{}' sets rows aside to a dead-letter dataset, which is written beside the \
             output of write_parquet; iter_batches has none (use on_error='skip': stats() \
             lists the rows)",
            first.map_or("", |s| s.name.as_str())
        )));
    }
    Ok(wanted)
}

/// The fewest rows the limits before the first map let through (None: no such limit).
fn leading_limit(steps: &[Step]) -> Option<u64> {
    steps
        .iter()
        .map_while(|step| match step {
            Step::Limit(rows) => Some(*rows),
            Step::Map(_) => None,
        })
        .min()
}

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
    /// Count the process's memory beyond the pool's books against the limit, and ask the
    /// allocator for its free pages (`malloc_trim`) when that memory holds the source back
    /// (see `process_memory`). For a process the run owns (forebay's Python package turns
    /// it on); off by default, since in a host engine's process it would count the host's
    /// memory and trim the host's heap.
    pub process_memory: bool,
    /// A host engine's memory pool that the run's charges are also held in, and whose room
    /// the source waits for (see [`MemoryPool::with_host`]).
    pub host_memory: Option<Arc<dyn forebay_io::memory::MemoryPool>>,
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
            process_memory: false,
            host_memory: None,
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
            .field("process_memory", &self.process_memory)
            .field("host_memory", &self.host_memory)
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
///
/// ```no_run
/// use forebay_engine::{Checkpoint, MapStage, ParquetSink, Pipeline, Source};
/// use forebay_parquet::{DatasetSource, ParquetDataset};
///
/// let input = ParquetDataset::builder(DatasetSource::uris(["s3://bucket/docs/"]))
///     .with_columns(["id", "text"])
///     .build()?;
/// // Killed at any moment and run again: skips what was committed, writes nothing twice.
/// let stats = Pipeline::new(Source::Parquet(input))
///     .with_memory_limit(2 << 30)
///     .map(MapStage::rust("embed", |batch| Ok(batch)).with_concurrency(4))
///     .write_parquet_checkpointed(
///         ParquetSink::new("s3://bucket/embeddings/"),
///         Checkpoint::new("id", "s3://bucket/embeddings/_checkpoint"),
///     )?;
/// println!("{} rows, {} files", stats.rows, stats.files.len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
    /// Batches ready ahead of the caller. The batches cut from one input batch (zero-copy
    /// slices of memory already held) are made ready together, however many they are.
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

    /// See [`PipelineOptions::process_memory`].
    pub fn with_process_memory(mut self, count: bool) -> Pipeline {
        self.options.process_memory = count;
        self
    }

    /// See [`PipelineOptions::host_memory`].
    pub fn with_host_memory_pool(
        mut self,
        pool: Arc<dyn forebay_io::memory::MemoryPool>,
    ) -> Pipeline {
        self.options.host_memory = Some(pool);
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
        let (mut run, last) = self.start("iter_batches", 0, None, None)?;
        let ready_holder = run.resources.pool().consumer("iter_batches (prefetched)");
        let ready: Arc<BatchQueue<Chunks>> = Arc::new(BatchQueue::new(
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
            rest_of_run: None,
            handed_run: None,
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
            check_write_locations(dataset, sink.root(), None, deletes)?;
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
        // In a checkpointed run each batch the writer gets must hold what whole input
        // batches became (see `positions`): a limit after a map would cut one.
        let mut mapped = false;
        for step in &self.steps {
            match step {
                Step::Map(_) => mapped = true,
                Step::Limit(_) if mapped => {
                    return Err(EngineError::InvalidArgument(
                        "a checkpointed write cannot limit rows after a map: it records \
                         which input rows each output file holds, and a limit there would \
                         cut a map's output; put limit() before map_batches()"
                            .into(),
                    ))
                }
                Step::Limit(_) => {}
            }
        }
        check_write_locations(dataset, sink.root(), Some(checkpoint.path()), false)?;
        let mut checkpoint = checkpoint;
        checkpoint.transform = self
            .steps
            .iter()
            .filter_map(|step| match step {
                Step::Map(m) => Some(m),
                Step::Limit(_) => None,
            })
            .enumerate()
            .filter_map(|(step, m)| {
                Some(StepFingerprint {
                    step,
                    name: m.name.clone(),
                    fingerprint: m.fingerprint.clone()?,
                })
            })
            .collect();
        let book = Arc::new(LineageBook::default());
        let output = sink.open_dir()?;
        let prepared = CommitLog::prepare(&checkpoint, output, dataset, book.clone())?;
        let inputs = dataset.files().len();
        if inputs > 0 && prepared.report.files_done == inputs {
            if let Some(events) = &self.options.events {
                events(&PipelineEvent::Warning {
                    message: format!(
                        "the checkpoint {} records every one of the {inputs} input file(s) as \
                         finished: this job is done, and this run writes nothing (delete the \
                         checkpoint directory to run it again from the start)",
                        checkpoint.path()
                    ),
                });
            }
        }
        let used_up = resume_limits(
            &mut self.steps,
            prepared.report.input_rows_done,
            checkpoint.path(),
        )?;
        if let (Some(message), Some(events)) = (used_up, &self.options.events) {
            events(&PipelineEvent::Warning { message });
        }
        let id_column = checkpoint.id_column.clone();
        let (dataset, done) = match prepared.done {
            // Done rows are dropped by the source, by position (see `positions`).
            DoneRows::Positions(consumed) => {
                (prepared.dataset.clone(), DoneFilter::Positions(consumed))
            }
            // Done rows are dropped inside the scan, as their ids are decoded: they go no
            // further, and the rest of their columns is never decoded.
            DoneRows::Ids(index) => {
                let id_column = id_column
                    .as_deref()
                    .expect("rows known by id have an id column");
                let filter = Arc::new(ResumeFilter::new(index, id_column));
                (
                    prepared.dataset.with_row_filter(filter.clone()),
                    DoneFilter::Ids(filter),
                )
            }
        };
        let mut maps = 0;
        for step in &mut self.steps {
            if let Step::Map(m) = step {
                if let Some(id_column) = &id_column {
                    if !m.required_columns.contains(id_column) {
                        m.required_columns.push(id_column.clone());
                    }
                }
                // Its input is a map's output: merged whole, never split.
                m.whole_input_batches = maps > 0;
                maps += 1;
            }
        }
        self.source = Source::Parquet(dataset.clone());
        let commits = CheckpointRun {
            log: prepared.log.clone(),
            delete_on_success: checkpoint.delete_on_success,
            report: prepared.report,
            dataset,
            done,
        };
        let sink = match id_column {
            Some(id_column) => sink.with_unique_column(id_column),
            None => sink,
        };
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
        let positions = commits.as_ref().and_then(|c| c.done.positions());
        let (mut run, last) = self.start("write_parquet", workers, book, positions)?;
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
            let done = c.done.clone();
            run.rows_settled_early = Some(Arc::new(move || done.rows_dropped()));
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
        positions: Option<Arc<RunPositions>>,
    ) -> Result<(Run, Arc<BatchQueue>)> {
        let Pipeline {
            source,
            steps,
            options,
        } = self;
        // A limit before any map bounds the rows the scan must yield: pushed into it, the
        // scan neither starts nor fetches ahead row groups past them (a `take(5)` of a
        // dataset on an object store fetches a row group, not the 32+ a scan fetches ahead).
        // Not in checkpointed runs: they drop rows (done ids, done positions) between the
        // scan and the limit, which must count the rows it gets.
        let source = match (source, lineage.is_none() && positions.is_none()) {
            (Source::Parquet(dataset), true) => match leading_limit(&steps) {
                Some(rows) => Source::Parquet(dataset.with_limit(rows)),
                None => Source::Parquet(dataset),
            },
            (source, _) => source,
        };
        if options.memory_limit == 0 {
            return Err(EngineError::InvalidArgument(
                "memory_limit must be positive".into(),
            ));
        }
        let pool = if options.process_memory {
            MemoryPool::for_process(options.memory_limit)
        } else {
            MemoryPool::new(options.memory_limit)
        };
        let pool = match &options.host_memory {
            Some(host) => pool.with_host(host.clone(), "forebay pipeline"),
            None => pool,
        };
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
        let resources = match positions {
            Some(positions) => resources.with_positions(positions),
            None => resources,
        };
        let resources = match check_dead_letters(&steps, sink_name)? {
            true => resources.with_dead_letters(),
            false => resources,
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
        // Until the first map, batches hold the scan's rows in order.
        let mut rows_are_input_rows = true;
        for step in steps {
            let name = step.name();
            let next = new_queue(&run, &name, step.workers());
            let counters = run.add_counters(&name);
            match step {
                Step::Map(mut stage) => {
                    stage.rows_are_input_rows = rows_are_input_rows;
                    rows_are_input_rows = false;
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
