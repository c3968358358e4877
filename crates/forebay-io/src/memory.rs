//! Memory a host engine shares with forebay: a pool trait the host implements, and the
//! reservation through which a forebay component (a scan) charges it.
//!
//! ```text
//!  host engine's pool ◄── impl MemoryPool ── register / try_grow / grow / shrink / unregister
//!          ▲
//!          │ Arc<dyn MemoryPool>
//!  MemoryReservation ("forebay scan of s3://b/x", 48 MiB)
//!          │ try_grow before a row group is fetched, shrink once its batches are handed
//!          │ on, everything given back (and unregistered) on drop
//!          ▼
//!  forebay-parquet's scan (ParquetDatasetBuilder::with_memory_pool)
//! ```
//!
//! The trait follows the shape query engines use (DataFusion's `MemoryPool`): a consumer
//! registers, grows and shrinks its reservation, and is unregistered when it goes. A host
//! adapts its own pool in a few lines; [`BoundedPool`] is a ready one (a limit for all its
//! consumers together).

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Who holds a reservation: a name for messages and a process-unique id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MemoryConsumer {
    pub name: String,
    pub id: u64,
}

impl MemoryConsumer {
    /// A consumer with a fresh id.
    pub fn new(name: impl Into<String>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        MemoryConsumer {
            name: name.into(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// A pool refused memory: what was asked, and the pool's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{consumer} asked for {requested} bytes more: {reason}")]
pub struct MemoryRefused {
    pub consumer: String,
    pub requested: usize,
    pub reason: String,
}

/// Memory shared between a host and forebay's components. Implementations are called from
/// any thread, possibly from async tasks: they must not block.
///
/// A host adapts its own pool; here, one that only counts (no limit):
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use forebay_io::memory::{MemoryConsumer, MemoryPool, MemoryRefused};
///
/// #[derive(Debug, Default)]
/// struct Counting(AtomicUsize);
///
/// impl MemoryPool for Counting {
///     fn grow(&self, _: &MemoryConsumer, bytes: usize) {
///         self.0.fetch_add(bytes, Ordering::Relaxed);
///     }
///     fn shrink(&self, _: &MemoryConsumer, bytes: usize) {
///         self.0.fetch_sub(bytes, Ordering::Relaxed);
///     }
///     fn try_grow(&self, c: &MemoryConsumer, bytes: usize) -> Result<(), MemoryRefused> {
///         self.grow(c, bytes);
///         Ok(())
///     }
///     fn reserved(&self) -> usize {
///         self.0.load(Ordering::Relaxed)
///     }
/// }
/// // ParquetDataset::builder(source).with_memory_pool(Arc::new(Counting::default()))
/// ```
pub trait MemoryPool: Send + Sync + fmt::Debug {
    /// A consumer starts (before its first `grow`).
    fn register(&self, _consumer: &MemoryConsumer) {}
    /// A consumer is gone (after its reservation went back to zero).
    fn unregister(&self, _consumer: &MemoryConsumer) {}
    /// Take `bytes` whatever the limit (for memory that is already held).
    fn grow(&self, consumer: &MemoryConsumer, bytes: usize);
    /// Give back `bytes` taken before.
    fn shrink(&self, consumer: &MemoryConsumer, bytes: usize);
    /// Take `bytes` if the pool allows it.
    fn try_grow(&self, consumer: &MemoryConsumer, bytes: usize) -> Result<(), MemoryRefused>;
    /// Bytes taken by all consumers.
    fn reserved(&self) -> usize;
}

/// One consumer's share of a pool. Everything it holds goes back on drop.
#[derive(Debug)]
pub struct MemoryReservation {
    pool: Arc<dyn MemoryPool>,
    consumer: MemoryConsumer,
    size: usize,
}

impl MemoryReservation {
    /// Register a new consumer named `name` with `pool`, holding nothing yet.
    pub fn new(pool: Arc<dyn MemoryPool>, name: impl Into<String>) -> Self {
        let consumer = MemoryConsumer::new(name);
        pool.register(&consumer);
        MemoryReservation {
            pool,
            consumer,
            size: 0,
        }
    }

    /// Bytes this reservation holds.
    pub fn size(&self) -> usize {
        self.size
    }

    pub fn consumer(&self) -> &MemoryConsumer {
        &self.consumer
    }

    /// Take `bytes` more if the pool allows it.
    pub fn try_grow(&mut self, bytes: usize) -> Result<(), MemoryRefused> {
        self.pool.try_grow(&self.consumer, bytes)?;
        self.size += bytes;
        Ok(())
    }

    /// Take `bytes` more whatever the limit.
    pub fn grow(&mut self, bytes: usize) {
        self.pool.grow(&self.consumer, bytes);
        self.size += bytes;
    }

    /// Give back `bytes` (at most what is held).
    pub fn shrink(&mut self, bytes: usize) {
        let bytes = bytes.min(self.size);
        self.pool.shrink(&self.consumer, bytes);
        self.size -= bytes;
    }
}

impl Drop for MemoryReservation {
    fn drop(&mut self) {
        self.shrink(self.size);
        self.pool.unregister(&self.consumer);
    }
}

/// A pool with one limit for all its consumers together, first come first served. Records
/// the most it ever held.
///
/// ```
/// use std::sync::Arc;
/// use forebay_io::memory::{BoundedPool, MemoryPool, MemoryReservation};
///
/// let pool = Arc::new(BoundedPool::new(1 << 20));
/// let mut scan = MemoryReservation::new(pool.clone(), "a scan");
/// scan.try_grow(768 << 10)?;
/// let mut other = MemoryReservation::new(pool.clone(), "a join");
/// assert!(other.try_grow(512 << 10).is_err()); // over the limit: wait, spill or fail
/// scan.shrink(512 << 10);
/// other.try_grow(512 << 10)?;
/// drop((scan, other)); // everything goes back
/// assert_eq!((pool.reserved(), pool.peak()), (0, 768 << 10));
/// # Ok::<(), forebay_io::memory::MemoryRefused>(())
/// ```
#[derive(Debug)]
pub struct BoundedPool {
    limit: usize,
    reserved: AtomicUsize,
    peak: AtomicUsize,
    consumers: AtomicUsize,
}

impl BoundedPool {
    pub fn new(limit: usize) -> Self {
        BoundedPool {
            limit,
            reserved: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            consumers: AtomicUsize::new(0),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The most the pool's consumers held at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Consumers registered and not yet unregistered.
    pub fn consumers(&self) -> usize {
        self.consumers.load(Ordering::Relaxed)
    }

    fn note_peak(&self, now: usize) {
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
}

impl MemoryPool for BoundedPool {
    fn register(&self, _consumer: &MemoryConsumer) {
        self.consumers.fetch_add(1, Ordering::Relaxed);
    }

    fn unregister(&self, _consumer: &MemoryConsumer) {
        self.consumers.fetch_sub(1, Ordering::Relaxed);
    }

    fn grow(&self, _consumer: &MemoryConsumer, bytes: usize) {
        let now = self.reserved.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.note_peak(now);
    }

    fn shrink(&self, _consumer: &MemoryConsumer, bytes: usize) {
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn try_grow(&self, consumer: &MemoryConsumer, bytes: usize) -> Result<(), MemoryRefused> {
        let granted = self
            .reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(bytes).filter(|now| *now <= self.limit)
            });
        match granted {
            Ok(held) => {
                self.note_peak(held + bytes);
                Ok(())
            }
            Err(held) => Err(MemoryRefused {
                consumer: consumer.name.clone(),
                requested: bytes,
                reason: format!("the pool's limit is {} bytes, {held} are taken", self.limit),
            }),
        }
    }

    fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_grows_within_the_limit_and_gives_everything_back_on_drop() {
        let pool = Arc::new(BoundedPool::new(100));
        let mut a = MemoryReservation::new(pool.clone(), "a");
        let mut b = MemoryReservation::new(pool.clone(), "b");
        assert_eq!(pool.consumers(), 2);
        a.try_grow(60).unwrap();
        let refused = b.try_grow(50).unwrap_err();
        assert_eq!(refused.consumer, "b");
        assert!(refused
            .to_string()
            .contains("limit is 100 bytes, 60 are taken"));
        b.try_grow(40).unwrap();
        b.grow(10); // over the limit: memory already held
        assert_eq!(pool.reserved(), 110);
        a.shrink(1000); // no more than it holds
        assert_eq!((a.size(), pool.reserved()), (0, 50));
        drop(b);
        drop(a);
        assert_eq!(
            (pool.reserved(), pool.consumers(), pool.peak()),
            (0, 0, 110)
        );
    }
}
