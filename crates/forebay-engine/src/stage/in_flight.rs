//! A worker that keeps many calls in flight (an event loop of async calls to a model
//! server): the stage's worker thread feeds it batches while fewer than its
//! [`MapWorker::in_flight`] are running, and hands on what finished.
//!
//! ```text
//!  tasks ──► chunks waiting ──submit(call, batch)──► worker (≤ in_flight calls running)
//!                 ▲                                      │ completed(≤ 50 ms)
//!                 └── taken while there is room          ▼
//!                                      outputs_of_call ──► the task's slot for that chunk
//!                                      a task whose chunks are all back ──► its small outputs
//!                                      joined ──► emit (task order restored downstream when
//!                                      order is preserved)
//! ```
//!
//! A task is an input batch's worth of calls (a row group in requests of 16 rows: thousands
//! of outputs of a few hundred bytes). Handed on one by one into the next stage's queue of
//! two, they kept this thread (and the event loop it drives) waiting at each task's end,
//! up to 64 ms, while the answers to the calls in flight went unread; joined as they come
//! back, they are one hand-over (see `outputs::JoinedOutputs`).
//!
//! A task is taken from the dispatcher only when a call slot is free, so the stage holds at
//! most its own calls and one task's chunks beyond them: every batch is charged to it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::outputs::{outputs_of_call, JoinedOutputs};
use super::{emit, MapWorker, Running, Task, WorkerContext};
use crate::batch::EngineBatch;
use crate::error::{BatchLabel, Result};

/// How long one wait for finished calls lasts at most (the run's cancellation is checked
/// between waits).
const WAIT: Duration = Duration::from_millis(50);

/// A task whose chunks are being called.
struct OpenTask {
    /// What each chunk back before an earlier one became (None: not back yet, or
    /// gathered).
    outputs: Vec<Option<Vec<EngineBatch>>>,
    /// The first chunk not gathered yet.
    next: usize,
    /// The outputs of the chunks before `next`, in order.
    gathered: JoinedOutputs,
    waiting: usize,
}

/// A call in flight: its task, its chunk's place in the task, and its input (charged to
/// the stage until the call is back).
struct Call {
    task: u64,
    chunk: usize,
    input: EngineBatch,
}

/// The loop of a worker with [`MapWorker::in_flight`] above 1.
pub(super) fn serve_in_flight(
    r: &Running,
    ctx: &WorkerContext<'_>,
    worker: &mut dyn MapWorker,
    tasks: crossbeam_channel::Receiver<Task>,
) -> Result<()> {
    let cancel = r.resources.cancel_token();
    let limit = worker.in_flight().max(1);
    let mut waiting_chunks: VecDeque<(u64, usize, EngineBatch)> = VecDeque::new();
    let mut calls: HashMap<u64, Call> = HashMap::new();
    let mut open: BTreeMap<u64, OpenTask> = BTreeMap::new();
    let mut next_call = 0u64;
    let mut input_done = false;
    loop {
        cancel.check()?;
        // Start calls while there is room: chunks already taken first, then new tasks
        // (waiting for one only when nothing is in flight).
        while calls.len() < limit {
            if let Some((task, chunk, input)) = waiting_chunks.pop_front() {
                worker
                    .submit(next_call, input.batch.clone(), ctx)
                    .map_err(|f| f.into_error(&r.stage.name, input.label()))?;
                calls.insert(next_call, Call { task, chunk, input });
                next_call += 1;
                continue;
            }
            if input_done {
                break;
            }
            let received = if calls.is_empty() {
                tasks.recv_timeout(WAIT).map_err(|e| match e {
                    crossbeam_channel::RecvTimeoutError::Timeout => None,
                    crossbeam_channel::RecvTimeoutError::Disconnected => Some(()),
                })
            } else {
                tasks.try_recv().map_err(|e| match e {
                    crossbeam_channel::TryRecvError::Empty => None,
                    crossbeam_channel::TryRecvError::Disconnected => Some(()),
                })
            };
            match received {
                Ok(task) => {
                    let chunks = task.batches.len();
                    open.insert(
                        task.index,
                        OpenTask {
                            outputs: (0..chunks).map(|_| None).collect(),
                            next: 0,
                            gathered: JoinedOutputs::default(),
                            waiting: chunks,
                        },
                    );
                    if chunks == 0 {
                        finish_task(r, &mut open, task.index)?;
                    }
                    for (chunk, input) in task.batches.into_iter().enumerate() {
                        waiting_chunks.push_back((task.index, chunk, input));
                    }
                }
                // Nothing new yet: go on with the calls in flight.
                Err(None) => break,
                // The end of the input, or the run stopped (its error is the run's).
                Err(Some(())) => {
                    input_done = true;
                    break;
                }
            }
        }
        if calls.is_empty() {
            if input_done && waiting_chunks.is_empty() {
                return cancel.check();
            }
            continue;
        }
        let started = Instant::now();
        let finished = worker.completed(WAIT, ctx).map_err(|f| {
            f.into_error(&r.stage.name, BatchLabel("its calls in flight".to_string()))
        })?;
        r.counters.record_busy(started.elapsed());
        for (id, outcome) in finished {
            let Some(Call {
                task,
                chunk,
                mut input,
            }) = calls.remove(&id)
            else {
                return Err(crate::error::EngineError::Worker {
                    stage: r.stage.name.clone(),
                    reason: format!("the worker finished call {id}, which it was not given"),
                });
            };
            let outputs = outcome.map_err(|f| f.into_error(&r.stage.name, input.label()))?;
            let ready = outputs_of_call(r, &mut input, outputs)?;
            drop(input);
            let slot = open
                .get_mut(&task)
                .expect("a call's task stays open until it is back");
            slot.outputs[chunk] = Some(ready);
            slot.waiting -= 1;
            while let Some(outputs) = slot.outputs.get_mut(slot.next).and_then(Option::take) {
                for output in outputs {
                    slot.gathered.push(r, output)?;
                }
                slot.next += 1;
            }
            if slot.waiting == 0 {
                finish_task(r, &mut open, task)?;
            }
        }
    }
}

/// Hand on a task whose chunks are all back (and gathered), its outputs in chunk order,
/// small ones joined (see [`JoinedOutputs`]).
fn finish_task(r: &Running, open: &mut BTreeMap<u64, OpenTask>, task: u64) -> Result<()> {
    let done = open.remove(&task).expect("an open task");
    debug_assert_eq!(done.next, done.outputs.len(), "every chunk gathered");
    emit(r, task, done.gathered.finish(r)?)
}
