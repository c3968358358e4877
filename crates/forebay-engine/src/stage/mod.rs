//! Map stages: a function applied to every batch by `concurrency` workers.
//!
//! ```text
//!  input queue ──► dispatcher ──(re-chunk to batch_size)──► task 0, 1, 2 ...
//!                      │ (preserve_order: no task more than `window` ahead of the next to emit)
//!                      ▼
//!          worker 0 … worker N-1   each: its own MapWorker (a closure, a Python object on a
//!                      │           thread, a worker process), call(batch) -> batches
//!                      ▼
//!          unordered: push as finished ─┐
//!          ordered: ReorderBuffer ──────┴──► output queue
//! ```
//!
//! A worker is charged for the batch it works on; its outputs are reserved before its input
//! is released, so the pool never undercounts a batch in hand.
//!
//! A task is a few consecutive chunks of one input batch (at most its share of them: see
//! `group_chunks`), so that with small batch sizes the threads wake once per task, not once
//! per call.
//!
//! A worker with a [`PrepareNext`] (Python functions: the batch → pyarrow → batch format
//! conversion) gets its tasks through a second thread of its own, which takes the next task
//! as soon as the dispatcher has it, prepares its first batch while the worker still calls
//! on the current task, hands it over, then prepares each of its other batches while the
//! worker calls on the one before: the conversion overlaps the function instead of delaying
//! its next call. Such a worker holds at most two tasks, both charged to the stage.

mod in_flight;
mod outputs;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use forebay_checkpoint::SharedCheckpointIndex;
use forebay_store::ObjectStore;

use self::outputs::outputs_of_call;
use crate::batch::EngineBatch;
use crate::error::{BatchLabel, EngineError, Result, UserError};
use crate::events::PipelineEvent;
use crate::memory::{CancelToken, MemoryConsumer};
use crate::queue::BatchQueue;
use crate::rechunk::Rechunker;
use crate::reorder::ReorderBuffer;
use crate::resources::RunResources;
use crate::stats::StageCounters;

/// How a worker failed on a batch; the stage adds its name and the batch's label.
#[derive(Debug)]
pub enum StageFailure {
    /// The user's function raised (the original error).
    User(UserError),
    /// The function returned something unusable.
    BadOutput(String),
    /// The worker process died on this batch.
    WorkerDied {
        pid: u32,
        how: String,
        retries: String,
    },
    /// Anything else (store, checkpoint, cancellation).
    Engine(EngineError),
}

impl From<EngineError> for StageFailure {
    fn from(e: EngineError) -> Self {
        StageFailure::Engine(e)
    }
}

impl StageFailure {
    fn into_error(self, stage: &str, batch: BatchLabel) -> EngineError {
        match self {
            StageFailure::User(error) => EngineError::UserFunction {
                stage: stage.to_string(),
                batch,
                error,
            },
            StageFailure::BadOutput(reason) => EngineError::BadOutput {
                stage: stage.to_string(),
                batch,
                reason,
            },
            StageFailure::WorkerDied { pid, how, retries } => EngineError::WorkerDied {
                stage: stage.to_string(),
                batch,
                pid,
                how,
                retries,
            },
            StageFailure::Engine(e) => e,
        }
    }
}

/// What a worker may use of its run.
pub struct WorkerContext<'a> {
    /// The stage's name.
    pub stage: &'a str,
    /// The worker's position among the stage's workers.
    pub index: usize,
    pub(crate) resources: &'a RunResources,
}

impl WorkerContext<'_> {
    /// Set when the run stops; long calls should check it.
    pub fn cancel_token(&self) -> &CancelToken {
        self.resources.cancel_token()
    }

    /// The run's object store (created on first use, its capacity charged to the pool).
    pub fn store(&self) -> Result<Arc<ObjectStore>> {
        self.resources.store(self.stage)
    }

    /// Report an event (a worker started, died, ...).
    pub fn emit(&self, event: PipelineEvent) {
        self.resources.emit(event)
    }
}

/// A function a stage applies to batches. `start_worker` is called once per worker, on the
/// worker's own thread, before its first batch (construct per-worker state there: a model,
/// a Python object, a process).
pub trait MapFn: Send + Sync + 'static {
    fn start_worker(
        &self,
        ctx: &WorkerContext<'_>,
    ) -> std::result::Result<Box<dyn MapWorker>, StageFailure>;
}

/// One worker's state; `call` maps one batch to zero or more batches.
pub trait MapWorker: Send {
    fn call(
        &mut self,
        batch: RecordBatch,
        ctx: &WorkerContext<'_>,
    ) -> std::result::Result<Vec<RecordBatch>, StageFailure>;

    /// A preparer for this worker's next batch (asked once, after `start_worker`). With one,
    /// the engine receives the worker's tasks on a second thread, which calls
    /// [`PrepareNext::prepare`] on each batch before handing it to the worker: while the
    /// worker calls on batch k, batch k+1 is being prepared (turned into a Python object, ...).
    /// The worker then holds two batches, the one in its call and the next.
    fn next_batch_preparer(&mut self) -> Option<Box<dyn PrepareNext>> {
        None
    }

    /// Calls this worker runs at once. 1 (the default): the stage calls [`call`](Self::call)
    /// on one batch after another. More (an event loop of async calls to a model server):
    /// the stage hands it batches with [`submit`](Self::submit) while fewer are running and
    /// collects what finished with [`completed`](Self::completed); `call` is then unused.
    fn in_flight(&self) -> usize {
        1
    }

    /// Start call `call` on `batch` (see [`in_flight`](Self::in_flight)).
    fn submit(
        &mut self,
        call: u64,
        batch: RecordBatch,
        ctx: &WorkerContext<'_>,
    ) -> std::result::Result<(), StageFailure> {
        let _ = (call, batch, ctx);
        Err(StageFailure::BadOutput(
            "this worker runs one call at a time (in_flight is 1)".into(),
        ))
    }

    /// Calls that finished, waiting up to `timeout` for the first: each call's id with its
    /// outputs or its failure (see [`in_flight`](Self::in_flight)). An `Err` fails the run.
    #[allow(clippy::type_complexity)]
    fn completed(
        &mut self,
        timeout: Duration,
        ctx: &WorkerContext<'_>,
    ) -> std::result::Result<
        Vec<(u64, std::result::Result<Vec<RecordBatch>, StageFailure>)>,
        StageFailure,
    > {
        let _ = (timeout, ctx);
        Ok(Vec::new())
    }

    /// The stage is done with this worker (stop a process, release a model).
    fn close(&mut self) {}
}

/// Prepares a worker's batches one ahead, on a thread of its own (see
/// [`MapWorker::next_batch_preparer`]).
pub trait PrepareNext: Send {
    /// Prepare `next`, the batch the worker's next `call` will receive (the worker may still
    /// be calling on the one before). Return early once `worker_done` is set: the worker has
    /// left (the run ended or failed). A panic here turns preparing off for the worker; its
    /// batches still reach it, unprepared.
    fn prepare(&mut self, next: &RecordBatch, worker_done: &CancelToken);
}

/// A Rust closure as a [`MapFn`]; every worker shares it.
struct RustFn<F>(Arc<F>);

impl<F> MapFn for RustFn<F>
where
    F: Fn(RecordBatch) -> std::result::Result<RecordBatch, UserError> + Send + Sync + 'static,
{
    fn start_worker(
        &self,
        _: &WorkerContext<'_>,
    ) -> std::result::Result<Box<dyn MapWorker>, StageFailure> {
        Ok(Box::new(RustFn(self.0.clone())))
    }
}

impl<F> MapWorker for RustFn<F>
where
    F: Fn(RecordBatch) -> std::result::Result<RecordBatch, UserError> + Send + Sync + 'static,
{
    fn call(
        &mut self,
        batch: RecordBatch,
        _: &WorkerContext<'_>,
    ) -> std::result::Result<Vec<RecordBatch>, StageFailure> {
        (self.0)(batch).map(|b| vec![b]).map_err(StageFailure::User)
    }
}

/// Drops rows whose id a checkpoint index holds (the resume filter).
struct CheckpointFilterFn(SharedCheckpointIndex);

impl MapFn for CheckpointFilterFn {
    fn start_worker(
        &self,
        _: &WorkerContext<'_>,
    ) -> std::result::Result<Box<dyn MapWorker>, StageFailure> {
        Ok(Box::new(CheckpointFilterFn(self.0.clone())))
    }
}

impl MapWorker for CheckpointFilterFn {
    fn call(
        &mut self,
        batch: RecordBatch,
        ctx: &WorkerContext<'_>,
    ) -> std::result::Result<Vec<RecordBatch>, StageFailure> {
        let index = self.0.read().map_err(|_| {
            StageFailure::BadOutput("the checkpoint index was poisoned by an earlier panic".into())
        })?;
        let out = index
            .filter_or_unchanged(&batch)
            .map_err(|e| EngineError::Checkpoint {
                stage: ctx.stage.to_string(),
                source: Box::new(e),
            })?;
        Ok(vec![out.unwrap_or(batch)])
    }
}

/// A map stage: a function, how many workers run it, and the batch size it sees.
#[derive(Clone)]
pub struct MapStage {
    pub(crate) name: String,
    pub(crate) function: Arc<dyn MapFn>,
    pub(crate) concurrency: usize,
    pub(crate) batch_size: Option<usize>,
    pub(crate) required_columns: Vec<String>,
    /// Re-chunk to `batch_size` by merging whole input batches, never splitting one (set
    /// by a checkpointed write on the maps after its first; see `positions`).
    pub(crate) whole_input_batches: bool,
    /// Rows the function may fail on (see `errored`) before the run fails; None: any number.
    pub(crate) max_errored_rows: Option<u64>,
    /// Its errored rows go to a dead-letter dataset beside the output (see `dead_letter`).
    pub(crate) dead_letter: bool,
    /// Its input rows are the source's, in order (no map before it): an errored row's index
    /// finds its row in the input file. Set by the pipeline as it starts the stage.
    pub(crate) rows_are_input_rows: bool,
    /// What identifies the function's transform (a model and its version, a prompt's
    /// hash): a checkpoint records it and refuses a rerun whose is another.
    pub(crate) fingerprint: Option<String>,
}

impl MapStage {
    /// A stage named `name` (shown in errors, statistics and the progress bar).
    pub fn new(name: impl Into<String>, function: impl MapFn) -> MapStage {
        MapStage {
            name: name.into(),
            function: Arc::new(function),
            concurrency: 1,
            batch_size: None,
            required_columns: Vec::new(),
            whole_input_batches: false,
            max_errored_rows: None,
            dead_letter: false,
            rows_are_input_rows: false,
            fingerprint: None,
        }
    }

    /// A stage that applies a Rust closure to each batch.
    pub fn rust<F>(name: impl Into<String>, f: F) -> MapStage
    where
        F: Fn(RecordBatch) -> std::result::Result<RecordBatch, UserError> + Send + Sync + 'static,
    {
        MapStage::new(name, RustFn(Arc::new(f)))
    }

    /// A stage that drops rows a checkpoint already holds (by its id column).
    pub fn checkpoint_filter(index: SharedCheckpointIndex) -> MapStage {
        MapStage::new("checkpoint_filter", CheckpointFilterFn(index))
    }

    /// Workers running the function at once (default 1).
    /// Say what identifies this step's transform (a model name and version, a prompt
    /// template's hash, its parameters). A checkpointed write records the fingerprints of
    /// its steps; a rerun with another one at any step is refused before it reads anything
    /// (the checkpoint's rows came from the old transform), unless nothing was committed.
    pub fn with_fingerprint(mut self, fingerprint: impl Into<String>) -> MapStage {
        self.fingerprint = Some(fingerprint.into());
        self
    }

    pub fn with_concurrency(mut self, workers: usize) -> MapStage {
        self.concurrency = workers.max(1);
        self
    }

    /// Rows per call: input is re-chunked to exactly this many rows (the last call of the
    /// run may get fewer). Default: batches as they arrive.
    pub fn with_batch_size(mut self, rows: usize) -> MapStage {
        self.batch_size = Some(rows);
        self
    }

    /// Columns every output batch must have (an error names the stage otherwise).
    pub fn with_required_columns<I, S>(mut self, columns: I) -> MapStage
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.required_columns = columns.into_iter().map(Into::into).collect();
        self
    }

    /// Rows the function may fail on before the run fails (default: any number). A worker
    /// that sets failing rows aside returns them as an errored-rows batch (see
    /// [`errored_rows_batch`](crate::errored_rows_batch)); without one, the first error
    /// fails the run.
    pub fn with_max_errored_rows(mut self, rows: u64) -> MapStage {
        self.max_errored_rows = Some(rows);
        self
    }

    /// Write the rows the function fails on (its errored rows) to a dead-letter dataset,
    /// `_dead_letter/<stage>/` in the output directory, committed with the output (see
    /// `dead_letter`). Only for the first map stage of a write.
    pub fn with_dead_letter(mut self) -> MapStage {
        self.dead_letter = true;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The parts of a running stage its threads share.
struct Running {
    stage: MapStage,
    input: Arc<BatchQueue>,
    output: Arc<BatchQueue>,
    resources: RunResources,
    holder: MemoryConsumer,
    counters: Arc<StageCounters>,
    /// `Some` when order is preserved; the condvar wakes the dispatcher's window wait.
    reorder: Option<(Mutex<ReorderBuffer>, Condvar)>,
    out_seq: AtomicU64,
    window: u64,
}

/// Consecutive chunks of the input for one worker: one hand-over (and one wake-up of each
/// thread on the way) for several calls. A task takes at most its share of the chunks one
/// input batch makes (see [`group_chunks`]), so every worker still gets some of them.
/// Before grouping, an identity function on 1,000-row batches cost ~90 µs of CPU a call
/// beyond the function, about a third of it threads waking each other.
struct Task {
    index: u64,
    batches: Vec<EngineBatch>,
}

/// `chunks` (made from one input batch) in groups of `ceil(len / workers)`, in order.
fn group_chunks(chunks: Vec<EngineBatch>, workers: usize) -> Vec<Vec<EngineBatch>> {
    let per_task = chunks.len().div_ceil(workers.max(1)).max(1);
    let mut groups = Vec::with_capacity(chunks.len().div_ceil(per_task));
    let mut chunks = chunks.into_iter().peekable();
    while chunks.peek().is_some() {
        groups.push(chunks.by_ref().take(per_task).collect());
    }
    groups
}

/// Start a stage's threads: one dispatcher and `concurrency` workers.
pub(crate) fn spawn_stage(
    stage: MapStage,
    input: Arc<BatchQueue>,
    output: Arc<BatchQueue>,
    resources: RunResources,
    counters: Arc<StageCounters>,
    preserve_order: bool,
    reorder_budget: usize,
) -> Vec<JoinHandle<()>> {
    let holder = resources.pool().consumer(stage.name.clone());
    let reorder = preserve_order.then(|| {
        let held = resources
            .pool()
            .consumer(format!("{} (reorder buffer)", stage.name));
        (
            Mutex::new(ReorderBuffer::new(
                &stage.name,
                reorder_budget,
                held,
                resources.clone(),
            )),
            Condvar::new(),
        )
    });
    let window = (stage.concurrency as u64 * 4).max(8);
    let running = Arc::new(Running {
        stage,
        input,
        output,
        resources,
        holder,
        counters,
        reorder,
        out_seq: AtomicU64::new(0),
        window,
    });
    let (task_tx, task_rx) = crossbeam_channel::bounded::<Task>(0);
    let mut threads = Vec::new();
    let r = running.clone();
    threads.push(
        std::thread::Builder::new()
            .name(forebay_io::threads::thread_name(&format!(
                "{}-dispatch",
                r.stage.name
            )))
            .spawn(move || {
                if let Err(e) = dispatch(&r, task_tx) {
                    r.resources.fail(e);
                }
            })
            .expect("cannot start a thread"),
    );
    for index in 0..running.stage.concurrency {
        let r = running.clone();
        let rx = task_rx.clone();
        threads.push(
            std::thread::Builder::new()
                .name(forebay_io::threads::thread_name(&format!(
                    "{}-{index}",
                    r.stage.name
                )))
                .spawn(move || {
                    if let Err(e) = work(&r, index, rx) {
                        r.resources.fail(e);
                    }
                    r.output.sender_done();
                })
                .expect("cannot start a thread"),
        );
    }
    threads
}

fn dispatch(r: &Running, tasks: crossbeam_channel::Sender<Task>) -> Result<()> {
    let cancel = r.resources.cancel_token();
    let mut rechunker = r
        .stage
        .batch_size
        .map(|n| Rechunker::new(&r.stage.name, n, r.holder.clone()));
    let mut next_index = 0u64;
    let send = |index: &mut u64, batches: Vec<EngineBatch>| -> Result<bool> {
        if let Some((reorder, turned)) = &r.reorder {
            let mut state = reorder.lock().unwrap_or_else(|p| p.into_inner());
            while *index >= state.next_index() + r.window {
                cancel.check()?;
                state = turned
                    .wait_timeout(state, Duration::from_millis(50))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        for batch in &batches {
            batch.move_to(&r.holder);
        }
        let mut task = Task {
            index: *index,
            batches,
        };
        loop {
            cancel.check()?;
            match tasks.send_timeout(task, Duration::from_millis(50)) {
                Ok(()) => break,
                Err(crossbeam_channel::SendTimeoutError::Timeout(t)) => task = t,
                Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => return Ok(false),
            }
        }
        *index += 1;
        Ok(true)
    };
    while let Some(batch) = r.input.pop(cancel)? {
        r.counters.record_in(batch.batch.num_rows());
        let chunks = match rechunker.as_mut() {
            Some(rc) if r.stage.whole_input_batches => rc.push_whole(batch)?,
            Some(rc) => rc.push(batch)?,
            None => vec![batch],
        };
        for group in group_chunks(chunks, r.stage.concurrency) {
            if !send(&mut next_index, group)? {
                r.input.close_receiver();
                return Ok(());
            }
        }
    }
    if let Some(rest) = rechunker
        .as_mut()
        .map(|rc| rc.finish())
        .transpose()?
        .flatten()
    {
        send(&mut next_index, vec![rest])?;
    }
    Ok(())
}

fn work(r: &Running, index: usize, tasks: crossbeam_channel::Receiver<Task>) -> Result<()> {
    let ctx = WorkerContext {
        stage: &r.stage.name,
        index,
        resources: &r.resources,
    };
    let mut worker = r.stage.function.start_worker(&ctx).map_err(|f| {
        f.into_error(
            &r.stage.name,
            BatchLabel(format!("worker {index} start-up (before its first batch)")),
        )
    })?;
    let preparer = match worker.in_flight() {
        1 => worker.next_batch_preparer(),
        _ => None,
    };
    let result = match preparer {
        None if worker.in_flight() > 1 => in_flight::serve_in_flight(r, &ctx, &mut *worker, tasks),
        None => serve(r, &ctx, &mut *worker, tasks),
        Some(preparer) => {
            let worker_done = CancelToken::new();
            let (handoff, prepared_tasks) = crossbeam_channel::bounded::<Task>(0);
            std::thread::scope(|scope| {
                let fetcher = std::thread::Builder::new()
                    .name(forebay_io::threads::thread_name(&format!(
                        "{}-{index}-next",
                        r.stage.name
                    )))
                    .spawn_scoped(scope, || {
                        fetch_ahead(r, tasks, preparer, handoff, &worker_done)
                    });
                let result = match fetcher {
                    Ok(_) => serve(r, &ctx, &mut *worker, prepared_tasks),
                    Err(e) => Err(EngineError::Worker {
                        stage: r.stage.name.clone(),
                        reason: format!("cannot start the thread preparing its batches: {e}"),
                    }),
                };
                worker_done.cancel();
                result
            })
        }
    };
    worker.close();
    result
}

/// Receive a worker's tasks ahead of it: prepare a task's first batch, hand the task over,
/// then prepare its other batches one ahead of the worker's calls (each preparation waits
/// until the call before it has started; see [`PrepareNext`]). The worker holds its current
/// task and at most this one more.
fn fetch_ahead(
    r: &Running,
    tasks: crossbeam_channel::Receiver<Task>,
    mut preparer: Box<dyn PrepareNext>,
    handoff: crossbeam_channel::Sender<Task>,
    worker_done: &CancelToken,
) {
    let cancel = r.resources.cancel_token();
    let stopped = || cancel.is_cancelled() || worker_done.is_cancelled();
    let mut preparing = true;
    let mut prepare = |batch: &RecordBatch| {
        if preparing {
            let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                preparer.prepare(batch, worker_done)
            }));
            preparing = prepared.is_ok();
        }
    };
    loop {
        let mut task = match tasks.recv_timeout(Duration::from_millis(50)) {
            Ok(task) => task,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) if !stopped() => continue,
            // Dropping `handoff` ends the worker's loop once it has taken every task.
            Err(_) => return,
        };
        // The same arrays as the task's (no copy), kept only until prepared.
        let mut batches = task.batches.iter().map(|b| b.batch.clone());
        let first = batches.next();
        let rest: Vec<RecordBatch> = batches.collect();
        if let Some(first) = first {
            prepare(&first);
        }
        loop {
            match handoff.send_timeout(task, Duration::from_millis(50)) {
                Ok(()) => break,
                Err(crossbeam_channel::SendTimeoutError::Timeout(t)) if !stopped() => task = t,
                Err(_) => return,
            }
        }
        for batch in &rest {
            if stopped() {
                return;
            }
            prepare(batch);
        }
    }
}

/// A worker's loop: call on each task's batch, hand the outputs on.
fn serve(
    r: &Running,
    ctx: &WorkerContext<'_>,
    worker: &mut dyn MapWorker,
    tasks: crossbeam_channel::Receiver<Task>,
) -> Result<()> {
    let cancel = r.resources.cancel_token();
    loop {
        let task = match tasks.recv_timeout(Duration::from_millis(50)) {
            Ok(task) => task,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                cancel.check()?;
                continue;
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                // The end of the input, or the run stopped (its error is the run's).
                return cancel.check();
            }
        };
        let mut reserved = Vec::new();
        for mut input in task.batches {
            cancel.check()?;
            let started = Instant::now();
            let outputs = worker
                .call(input.batch.clone(), ctx)
                .map_err(|f| f.into_error(&r.stage.name, input.label()))?;
            r.counters.record_busy(started.elapsed());
            reserved.extend(outputs_of_call(r, &mut input, outputs)?);
            drop(input);
        }
        emit(r, task.index, reserved)?;
    }
}

/// Number `outputs` and push them into the output queue together; `Ok(false)`: the
/// consumer side closed.
fn push_outputs(r: &Running, mut outputs: Vec<EngineBatch>) -> Result<bool> {
    for b in &mut outputs {
        b.seq = r.out_seq.fetch_add(1, Ordering::Relaxed);
    }
    let rows: Vec<usize> = outputs.iter().map(|b| b.batch.num_rows()).collect();
    let pushed = r.output.push_all(outputs, r.resources.cancel_token())?;
    if pushed {
        rows.into_iter().for_each(|n| r.counters.record_out(n));
    }
    Ok(pushed)
}

/// Hand a task's outputs downstream (in task order when order is preserved).
fn emit(r: &Running, index: u64, outputs: Vec<EngineBatch>) -> Result<()> {
    match &r.reorder {
        None => {
            // One hand-over for the task's outputs (see `BatchQueue::push_all`).
            if !push_outputs(r, outputs)? {
                r.input.close_receiver(); // downstream stopped (a limit): stop too
            }
        }
        Some((reorder, turned)) => {
            let mut state = reorder.lock().unwrap_or_else(|p| p.into_inner());
            let before = state.spilled_bytes;
            let ready = state.insert(index, outputs)?;
            let spilled = state.spilled_bytes - before;
            if spilled > 0 {
                r.counters.record_spill(spilled);
                r.resources.emit(PipelineEvent::Spilled {
                    stage: r.stage.name.clone(),
                    bytes: spilled,
                });
            }
            // Pushed while holding the buffer, so that outputs leave in order.
            if !push_outputs(r, ready)? {
                r.input.close_receiver();
            }
            drop(state);
            turned.notify_all();
        }
    }
    Ok(())
}
