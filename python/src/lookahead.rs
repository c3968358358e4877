//! Preparing a `map_batches` worker's next batch while its function still runs on the current
//! one.
//!
//! A call on one batch is: the batch to pyarrow, to the function's batch format (`Table`,
//! numpy arrays, a pandas `DataFrame`), the function, the output back to Arrow. One after the
//! other, the conversions before the function sit between two calls: the function (a model on
//! a GPU, a remote service) waits for them on every batch, and a pandas conversion can take
//! milliseconds. The engine receives a worker's tasks one ahead on a second thread and calls
//! [`NextBatchPreparer::prepare`] there (see `forebay_engine::PrepareNext`):
//!
//! ```text
//!  worker thread:    call(k): take input k, allow k+1, run fn ───► call(k+1): take input k+1 ...
//!                                              │
//!  engine's          prepare(k+1): wait until allowed, take the GIL (free while fn sleeps or
//!  fetcher thread:   waits on a GPU), batch → pyarrow → Runner.prepare → input k+1 ready
//! ```
//!
//! Batch k+1 is only converted once call k holds the GIL and is about to run the function
//! ("allow k+1"): started earlier, the conversion would take the GIL first and delay call k.
//! Each batch is converted once: a call that comes while its batch is still being converted
//! waits for it, and a batch the worker has started converting itself is not claimed.
//!
//! A function that holds the GIL gains nothing (the conversion waits for the GIL either way)
//! and pays for the GIL changing hands twice more per batch. So the preparer notes how it got
//! the GIL: a function that releases it does so at once (a sleep, a GPU call), while one that
//! holds it lets go only when it returns or when the interpreter takes it away after its
//! switch interval (5 ms). When such waits clearly outnumber the others the preparer stops,
//! and batches are converted in the call again.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use forebay_engine::CancelToken;
use forebay_engine::PrepareNext;
use pyo3::prelude::*;

use crate::arrow_export::BatchExporter;
use crate::thread_state::KeptThreadState;

/// A wait for the GIL at least this share of the switch interval means the function held it.
const HELD_GIL_SHARE_OF_SWITCH_INTERVAL: f64 = 0.8;
/// Each preparation that got the GIL only when the function returned, or waited that long
/// for it, adds one to a score, each other one takes one off (other threads wanting the GIL
/// make some waits short); at this score: stop.
const HELD_GIL_SCORE_TO_STOP: u32 = 3;
/// How often a preparer waiting to be allowed checks whether the worker has gone.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// A batch, its index among the worker's batches, and the function input made of it (or the
/// exception converting it raised).
type Prepared = (u64, RecordBatch, PyResult<Py<PyAny>>);

/// What a worker and its preparer share. Both see the worker's batches in the same order and
/// number them from 0; each batch is converted once, by whichever side claims it first:
///
/// ```text
///  preparer, batch i:  wait until i is allowed ─► claim i (unless the worker took it) ─► convert ─► ready
///  worker, call i:     take i: ready? use it │ being converted? wait for it │ else convert it itself
/// ```
#[derive(Default)]
pub(crate) struct PreparedInputs {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// The index of the batch the worker's next call takes (= its calls so far).
    calls: u64,
    /// The preparer may convert batches up to this index: the one after the call that holds
    /// the GIL and is about to run the function (batch 0 has no call before it).
    allowed_through: u64,
    /// The batch the preparer is converting now.
    converting: Option<u64>,
    /// The input made, until its call takes it (at most one: the preparer converts batch
    /// i + 1 only once call i has started, and call i has then taken batch i).
    ready: Option<Prepared>,
    /// The worker is inside the function (set and cleared with the GIL held).
    in_call: bool,
    /// The preparer stopped (the function holds the GIL).
    stopped: bool,
}

impl PreparedInputs {
    pub(crate) fn new() -> Arc<PreparedInputs> {
        Arc::new(PreparedInputs::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The input prepared for `batch`, the worker's next one; `None` when the worker must
    /// convert it itself. Waits while the preparer is converting it (cheaper than converting
    /// it twice). Call without the GIL: the preparer needs it.
    pub(crate) fn take(&self, batch: &RecordBatch) -> Option<PyResult<Py<PyAny>>> {
        let mut state = self.lock();
        let index = state.calls;
        // From here on the preparer no longer claims this batch.
        state.calls += 1;
        while state.converting == Some(index) {
            state = self
                .changed
                .wait_timeout(state, WAIT_SLICE)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let (made_for, input) = match state.ready.take() {
            Some((i, made_for, input)) if i == index => (made_for, input),
            // Claimed batches are taken in order, so an older input cannot be waiting here;
            // dropped (with the GIL) if one ever is.
            stale => {
                drop(state);
                if stale.is_some() {
                    Python::attach(|_| drop(stale));
                }
                return None;
            }
        };
        drop(state);
        if same_batch(&made_for, batch) {
            return Some(input);
        }
        // Not the batch the engine announced (never expected): drop the stale input.
        Python::attach(|_| drop(input));
        None
    }

    /// A call now holds the GIL and is about to run the function: the next batch may be
    /// converted (it gets the GIL when the function lets go of it).
    pub(crate) fn allow_next(&self) {
        let mut state = self.lock();
        state.in_call = true;
        if !state.stopped {
            state.allowed_through = state.calls;
            self.changed.notify_all();
        }
    }

    /// The function has returned (call with the GIL still held).
    pub(crate) fn function_returned(&self) {
        self.lock().in_call = false;
    }

    /// Drop the input nobody took, with the GIL held (the worker is closing).
    pub(crate) fn clear(&self) {
        let left = self.lock().ready.take();
        if left.is_some() {
            Python::attach(|_| drop(left));
        }
    }

    /// Wait until batch `index` may be converted and claim it; `None` if the worker took it
    /// first, the worker has gone or preparing stopped.
    fn claim(&self, index: u64, worker_done: &CancelToken) -> Option<Claim<'_>> {
        let mut state = self.lock();
        loop {
            if state.stopped || worker_done.is_cancelled() || state.calls > index {
                return None;
            }
            if state.allowed_through >= index {
                state.converting = Some(index);
                return Some(Claim {
                    inputs: self,
                    index,
                });
            }
            state = self
                .changed
                .wait_timeout(state, WAIT_SLICE)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The preparer's claim on one batch: delivered with its input, or, dropped undelivered (a
/// panic while converting), released so that the call waiting for it converts it itself.
struct Claim<'a> {
    inputs: &'a PreparedInputs,
    index: u64,
}

impl<'a> Claim<'a> {
    /// Hand over the input made for the claimed batch; wakes a call waiting for it. Returns
    /// the state for the caller's bookkeeping.
    fn deliver(self, batch: RecordBatch, input: PyResult<Py<PyAny>>) -> MutexGuard<'a, State> {
        let inputs = self.inputs;
        let mut state = inputs.lock();
        let replaced = state.ready.replace((self.index, batch, input));
        state.converting = None;
        inputs.changed.notify_all();
        // Released above, under the lock this function still holds (dropping the claim would
        // take it again).
        std::mem::forget(self);
        if replaced.is_some() {
            // Never expected (see `ready`): an input nobody will take.
            drop(state);
            Python::attach(|_| drop(replaced));
            state = inputs.lock();
        }
        state
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut state = self.inputs.lock();
        if state.converting == Some(self.index) {
            state.converting = None;
            self.inputs.changed.notify_all();
        }
    }
}

/// The preparer of one worker, run on the engine's fetcher thread.
pub(crate) struct NextBatchPreparer {
    inputs: Arc<PreparedInputs>,
    /// The index of the batch `prepare` is called on next (the engine calls it on each of
    /// the worker's batches, in the worker's order).
    next_index: u64,
    /// `Runner.prepare`; `None` once dropped (with the GIL held).
    prepare: Option<Py<PyAny>>,
    /// Batches go to pyarrow through this (its schema is dropped with the GIL held too).
    exporter: BatchExporter,
    /// A wait for the GIL at least this long counts as the function holding it.
    held_gil_wait: Duration,
    /// Long waits minus short ones (never below 0).
    held_gil_score: u32,
    /// The fetcher thread's Python thread state, made on its first batch. Declared last:
    /// dropped after the Python objects.
    thread_state: Option<KeptThreadState>,
}

impl NextBatchPreparer {
    /// A preparer calling `prepare` (a `Runner.prepare`) for the worker that shares `inputs`.
    pub(crate) fn new(
        py: Python<'_>,
        inputs: Arc<PreparedInputs>,
        prepare: Py<PyAny>,
    ) -> PyResult<NextBatchPreparer> {
        let switch_interval: f64 = py
            .import("sys")?
            .call_method0("getswitchinterval")?
            .extract()?;
        Ok(NextBatchPreparer {
            inputs,
            next_index: 0,
            prepare: Some(prepare),
            exporter: BatchExporter::default(),
            held_gil_wait: Duration::from_secs_f64(
                switch_interval.max(0.0) * HELD_GIL_SHARE_OF_SWITCH_INTERVAL,
            ),
            held_gil_score: 0,
            thread_state: None,
        })
    }
}

impl PrepareNext for NextBatchPreparer {
    fn prepare(&mut self, next: &RecordBatch, worker_done: &CancelToken) {
        let index = self.next_index;
        self.next_index += 1;
        let Some(prepare) = &self.prepare else {
            return;
        };
        let Some(claim) = self.inputs.claim(index, worker_done) else {
            return;
        };
        self.thread_state.get_or_insert_with(KeptThreadState::new);
        let asked = Instant::now();
        let (input, waited, during_call) = Python::attach(|py| {
            let waited = asked.elapsed();
            let during_call = self.inputs.lock().in_call;
            let input = self
                .exporter
                .export(py, next)
                .and_then(|b| prepare.call1(py, (b,)));
            (input, waited, during_call)
        });
        let mut state = claim.deliver(next.clone(), input);
        if index == 0 {
            // No call runs before the first batch: nothing to learn about the function.
            return;
        }
        // Held: the GIL came only when the function returned, or was taken from it.
        if !during_call || waited >= self.held_gil_wait {
            self.held_gil_score += 1;
            state.stopped = self.held_gil_score >= HELD_GIL_SCORE_TO_STOP;
        } else {
            self.held_gil_score = self.held_gil_score.saturating_sub(1);
        }
    }
}

impl Drop for NextBatchPreparer {
    fn drop(&mut self) {
        if let Some(prepare) = self.prepare.take() {
            let exporter = std::mem::take(&mut self.exporter);
            Python::attach(|_| drop((prepare, exporter)));
        }
    }
}

/// Whether two batches are the same rows of the same arrays (clones of one batch).
fn same_batch(a: &RecordBatch, b: &RecordBatch) -> bool {
    a.num_rows() == b.num_rows()
        && a.num_columns() == b.num_columns()
        && a.columns()
            .iter()
            .zip(b.columns())
            .all(|(x, y)| Arc::ptr_eq(x, y))
}
