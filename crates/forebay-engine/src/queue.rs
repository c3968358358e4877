//! The bounded queue between two stages: bounded in batches *and* bytes, and a holder in the
//! memory pool (batches waiting in it are charged to it, so nothing waits unaccounted).
//!
//! ```text
//!  producers ──push (blocks while full)──► [b b b]  ≤ max_batches, ≤ max_bytes ──pop──► consumers
//!      ▲ Ok(false): the consumer side closed (a limit was reached): stop producing
//! ```
//!
//! One batch is always let in, whatever its size, so a batch larger than the byte bound
//! still moves (the pool, not the queue, bounds total memory). So is one group of batches
//! handed over together (`push_all`: a map task's outputs, already charged to the pool).

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
        let Some(mut state) = self.wait_for_room(bytes, cancel)? else {
            return Ok(false);
        };
        self.admit(&mut state, batch, bytes);
        drop(state);
        self.changed.notify_all();
        Ok(true)
    }

    /// Add the batches of one hand-over (a map task's outputs) at once: they wait for room
    /// as one batch would (a group is always let into an empty queue, whatever its size or
    /// number), then go in together with one wake-up. The consumer takes them one by one
    /// without waiting for the producer between them: with a queue of two batches, a task
    /// of five small outputs otherwise cost a switch between the threads per output.
    /// `Ok(false)` as for [`push`](Self::push): none of them was added.
    pub(crate) fn push_all(&self, batches: Vec<T>, cancel: &CancelToken) -> Result<bool> {
        if batches.is_empty() {
            return Ok(true);
        }
        let sizes: Vec<usize> = batches.iter().map(Queued::memory).collect();
        let Some(mut state) = self.wait_for_room(sizes.iter().sum(), cancel)? else {
            return Ok(false);
        };
        for (batch, bytes) in batches.into_iter().zip(sizes) {
            self.admit(&mut state, batch, bytes);
        }
        drop(state);
        self.changed.notify_all();
        Ok(true)
    }

    /// Put `batch` (of `bytes`) at the back, charged to the queue.
    fn admit(&self, state: &mut QueueState<T>, batch: T, bytes: usize) {
        batch.move_to(&self.holder);
        state.bytes += bytes;
        state.items.push_back((batch, bytes));
    }

    /// The queue locked once it has room for `bytes` more (always, when it is empty);
    /// `None`: the consumer side closed.
    fn wait_for_room(
        &self,
        bytes: usize,
        cancel: &CancelToken,
    ) -> Result<Option<MutexGuard<'_, QueueState<T>>>> {
        let mut state = self.lock();
        loop {
            cancel.check()?;
            if state.receiver_closed {
                return Ok(None);
            }
            let full = state.items.len() >= self.max_batches
                || (!state.items.is_empty() && state.bytes + bytes > self.max_bytes);
            if !full {
                return Ok(Some(state));
            }
            state = self.wait(state);
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch};

    use super::*;
    use crate::memory::{Admission, MemoryPool};

    fn pool() -> MemoryPool {
        MemoryPool::new(1 << 30)
    }

    /// A batch of `rows` rows, charged to `pool`.
    fn batch(pool: &MemoryPool, rows: i64) -> EngineBatch {
        let column = Arc::new(Int64Array::from_iter_values(0..rows));
        let batch = RecordBatch::try_from_iter([("x", column as _)]).unwrap();
        let reservation = pool
            .consumer("made")
            .reserve_batch(&batch, Admission::Now)
            .unwrap();
        EngineBatch {
            batch,
            seq: 0,
            origin: Vec::new(),
            reservation,
        }
    }

    fn queue(pool: &MemoryPool, max_batches: usize, max_bytes: usize) -> BatchQueue {
        BatchQueue::new(pool.consumer("queue"), max_batches, max_bytes, 1)
    }

    /// A group goes into an empty queue whole, beyond the queue's bounds, and the next
    /// push waits until the consumer has made room again.
    #[test]
    fn a_group_goes_in_whole_and_then_the_queue_is_full() {
        let pool = pool();
        let q = Arc::new(queue(&pool, 2, usize::MAX));
        let cancel = CancelToken::new();
        let group = (1..=5).map(|rows| batch(&pool, rows)).collect();
        assert!(q.push_all(group, &cancel).unwrap());
        let pusher = {
            let (q, sixth) = (q.clone(), batch(&pool, 6));
            std::thread::spawn(move || q.push(sixth, &CancelToken::new()).unwrap())
        };
        let mut rows = Vec::new();
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(20));
            assert!(
                !pusher.is_finished(),
                "a push into a full queue did not wait"
            );
            rows.push(q.pop(&cancel).unwrap().unwrap().batch.num_rows());
        }
        assert!(pusher.join().unwrap());
        q.sender_done();
        while let Some(b) = q.pop(&cancel).unwrap() {
            rows.push(b.batch.num_rows());
        }
        assert_eq!(rows, [1, 2, 3, 4, 5, 6]);
    }

    /// A group waits for room by its bytes together, and is dropped whole once the
    /// consumer side closed.
    #[test]
    fn a_group_waits_for_its_bytes_and_is_dropped_when_the_consumer_closed() {
        let pool = pool();
        let one = batch_memory(&batch(&pool, 100).batch);
        let q = queue(&pool, 10, 3 * one);
        let cancel = CancelToken::new();
        assert!(q.push(batch(&pool, 100), &cancel).unwrap());
        let group: Vec<EngineBatch> = (0..3).map(|_| batch(&pool, 100)).collect();
        let pushed = std::thread::scope(|scope| {
            let pusher = scope.spawn(|| q.push_all(group, &cancel));
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                !pusher.is_finished(),
                "four batches' bytes went into a queue of three"
            );
            q.close_receiver();
            pusher.join().unwrap()
        });
        assert!(!pushed.unwrap());
        assert_eq!(
            pool.snapshot().used,
            0,
            "the dropped group is still charged"
        );
    }
}
