//! A new store's configuration, and the counters a store reports.

use std::path::PathBuf;
use std::time::Duration;

/// Configuration of a new store (the owner side).
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub(crate) dir: Option<PathBuf>,
    pub(crate) capacity: usize,
    pub(crate) spill_dirs: Option<Vec<PathBuf>>,
    pub(crate) spill: bool,
    pub(crate) put_timeout: Duration,
    pub(crate) prefault: bool,
}

impl StoreConfig {
    /// A store of `capacity` bytes in a new directory under `/dev/shm`, spilling to a
    /// directory under the system temp dir, with a 10 s put timeout.
    pub fn new(capacity: usize) -> StoreConfig {
        StoreConfig {
            dir: None,
            capacity,
            spill_dirs: None,
            spill: true,
            put_timeout: Duration::from_secs(10),
            prefault: false,
        }
    }

    /// Put the store in this directory (created 0700; may exist if private and empty or
    /// holding a dead store's files). Use a tmpfs directory to keep objects in memory.
    pub fn with_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Spill evicted objects into these directories.
    pub fn with_spill_dirs<I, P>(mut self, dirs: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.spill_dirs = Some(dirs.into_iter().map(Into::into).collect());
        self.spill = true;
        self
    }

    /// Never spill: a full store makes puts wait, then fail.
    pub fn without_spill(mut self) -> Self {
        self.spill = false;
        self
    }

    /// How long a put waits for room when everything resident is pinned.
    pub fn with_put_timeout(mut self, timeout: Duration) -> Self {
        self.put_timeout = timeout;
        self
    }

    /// Touch every page of the arena at creation, so that first writes run at memcpy
    /// speed (commits the whole capacity up front).
    pub fn with_prefault(mut self, prefault: bool) -> Self {
        self.prefault = prefault;
        self
    }
}

/// A snapshot of the store's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub capacity: u64,
    /// Bytes of the arena allocated to objects (64-byte granularity, headers included).
    pub bytes_used: u64,
    pub free_extents: u64,
    pub largest_free: u64,
    /// Sealed, not deleted objects (resident or on disk).
    pub objects: u64,
    pub resident_objects: u64,
    pub objects_on_disk: u64,
    pub pinned_objects: u64,
    pub puts: u64,
    /// Objects (and bytes) written to spill files since the store opened.
    pub spilled_objects: u64,
    pub spilled_bytes: u64,
    pub restored_objects: u64,
    pub restored_bytes: u64,
    /// Regions freed by eviction (a re-eviction of an object with a disk copy costs no I/O).
    pub evictions: u64,
}

impl StoreStats {
    const FIELDS: usize = 14;

    fn as_array(&self) -> [u64; Self::FIELDS] {
        [
            self.capacity,
            self.bytes_used,
            self.free_extents,
            self.largest_free,
            self.objects,
            self.resident_objects,
            self.objects_on_disk,
            self.pinned_objects,
            self.puts,
            self.spilled_objects,
            self.spilled_bytes,
            self.restored_objects,
            self.restored_bytes,
            self.evictions,
        ]
    }

    pub(crate) fn to_le_bytes(self) -> Vec<u8> {
        self.as_array()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    pub(crate) fn from_le_bytes(b: &[u8]) -> Option<StoreStats> {
        if b.len() < Self::FIELDS * 8 {
            return None;
        }
        let v = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        Some(StoreStats {
            capacity: v(0),
            bytes_used: v(1),
            free_extents: v(2),
            largest_free: v(3),
            objects: v(4),
            resident_objects: v(5),
            objects_on_disk: v(6),
            pinned_objects: v(7),
            puts: v(8),
            spilled_objects: v(9),
            spilled_bytes: v(10),
            restored_objects: v(11),
            restored_bytes: v(12),
            evictions: v(13),
        })
    }

    /// (name, value) pairs, for bindings.
    pub fn fields(&self) -> [(&'static str, u64); Self::FIELDS] {
        let names = [
            "capacity",
            "bytes_used",
            "free_extents",
            "largest_free",
            "objects",
            "resident_objects",
            "objects_on_disk",
            "pinned_objects",
            "puts",
            "spilled_objects",
            "spilled_bytes",
            "restored_objects",
            "restored_bytes",
            "evictions",
        ];
        let values = self.as_array();
        std::array::from_fn(|i| (names[i], values[i]))
    }
}
