//! One memory pool with a hard cap, and the reservations that every batch in flight holds.
//!
//! ```text
//!   batch ──buffers──► [(allocation address, bytes), ...] ──► pool registry
//!                                                              │ address seen before? holder += 1
//!                                                              │ new? used += bytes (this
//!                                                              │       reservation owns the charge)
//!   Reservation (RAII) ◄─────────────────────────────────────────┘
//!     ├─ move_to(consumer)   the batch changed hands (stage → queue → stage)
//!     └─ drop                holder -= 1; the last holder frees the bytes
//! ```
//!
//! A reservation is charged by the *distinct underlying allocations* its batch references,
//! not by the rows it holds: a one-row slice of a 128 MB buffer costs 128 MB, and two batches
//! sharing a buffer (slices of one batch, a dictionary shared by a row group's batches) are
//! charged once. The charge of an allocation belongs to its first holder and moves to the
//! next holder when that one lets go, so at every moment the bytes held by the consumers
//! (stages, queues, buffers) add up exactly to the pool's `used`.
//!
//! Only the source waits for room ([`Admission::Wait`], with headroom for what the stages
//! downstream and the scan's decoders will allocate next); every other holder is charged at
//! once ([`Admission::Now`]). Holders downstream of the source always make progress (the
//! sink drains), so waiting at the source alone cannot deadlock, and the pool returns under
//! its limit as they drain, except for rows that wait for more input: a re-chunker's rows
//! short of a full batch, a shuffle buffer's rows. Their holders
//! ([`MemoryPool::consumer_awaiting_input`]) never keep the source waiting for them to drain
//! (they cannot, until the source sends more), and they hold compact copies of their rows,
//! not the input batches those rows were sliced from.
//! A run's pool ([`MemoryPool::for_process`]) also counts memory the process holds beyond
//! the books: when it is what keeps the source waiting, the allocator is asked to return its
//! free pages first (retention of freed batches); what no trim returns (the decoder's working
//! pages, a model the user's function loaded) is waited for too, but the batches in flight
//! always get a quarter of the limit (see `process_memory`).
//!
//! Allocations Arrow does not own (buffers imported through the C data interface from
//! pyarrow, mapped files) report no capacity; they are charged from the start of the
//! allocation to the end of the furthest slice seen.
//!
//! A reservation keeps a handle on each buffer it is charged for, so an allocation cannot be
//! freed (and its address reused by another batch) while it is on the books: the pool's
//! charge is memory that is really alive.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;

use crate::error::{EngineError, Result};
use crate::process_memory::ProcessMemory;

/// Whatever the process holds outside the books, the batches in flight may always take
/// `limit / BATCHES_ALWAYS_GET` of the limit (see `process_memory`).
const BATCHES_ALWAYS_GET: usize = 4;

/// A flag that stops a run: set once, seen by every waiting holder within ~50 ms.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
    /// `Err(Cancelled)` once cancelled.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(EngineError::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// How a reservation is admitted.
#[derive(Debug, Clone, Copy)]
pub enum Admission<'a> {
    /// Wait until `used + bytes + headroom <= limit`, or until no batch is held at all (so
    /// that a batch larger than what the limit leaves still gets through alone). A run's pool
    /// (`MemoryPool::for_process`) also counts the process's memory beyond the books, and
    /// then always admits batches within a quarter of the limit (see `process_memory`). For
    /// the source.
    Wait {
        headroom: usize,
        cancel: &'a CancelToken,
    },
    /// Charge now, even over the limit (the source then waits until holders drain).
    Now,
}

/// A pool with a hard cap on the bytes of the batches in flight. Cheap to clone.
#[derive(Clone)]
pub struct MemoryPool {
    shared: Arc<Shared>,
}

struct Shared {
    limit: usize,
    state: Mutex<State>,
    /// Signalled whenever bytes are freed.
    room: Condvar,
}

#[derive(Default)]
struct State {
    used: usize,
    /// Of `used`: plain bytes (fixed budgets such as the object store's arena), which a
    /// waiting source cannot expect to be freed.
    plain: usize,
    peak: usize,
    /// The most bytes charged at once, leaving out budgets (reserved capacities).
    peak_in_flight: usize,
    /// Allocation start address → its charge and holders.
    allocations: HashMap<usize, Allocation>,
    reservations: HashMap<u64, ReservationState>,
    consumers: Vec<ConsumerState>,
    next_reservation: u64,
    /// The process's memory beyond the books, counted by the source's admission (see
    /// [`crate::process_memory`]); `None`: the pool counts its own charges only.
    process: Option<ProcessMemory>,
    /// A host engine's pool, kept holding what this pool charges (`used`), and asked for
    /// room before the source's batches are admitted ([`MemoryPool::with_host`]).
    host: Option<HostShare>,
}

/// This pool's share of a host's pool: one reservation, resized to follow `used`.
struct HostShare(forebay_io::memory::MemoryReservation);

impl HostShare {
    /// Make the host's reservation hold `used` bytes (memory already allocated: whatever
    /// the host's limit).
    fn follow(&mut self, used: usize) {
        let held = self.0.size();
        if used > held {
            self.0.grow(used - held);
        } else {
            self.0.shrink(held - used);
        }
    }

    /// Whether the host's pool has room for `bytes` more than this pool holds now (asked,
    /// not taken: the charge follows once the batch is on the books).
    fn has_room(&mut self, bytes: usize) -> bool {
        match self.0.try_grow(bytes) {
            Ok(()) => {
                self.0.shrink(bytes);
                true
            }
            Err(_) => false,
        }
    }
}

struct Allocation {
    bytes: usize,
    /// Reservations referencing it, by id (ids grow: the oldest first); the first one owns
    /// (is charged for) its bytes. A set, not a list: a buffer of a big batch sliced into
    /// thousands of small batches has thousands of holders, and a list made each release
    /// scan them all (quadratic: 62,500 16-row batches took 78 s instead of ~15).
    holders: BTreeSet<u64>,
}

struct ReservationState {
    consumer: usize,
    /// Bytes this reservation is charged for (allocations it owns + plain bytes).
    owned: usize,
    /// Plain bytes (not tied to an allocation), freed with the reservation.
    plain: usize,
    /// The allocations it references, kept alive while it is on the books.
    allocations: Vec<(usize, Buffer)>,
}

struct ConsumerState {
    name: String,
    held: usize,
    peak: usize,
    /// Holds rows that wait for more input (see [`MemoryPool::consumer_awaiting_input`]).
    awaits_input: bool,
    /// Holds a reserved capacity, not data in flight (see [`MemoryPool::consumer_for_budget`]).
    budget: bool,
}

/// What one consumer holds, in a [`PoolSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSnapshot {
    pub name: String,
    /// Bytes charged to this consumer now.
    pub held: usize,
    /// The most it ever held.
    pub peak: usize,
}

/// A consistent view of the pool (taken under its lock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub limit: usize,
    pub used: usize,
    pub peak: usize,
    /// The most bytes charged at once, leaving out reserved capacities (the run's object
    /// store's arena): the peak of data in flight.
    pub peak_in_flight: usize,
    pub consumers: Vec<ConsumerSnapshot>,
}

impl MemoryPool {
    /// A pool that admits at most `limit` bytes of charged batches (through
    /// [`Admission::Wait`]).
    pub fn new(limit: usize) -> MemoryPool {
        MemoryPool::with_process(limit, None)
    }

    /// This pool's charges also held in a host engine's pool (one consumer, `name`, that
    /// grows and shrinks with [`used`](Self::used)), whose room the source's batches also
    /// wait for: forebay and the host's own work share one budget. When nothing of this pool
    /// could drain, a batch is admitted whatever the host says (a run always makes progress).
    pub fn with_host(
        self,
        host: std::sync::Arc<dyn forebay_io::memory::MemoryPool>,
        name: impl Into<String>,
    ) -> MemoryPool {
        let mut share = HostShare(forebay_io::memory::MemoryReservation::new(host, name));
        {
            let mut state = self.shared.lock();
            share.follow(state.used);
            state.host = Some(share);
        }
        self
    }

    /// A pool whose limit also covers what the process holds beyond the books (decoder
    /// pages, allocator retention: see the `process_memory` module), measured from now. For a
    /// run's pool; the same as [`MemoryPool::new`] where the process cannot be measured.
    pub fn for_process(limit: usize) -> MemoryPool {
        MemoryPool::with_process(limit, ProcessMemory::of_this_process())
    }

    fn with_process(limit: usize, process: Option<ProcessMemory>) -> MemoryPool {
        MemoryPool {
            shared: Arc::new(Shared {
                limit,
                state: Mutex::new(State {
                    process,
                    ..State::default()
                }),
                room: Condvar::new(),
            }),
        }
    }

    pub fn limit(&self) -> usize {
        self.shared.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.shared.lock().used
    }

    /// The most bytes ever charged at once.
    pub fn peak(&self) -> usize {
        self.shared.lock().peak
    }

    /// Register a holder of batches (a stage, a queue, a buffer) under a display name.
    pub fn consumer(&self, name: impl Into<String>) -> MemoryConsumer {
        self.register(name.into(), false, false)
    }

    /// Register a holder of a reserved capacity (the run's object store arena): charged like
    /// anything else, but not data in flight, so left out of `peak_in_flight`.
    pub fn consumer_for_budget(&self, name: impl Into<String>) -> MemoryConsumer {
        self.register(name.into(), false, true)
    }

    /// Register a holder of rows that wait for more input before they can go on (a
    /// re-chunker's rows short of a batch, a shuffle buffer). The source never waits for
    /// what it holds to drain: that would wait forever. Keep what it holds small and
    /// compact (copies of the rows, not slices pinning whole input batches).
    pub fn consumer_awaiting_input(&self, name: impl Into<String>) -> MemoryConsumer {
        self.register(name.into(), true, false)
    }

    fn register(&self, name: String, awaits_input: bool, budget: bool) -> MemoryConsumer {
        let mut state = self.shared.lock();
        state.consumers.push(ConsumerState {
            name,
            held: 0,
            peak: 0,
            awaits_input,
            budget,
        });
        MemoryConsumer {
            pool: self.clone(),
            index: state.consumers.len() - 1,
        }
    }

    pub fn snapshot(&self) -> PoolSnapshot {
        let state = self.shared.lock();
        PoolSnapshot {
            limit: self.shared.limit,
            used: state.used,
            peak: state.peak,
            peak_in_flight: state.peak_in_flight,
            consumers: state
                .consumers
                .iter()
                .map(|c| ConsumerSnapshot {
                    name: c.name.clone(),
                    held: c.held,
                    peak: c.peak,
                })
                .collect(),
        }
    }

    /// Wake every waiter (after a cancellation, so that it notices at once).
    pub fn wake_all(&self) {
        self.shared.room.notify_all();
    }
}

impl State {
    /// Bytes held by the consumers `which` picks.
    fn held_where(&self, which: impl Fn(&ConsumerState) -> bool) -> usize {
        self.consumers
            .iter()
            .filter(|c| which(c))
            .map(|c| c.held)
            .sum()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the counters half-updated in a way
        // that matters more than the panic itself; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A named holder of reservations. Cheap to clone.
#[derive(Clone)]
pub struct MemoryConsumer {
    pool: MemoryPool,
    index: usize,
}

impl MemoryConsumer {
    pub fn pool(&self) -> &MemoryPool {
        &self.pool
    }

    /// Reserve the allocations `batch` references.
    pub fn reserve_batch(
        &self,
        batch: &RecordBatch,
        admission: Admission<'_>,
    ) -> Result<Reservation> {
        self.reserve(batch_buffers(batch), 0, admission)
    }

    /// Reserve plain bytes (memory that is not an Arrow batch: a fixed budget, an arena).
    pub fn reserve_bytes(&self, bytes: usize, admission: Admission<'_>) -> Result<Reservation> {
        self.reserve(Vec::new(), bytes, admission)
    }

    fn reserve(
        &self,
        extents: Vec<Extent>,
        plain: usize,
        admission: Admission<'_>,
    ) -> Result<Reservation> {
        let shared = &self.pool.shared;
        let mut state = shared.lock();
        if let Admission::Wait { headroom, cancel } = admission {
            loop {
                cancel.check()?;
                let new = new_bytes(&state, &extents) + plain;
                let batches_held = state.used - state.plain;
                // Batches that drain without the source's help (rows waiting for more input
                // do not).
                let draining = batches_held.saturating_sub(state.held_where(|c| c.awaits_input));
                let charged = state.used + new + headroom;
                let used = state.used;
                let untracked = state.process.as_mut().map_or(0, |p| p.untracked(used));
                let books_fit = charged <= shared.limit;
                let process_fits = charged + untracked <= shared.limit;
                let within_batch_share = batches_held + new <= shared.limit / BATCHES_ALWAYS_GET;
                let host_has_room = state
                    .host
                    .as_mut()
                    .is_none_or(|host| host.has_room(new + headroom));
                let trim = if draining == 0 || process_fits || !books_fit {
                    None
                } else {
                    state.process.as_mut().and_then(ProcessMemory::due_trim)
                };
                if let Some(trim) = trim {
                    // Only memory outside the books is in the way: ask the allocator for
                    // its free pages (without the lock: a trim walks every arena), then look
                    // again before falling back on the batches' quarter.
                    drop(state);
                    trim();
                    state = shared.lock();
                    continue;
                }
                let fits = process_fits || (books_fit && within_batch_share);
                if draining == 0 || (fits && host_has_room) {
                    if let Some(process) = state.process.as_mut() {
                        process.admitted();
                    }
                    break;
                }
                state = shared
                    .room
                    .wait_timeout(state, Duration::from_millis(50))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        let id = state.next_reservation;
        state.next_reservation += 1;
        let mut owned = plain;
        let mut keys = Vec::with_capacity(extents.len());
        for Extent {
            address,
            bytes,
            buffer,
        } in extents
        {
            match state.allocations.get_mut(&address) {
                Some(allocation) => {
                    if !allocation.holders.insert(id) {
                        continue; // the batch references this allocation twice
                    }
                    keys.push((address, buffer));
                    if bytes > allocation.bytes {
                        // A longer slice of an allocation of unknown capacity: the owner is
                        // charged for the extra extent.
                        let extra = bytes - allocation.bytes;
                        allocation.bytes = bytes;
                        let owner = *allocation.holders.first().expect("just inserted");
                        charge(&mut state, owner, id, extra, &mut owned);
                    }
                }
                None => {
                    state.allocations.insert(
                        address,
                        Allocation {
                            bytes,
                            holders: BTreeSet::from([id]),
                        },
                    );
                    keys.push((address, buffer));
                    owned += bytes;
                }
            }
        }
        state.used += owned;
        state.plain += plain;
        state.peak = state.peak.max(state.used);
        follow_host(&mut state);
        let consumer = &mut state.consumers[self.index];
        consumer.held += owned;
        consumer.peak = consumer.peak.max(consumer.held);
        note_peak_in_flight(&mut state);
        state.reservations.insert(
            id,
            ReservationState {
                consumer: self.index,
                owned,
                plain,
                allocations: keys,
            },
        );
        Ok(Reservation {
            pool: self.pool.clone(),
            id,
        })
    }
}

/// Keep a host's reservation holding what the books hold.
fn follow_host(state: &mut State) {
    let used = state.used;
    if let Some(host) = state.host.as_mut() {
        host.follow(used);
    }
}

/// Update `peak_in_flight` (after the consumers' holdings are updated).
fn note_peak_in_flight(state: &mut State) {
    let budgets = state.held_where(|c| c.budget);
    state.peak_in_flight = state.peak_in_flight.max(state.used.saturating_sub(budgets));
}

/// Charge `extra` bytes of a grown allocation to its owner (`owned` when the owner is the
/// reservation being created, which is added to the books afterwards).
fn charge(state: &mut State, owner: u64, creating: u64, extra: usize, owned: &mut usize) {
    if owner == creating {
        *owned += extra;
        return;
    }
    state.used += extra;
    state.peak = state.peak.max(state.used);
    follow_host(state);
    if let Some(r) = state.reservations.get_mut(&owner) {
        r.owned += extra;
        let consumer = r.consumer;
        let c = &mut state.consumers[consumer];
        c.held += extra;
        c.peak = c.peak.max(c.held);
    }
    note_peak_in_flight(state);
}

fn new_bytes(state: &State, extents: &[Extent]) -> usize {
    extents
        .iter()
        .map(|e| match state.allocations.get(&e.address) {
            Some(a) => e.bytes.saturating_sub(a.bytes),
            None => e.bytes,
        })
        .sum()
}

/// The charge for one batch (or plain bytes) in the pool. Dropping it releases the charge
/// (an allocation still referenced by another reservation passes to that one).
pub struct Reservation {
    pool: MemoryPool,
    id: u64,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("id", &self.id)
            .field("owned", &self.owned())
            .finish()
    }
}

impl Reservation {
    /// Bytes this reservation is charged for now (allocations it owns, plus plain bytes).
    pub fn owned(&self) -> usize {
        self.pool
            .shared
            .lock()
            .reservations
            .get(&self.id)
            .map_or(0, |r| r.owned)
    }

    /// The batch changed hands: charge `consumer` from now on.
    pub fn move_to(&self, consumer: &MemoryConsumer) {
        let mut state = self.pool.shared.lock();
        let Some(r) = state.reservations.get_mut(&self.id) else {
            return;
        };
        let (from, owned) = (r.consumer, r.owned);
        if from == consumer.index {
            return;
        }
        r.consumer = consumer.index;
        state.consumers[from].held -= owned;
        let to = &mut state.consumers[consumer.index];
        to.held += owned;
        to.peak = to.peak.max(to.held);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let shared = &self.pool.shared;
        let mut state = shared.lock();
        let Some(r) = state.reservations.remove(&self.id) else {
            return;
        };
        let mut freed = r.plain;
        state.consumers[r.consumer].held -= r.plain;
        // The buffer handles are dropped after the lock (freeing memory outside it).
        let mut handles = Vec::with_capacity(r.allocations.len());
        for (address, buffer) in r.allocations {
            handles.push(buffer);
            let Some(allocation) = state.allocations.get_mut(&address) else {
                continue;
            };
            let was_owner = allocation.holders.first() == Some(&self.id);
            allocation.holders.remove(&self.id);
            if !was_owner {
                continue;
            }
            let (bytes, heir) = (allocation.bytes, allocation.holders.first().copied());
            state.consumers[r.consumer].held -= bytes;
            match heir {
                None => {
                    state.allocations.remove(&address);
                    freed += bytes;
                }
                Some(next) => {
                    // The charge passes to the next holder.
                    if let Some(heir) = state.reservations.get_mut(&next) {
                        heir.owned += bytes;
                        let consumer = heir.consumer;
                        let c = &mut state.consumers[consumer];
                        c.held += bytes;
                        c.peak = c.peak.max(c.held);
                    }
                }
            }
        }
        state.used -= freed;
        state.plain -= r.plain;
        follow_host(&mut state);
        drop(state);
        drop(handles);
        if freed > 0 {
            shared.room.notify_all();
        }
    }
}

/// One allocation a batch references.
struct Extent {
    address: usize,
    bytes: usize,
    buffer: Buffer,
}

/// The distinct allocations a batch references, each with its largest extent.
fn batch_buffers(batch: &RecordBatch) -> Vec<Extent> {
    distinct_buffers(batch.columns())
}

/// The distinct allocations some arrays reference, each with its largest extent.
fn distinct_buffers(arrays: &[ArrayRef]) -> Vec<Extent> {
    let mut out = Vec::new();
    for array in arrays {
        collect_array(&array.to_data(), &mut out);
    }
    out.sort_unstable_by_key(|e| e.address);
    // Keep the largest extent per address.
    out.dedup_by(|later, earlier| {
        if later.address == earlier.address {
            earlier.bytes = earlier.bytes.max(later.bytes);
            true
        } else {
            false
        }
    });
    out
}

/// Bytes of the distinct allocations a batch references (what reserving it alone costs).
pub fn batch_memory(batch: &RecordBatch) -> usize {
    arrays_memory(batch.columns())
}

/// Bytes of the distinct allocations some arrays reference: slices of one buffer count it
/// once, and whole.
pub fn arrays_memory(arrays: &[ArrayRef]) -> usize {
    distinct_buffers(arrays).iter().map(|e| e.bytes).sum()
}

fn collect_array(data: &ArrayData, out: &mut Vec<Extent>) {
    for buffer in data.buffers() {
        push_buffer(buffer, out);
    }
    if let Some(nulls) = data.nulls() {
        push_buffer(nulls.buffer(), out);
    }
    for child in data.child_data() {
        collect_array(child, out);
    }
}

fn push_buffer(buffer: &Buffer, out: &mut Vec<Extent>) {
    let bytes = match buffer.capacity() {
        0 => buffer.ptr_offset() + buffer.len(),
        capacity => capacity,
    };
    if bytes > 0 {
        out.push(Extent {
            address: buffer.data_ptr().as_ptr() as usize,
            bytes,
            buffer: buffer.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    fn batch(n: usize) -> RecordBatch {
        let ints = Int64Array::from_iter_values(0..n as i64);
        let strings = StringArray::from_iter_values((0..n).map(|i| format!("s{i}")));
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("i", DataType::Int64, false),
                Field::new("s", DataType::Utf8, false),
            ])),
            vec![Arc::new(ints), Arc::new(strings)],
        )
        .unwrap()
    }

    fn held(pool: &MemoryPool) -> usize {
        pool.snapshot().consumers.iter().map(|c| c.held).sum()
    }

    #[test]
    fn a_slice_costs_its_whole_allocation_and_shared_buffers_count_once() {
        let pool = MemoryPool::new(1 << 30);
        let a = pool.consumer("a");
        let b = pool.consumer("b");
        let big = batch(100_000);
        let whole = batch_memory(&big);
        let one_row = big.slice(5, 1);
        assert_eq!(
            batch_memory(&one_row),
            whole,
            "a slice references whole allocations"
        );

        let r1 = a.reserve_batch(&one_row, Admission::Now).unwrap();
        assert_eq!(pool.used(), whole);
        let r2 = b
            .reserve_batch(&big.slice(50_000, 10), Admission::Now)
            .unwrap();
        assert_eq!(pool.used(), whole, "the second holder adds nothing");
        assert_eq!(held(&pool), pool.used());
        assert_eq!((r1.owned(), r2.owned()), (whole, 0));

        // The owner lets go: the charge passes to the other holder, the pool stays put.
        drop(r1);
        assert_eq!(pool.used(), whole);
        assert_eq!(r2.owned(), whole);
        let snap = pool.snapshot();
        assert_eq!((snap.consumers[0].held, snap.consumers[1].held), (0, whole));
        drop(r2);
        assert_eq!(pool.used(), 0);
        assert_eq!(pool.peak(), whole);
    }

    #[test]
    fn rows_waiting_for_input_never_keep_the_source_waiting() {
        let size = batch_memory(&batch(10_000));
        // A limit smaller than one batch: only a batch alone gets through.
        let pool = MemoryPool::new(size / 2);
        let cancel = CancelToken::new();
        let wait = Admission::Wait {
            headroom: 0,
            cancel: &cancel,
        };
        let source = pool.consumer("source");
        let leftover = pool.consumer_awaiting_input("rows short of a batch");
        // Rows held until the next batch arrives: the next batch must get in.
        let _waiting = leftover.reserve_batch(&batch(100), Admission::Now).unwrap();
        let next = source.reserve_batch(&batch(10_000), wait).unwrap();
        // Held by an ordinary holder (it drains by itself), a batch keeps the source waiting.
        let pool2 = pool.clone();
        let blocked = std::thread::spawn(move || {
            let cancel = CancelToken::new();
            pool2.consumer("late").reserve_batch(
                &batch(10_000),
                Admission::Wait {
                    headroom: 0,
                    cancel: &cancel,
                },
            )
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !blocked.is_finished(),
            "waits while a draining batch is held"
        );
        drop(next);
        assert!(blocked.join().unwrap().is_ok());
    }

    #[test]
    fn moving_between_consumers_keeps_the_sum() {
        let pool = MemoryPool::new(1 << 30);
        let (q, s) = (pool.consumer("queue"), pool.consumer("stage"));
        let b = batch(1000);
        let r = q.reserve_batch(&b, Admission::Now).unwrap();
        r.move_to(&s);
        let snap = pool.snapshot();
        assert_eq!(snap.consumers[0].held, 0);
        assert_eq!(snap.consumers[1].held, batch_memory(&b));
        assert_eq!(held(&pool), pool.used());
        let plain = q.reserve_bytes(123, Admission::Now).unwrap();
        assert_eq!(pool.used(), batch_memory(&b) + 123);
        drop((r, plain));
        assert_eq!((pool.used(), held(&pool)), (0, 0));
    }

    #[test]
    fn the_source_waits_for_room_and_cancellation_wakes_it() {
        let one = batch(10_000);
        let size = batch_memory(&one);
        let pool = MemoryPool::new(size * 2);
        let c = pool.consumer("source");
        let cancel = CancelToken::new();
        let wait = Admission::Wait {
            headroom: 0,
            cancel: &cancel,
        };
        let r1 = c.reserve_batch(&batch(10_000), wait).unwrap();
        let r2 = c.reserve_batch(&batch(10_000), wait).unwrap();
        // Full: a third waits until one is released.
        let pool2 = pool.clone();
        let waiter = std::thread::spawn(move || {
            let cancel = CancelToken::new();
            let c = pool2.consumer("late");
            c.reserve_batch(
                &batch(10_000),
                Admission::Wait {
                    headroom: 0,
                    cancel: &cancel,
                },
            )
            .map(|r| r.owned())
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished());
        drop(r1);
        assert_eq!(waiter.join().unwrap().unwrap(), size);
        // Cancelled while waiting.
        let cancel2 = CancelToken::new();
        let c2 = c.clone();
        let cancel_in = cancel2.clone();
        let blocked = std::thread::spawn(move || {
            let extra = batch(10_000);
            let _keep = c2.reserve_batch(&extra, Admission::Now).unwrap();
            c2.reserve_batch(
                &batch(10_000),
                Admission::Wait {
                    headroom: 0,
                    cancel: &cancel_in,
                },
            )
            .map(|_| ())
        });
        std::thread::sleep(Duration::from_millis(50));
        cancel2.cancel();
        assert!(matches!(
            blocked.join().unwrap(),
            Err(EngineError::Cancelled)
        ));
        drop(r2);
    }

    /// What the tests below make the process measure (bytes grown since the pool started),
    /// and how many trims they saw.
    static READING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static TRIMS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    /// The tests share the statics above: one at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    fn pool_measuring_reading(limit: usize, trim: fn()) -> MemoryPool {
        use std::sync::atomic::Ordering::SeqCst;
        READING.store(0, SeqCst);
        TRIMS.store(0, SeqCst);
        let process = ProcessMemory::with_reader(Box::new(|| Some(READING.load(SeqCst))), trim);
        MemoryPool::with_process(limit, process)
    }

    #[test]
    fn memory_outside_the_books_makes_the_source_give_memory_back_first() {
        use std::sync::atomic::Ordering::SeqCst;
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let size = batch_memory(&batch(10_000));
        /// Returns a batch's worth of the allocator's retention.
        fn trim() {
            TRIMS.fetch_add(1, SeqCst);
            READING.fetch_sub(batch_memory(&batch(10_000)), SeqCst);
        }
        let pool = pool_measuring_reading(size * 3, trim);
        let cancel = CancelToken::new();
        let wait = Admission::Wait {
            headroom: 0,
            cancel: &cancel,
        };
        let source = pool.consumer("source");
        let _held = source.reserve_batch(&batch(10_000), wait).unwrap();
        // The held batch, and 1.5 batches outside the books: 1 + 1 new + 1.5 > 3. The books
        // alone would admit the batch, the process would not; a trim returns a batch's
        // worth, then it fits.
        READING.store(size + size * 3 / 2, SeqCst);
        std::thread::sleep(Duration::from_millis(30)); // past the reuse of the last figure
        let _second = source.reserve_batch(&batch(10_000), wait).unwrap();
        assert_eq!(TRIMS.load(SeqCst), 1, "the allocator is asked first");
    }

    #[test]
    fn memory_a_trim_cannot_return_leaves_the_batches_a_quarter_of_the_limit() {
        use std::sync::atomic::Ordering::SeqCst;
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let size = batch_memory(&batch(10_000));
        fn trim() {
            TRIMS.fetch_add(1, SeqCst);
        }
        // A quarter of the limit is two batches.
        let pool = pool_measuring_reading(size * 8, trim);
        let cancel = CancelToken::new();
        let wait = Admission::Wait {
            headroom: 0,
            cancel: &cancel,
        };
        let source = pool.consumer("source");
        let first = source.reserve_batch(&batch(10_000), wait).unwrap();
        // A model of 10 batches loaded by the user's function: no trim returns it, and the
        // source must neither ignore it nor stall because of it.
        READING.store(size * 11, SeqCst);
        std::thread::sleep(Duration::from_millis(30)); // past the reuse of the last figure
        let _second = source.reserve_batch(&batch(10_000), wait).unwrap();
        std::thread::scope(|s| {
            let third = s.spawn(|| source.reserve_batch(&batch(10_000), wait).unwrap());
            std::thread::sleep(Duration::from_millis(300));
            assert!(!third.is_finished(), "a third batch exceeds the quarter");
            assert!(TRIMS.load(SeqCst) >= 1, "the allocator was asked first");
            drop(first);
            let _third = third.join().unwrap();
            assert_eq!(pool.used(), size * 2);
        });
    }

    #[test]
    fn the_allocator_is_asked_before_the_batches_quarter_is_used() {
        use std::sync::atomic::Ordering::SeqCst;
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let size = batch_memory(&batch(10_000));
        /// Returns everything outside the books: retention of freed batches.
        fn trim() {
            TRIMS.fetch_add(1, SeqCst);
            READING.store(batch_memory(&batch(10_000)) * 2, SeqCst);
        }
        // A quarter of the limit is two batches.
        let pool = pool_measuring_reading(size * 8, trim);
        let cancel = CancelToken::new();
        let wait = Admission::Wait {
            headroom: 0,
            cancel: &cancel,
        };
        let source = pool.consumer("source");
        let _first = source.reserve_batch(&batch(10_000), wait).unwrap();
        // Ten batches of retention: the second batch is within the quarter, but the process
        // is over the limit, so the allocator gives back its free pages first.
        READING.store(size * 11, SeqCst);
        std::thread::sleep(Duration::from_millis(30)); // past the reuse of the last figure
        let _second = source.reserve_batch(&batch(10_000), wait).unwrap();
        assert_eq!(TRIMS.load(SeqCst), 1);
    }

    #[test]
    fn a_batch_larger_than_the_limit_passes_alone() {
        let pool = MemoryPool::new(16);
        let cancel = CancelToken::new();
        let r = pool
            .consumer("source")
            .reserve_batch(
                &batch(1000),
                Admission::Wait {
                    headroom: 0,
                    cancel: &cancel,
                },
            )
            .unwrap();
        assert!(pool.used() > pool.limit());
        drop(r);
    }
}
