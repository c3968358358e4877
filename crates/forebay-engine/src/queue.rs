//! The bounded queue between two stages: bounded in batches *and* bytes, and a holder in the
//! memory pool (batches waiting in it are charged to it, so nothing waits unaccounted).
//!
//! ```text
//!  producers ──push (blocks while full)──► [b b b]  ≤ max_batches, ≤ max_bytes ──pop──► consumers
//!      ▲ Ok(false): the consumer side closed (a limit was reached): stop producing
//! ```
//!
//! One batch is always let in, whatever its size, so a batch larger than the byte bound
//! still moves (the pool, not the queue, bounds total memory).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::batch::EngineBatch;
use crate::error::Result;
use crate::memory::{batch_memory, CancelToken, MemoryConsumer};

/// What a queue holds: a batch, or the pieces of one output batch (iter_batches).
pub(crate) trait Queued: Send {
    /// Bytes it references (for the queue's byte bound).
    fn memory(&self) -> usize;
    /// Charge `holder` for it.
    fn move_to(&self, holder: &MemoryConsumer);
}

impl Queued for EngineBatch {
    fn memory(&self) -> usize {
        batch_memory(&self.batch)
    }
    fn move_to(&self, holder: &MemoryConsumer) {
        EngineBatch::move_to(self, holder)
    }
}

impl Queued for Vec<EngineBatch> {
    fn memory(&self) -> usize {
        self.iter().map(|b| batch_memory(&b.batch)).sum()
    }
    fn move_to(&self, holder: &MemoryConsumer) {
        for b in self {
            b.move_to(holder);
        }
    }
}

pub(crate) struct BatchQueue<T: Queued = EngineBatch> {
    holder: MemoryConsumer,
    max_batches: usize,
    max_bytes: usize,
    state: Mutex<QueueState<T>>,
    changed: Condvar,
}

struct QueueState<T> {
    items: VecDeque<(T, usize)>,
    bytes: usize,
    /// Producers that have not finished yet.
    senders: usize,
    /// The consumer side stopped taking batches.
    receiver_closed: bool,
}

const POLL: Duration = Duration::from_millis(50);

impl<T: Queued> BatchQueue<T> {
    /// `holder` is charged for the waiting batches (its name is the queue's name in
    /// statistics).
    pub(crate) fn new(
        holder: MemoryConsumer,
        max_batches: usize,
        max_bytes: usize,
        senders: usize,
    ) -> BatchQueue<T> {
        BatchQueue {
            holder,
            max_batches: max_batches.max(1),
            max_bytes,
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                bytes: 0,
                senders,
                receiver_closed: false,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, QueueState<T>>) -> MutexGuard<'a, QueueState<T>> {
        self.changed
            .wait_timeout(guard, POLL)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    /// Add a batch, waiting while the queue is full. `Ok(false)`: the consumer side closed
    /// and the batch was dropped; the producer should stop.
    pub(crate) fn push(&self, batch: T, cancel: &CancelToken) -> Result<bool> {
        let bytes = batch.memory();
        let mut state = self.lock();
        loop {
            cancel.check()?;
            if state.receiver_closed {
                return Ok(false);
            }
            let full = state.items.len() >= self.max_batches
                || (!state.items.is_empty() && state.bytes + bytes > self.max_bytes);
            if !full {
                break;
            }
            state = self.wait(state);
        }
        batch.move_to(&self.holder);
        state.bytes += bytes;
        state.items.push_back((batch, bytes));
        drop(state);
        self.changed.notify_all();
        Ok(true)
    }

    /// Take the next batch, waiting while the queue is empty; `None` once every producer
    /// finished and the queue is drained.
    pub(crate) fn pop(&self, cancel: &CancelToken) -> Result<Option<T>> {
        let mut state = self.lock();
        loop {
            cancel.check()?;
            if let Some((batch, bytes)) = state.items.pop_front() {
                state.bytes -= bytes;
                drop(state);
                self.changed.notify_all();
                return Ok(Some(batch));
            }
            if state.senders == 0 {
                return Ok(None);
            }
            state = self.wait(state);
        }
    }

    /// Like [`pop`](Self::pop), but gives up after `timeout` (`Ok(Err(()))`).
    pub(crate) fn pop_timeout(
        &self,
        cancel: &CancelToken,
        timeout: Duration,
    ) -> Result<std::result::Result<Option<T>, ()>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            cancel.check()?;
            if let Some((batch, bytes)) = state.items.pop_front() {
                state.bytes -= bytes;
                drop(state);
                self.changed.notify_all();
                return Ok(Ok(Some(batch)));
            }
            if state.senders == 0 {
                return Ok(Ok(None));
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Ok(Err(()));
            }
            state = self
                .changed
                .wait_timeout(state, (deadline - now).min(POLL))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// One producer finished.
    pub(crate) fn sender_done(&self) {
        let mut state = self.lock();
        state.senders = state.senders.saturating_sub(1);
        drop(state);
        self.changed.notify_all();
    }

    /// The consumer side stops: waiting batches are dropped, producers see `Ok(false)`.
    pub(crate) fn close_receiver(&self) {
        let mut state = self.lock();
        state.receiver_closed = true;
        state.items.clear();
        state.bytes = 0;
        drop(state);
        self.changed.notify_all();
    }
}

/// Something whose waiters a cancellation must wake.
pub(crate) trait Wake: Send + Sync {
    fn wake(&self);
}

impl<T: Queued> Wake for BatchQueue<T> {
    fn wake(&self) {
        self.changed.notify_all();
    }
}
