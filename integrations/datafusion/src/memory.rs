//! DataFusion's memory pool as forebay's: a scan through [`ForebayTable`](crate::ForebayTable)
//! charges the row groups it holds to the session's pool, beside DataFusion's own operators.
//!
//! ```text
//!  forebay scan ── MemoryReservation ── SessionMemoryPool ── one DataFusion reservation
//!   (try_grow before a row group       (forebay_io::memory::   per forebay consumer ──►
//!    is fetched, shrink when handed      MemoryPool)            the session's MemoryPool
//!    on)                                                         (limit, fair share, ...)
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::execution::memory_pool::{
    MemoryConsumer as SessionConsumer, MemoryPool as SessionPool,
    MemoryReservation as SessionReservation,
};
use forebay_io::memory::{MemoryConsumer, MemoryPool, MemoryRefused};

/// A DataFusion session's memory pool, seen by forebay: each forebay consumer holds a
/// reservation of its own in it, named after the consumer.
pub struct SessionMemoryPool {
    pool: Arc<dyn SessionPool>,
    /// By forebay consumer id.
    reservations: Mutex<HashMap<u64, SessionReservation>>,
}

impl SessionMemoryPool {
    pub fn new(pool: Arc<dyn SessionPool>) -> SessionMemoryPool {
        SessionMemoryPool {
            pool,
            reservations: Mutex::new(HashMap::new()),
        }
    }

    /// Run `f` on `consumer`'s reservation (registered on first use).
    fn with<T>(&self, consumer: &MemoryConsumer, f: impl FnOnce(&SessionReservation) -> T) -> T {
        let mut reservations = self.reservations.lock().unwrap_or_else(|p| p.into_inner());
        let reservation = reservations.entry(consumer.id).or_insert_with(|| {
            SessionConsumer::new(consumer.name.clone())
                .with_can_spill(false)
                .register(&self.pool)
        });
        f(reservation)
    }
}

impl std::fmt::Debug for SessionMemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionMemoryPool")
            .field("pool", &self.pool.name())
            .field("reserved", &self.pool.reserved())
            .finish()
    }
}

impl MemoryPool for SessionMemoryPool {
    fn register(&self, consumer: &MemoryConsumer) {
        self.with(consumer, |_| ());
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        // Dropping the reservation frees what it holds and unregisters it.
        let mut reservations = self.reservations.lock().unwrap_or_else(|p| p.into_inner());
        reservations.remove(&consumer.id);
    }

    fn grow(&self, consumer: &MemoryConsumer, bytes: usize) {
        self.with(consumer, |r| r.grow(bytes));
    }

    fn shrink(&self, consumer: &MemoryConsumer, bytes: usize) {
        self.with(consumer, |r| r.shrink(bytes.min(r.size())));
    }

    fn try_grow(&self, consumer: &MemoryConsumer, bytes: usize) -> Result<(), MemoryRefused> {
        self.with(consumer, |r| r.try_grow(bytes))
            .map_err(|e| MemoryRefused {
                consumer: consumer.name.clone(),
                requested: bytes,
                reason: e.to_string(),
            })
    }

    fn reserved(&self) -> usize {
        self.pool.reserved()
    }
}
