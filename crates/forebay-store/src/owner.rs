//! The owner's object table: states, pins, LRU eviction to forebay-spill and restore.
//!
//! One mutex guards the table and the allocator; it is never held across disk I/O. An
//! object moves through these places:
//!
//! ```text
//!  create ──> Writing ──seal──> Resident ──evict (spill, free region)──> Spilled
//!     │abort/creator died          ▲  │                                      │
//!     ▼                            │  └── pinned objects are never evicted    │ get
//!   freed                          └──────────── Restoring <─────────────────┘
//! ```
//!
//! Unpinned resident objects sit in an LRU list ordered by when they were sealed or last
//! released. To make room, the oldest is taken off the list, pinned by the evictor, written
//! to the spill area with the lock released, and its region freed if nobody pinned it in the
//! meantime (if someone did, it simply stays resident). Objects are immutable, so a spilled
//! copy stays valid after a restore and evicting the same object again costs no I/O.
//!
//! Waiters (a put that found no room, a get of an object being restored) sleep on one
//! condition variable, woken whenever an unpin, delete, eviction or restore finishes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use forebay_spill::{SpillArea, SpillLocation, SpillObject};

use crate::arena::{align_up, Allocator, Arena};
use crate::error::{Result, StoreError};
use crate::layout::{Format, ObjectHeader, ObjectId};
use crate::StoreStats;

/// Eviction writes at least this many bytes per spill round (bounded by 1/8 of the
/// capacity), so that many small objects go to disk in one file.
const EVICT_ROUND_MIN: usize = 4 << 20;

/// Who is writing an object that is not sealed yet: the owner process itself or an attached
/// connection (whose unsealed objects are freed when it disconnects).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Creator {
    Local,
    Connection(u64),
}

#[derive(Debug)]
enum Place {
    Writing { offset: usize, creator: Creator },
    Resident { offset: usize },
    Spilled,
    Restoring,
}

struct Entry {
    header: ObjectHeader,
    place: Place,
    pins: u32,
    /// Deleted while pinned (or while moving): the region is freed at the last unpin.
    deleted: bool,
    /// Key in the LRU list while resident, sealed and unpinned.
    lru_key: Option<u64>,
    /// A verified copy on disk (objects are immutable, so it stays valid).
    spilled: Option<SpillLocation>,
}

impl Entry {
    fn alloc_len(&self) -> usize {
        align_up(self.header.region_len())
    }
}

#[derive(Default)]
struct Counters {
    puts: u64,
    spilled_objects: u64,
    spilled_bytes: u64,
    restored_objects: u64,
    restored_bytes: u64,
    evictions: u64,
}

struct Table {
    alloc: Allocator,
    objects: HashMap<ObjectId, Entry>,
    lru: BTreeMap<u64, ObjectId>,
    tick: u64,
    /// Evictions whose spill I/O is under way (room is coming).
    evicting: usize,
    counters: Counters,
}

impl Table {
    fn lru_insert(&mut self, id: ObjectId) {
        self.tick += 1;
        let key = self.tick;
        if let Some(e) = self.objects.get_mut(&id) {
            if let Some(old) = e.lru_key.replace(key) {
                self.lru.remove(&old);
            }
            self.lru.insert(key, id);
        }
    }

    fn lru_remove(&mut self, id: ObjectId) {
        if let Some(e) = self.objects.get_mut(&id) {
            if let Some(key) = e.lru_key.take() {
                self.lru.remove(&key);
            }
        }
    }
}

/// The owner's state, shared by the owner's handles, pins and the connection threads.
pub(crate) struct OwnerCore {
    dir: PathBuf,
    arena: Arc<Arena>,
    nonce: u64,
    next_id: AtomicU64,
    table: Mutex<Table>,
    changed: Condvar,
    spill: Option<SpillArea>,
    put_timeout: Duration,
}

/// Bytes of an arena region handed to the spill writer without copying; keeps the mapping
/// alive. The region is pinned by the evictor for as long as the spill needs it.
struct RegionBytes {
    arena: Arc<Arena>,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for RegionBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the region holds a sealed (immutable) object pinned by the evictor until
        // the spill round that owns these bytes has finished.
        unsafe { self.arena.slice(self.offset, self.len) }
    }
}

impl OwnerCore {
    pub fn new(
        dir: PathBuf,
        arena: Arc<Arena>,
        nonce: u64,
        spill: Option<SpillArea>,
        put_timeout: Duration,
    ) -> OwnerCore {
        let alloc = Allocator::new(arena.capacity());
        OwnerCore {
            dir,
            arena,
            nonce,
            next_id: AtomicU64::new(1),
            table: Mutex::new(Table {
                alloc,
                objects: HashMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                evicting: 0,
                counters: Counters::default(),
            }),
            changed: Condvar::new(),
            spill,
            put_timeout,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock would be a bug in this module; the table is still
        // structurally valid (every mutation is a few assignments), so keep serving.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait_until<'a>(
        &self,
        guard: MutexGuard<'a, Table>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, Table>, bool) {
        match deadline {
            None => (
                self.changed.wait(guard).unwrap_or_else(|p| p.into_inner()),
                false,
            ),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return (guard, true);
                }
                let (g, t) = self
                    .changed
                    .wait_timeout(guard, d - now)
                    .unwrap_or_else(|p| p.into_inner());
                (g, t.timed_out() && Instant::now() >= d)
            }
        }
    }

    fn not_found(&self, id: ObjectId) -> StoreError {
        StoreError::NotFound {
            path: self.dir.clone(),
            id,
        }
    }

    /// Find room for `len` bytes, evicting least recently used objects and waiting up to the
    /// put timeout for pins to go. The lock may be released and retaken in between.
    fn allocate<'a>(
        &'a self,
        mut table: MutexGuard<'a, Table>,
        len: usize,
    ) -> Result<(MutexGuard<'a, Table>, usize)> {
        let len = align_up(len.max(1));
        if len > table.alloc.capacity() {
            return Err(StoreError::TooLarge {
                path: self.dir.clone(),
                requested: len as u64,
                capacity: table.alloc.capacity() as u64,
            });
        }
        let start = Instant::now();
        let deadline = start + self.put_timeout;
        loop {
            if let Some(offset) = table.alloc.allocate(len) {
                return Ok((table, offset));
            }
            if !table.lru.is_empty() && self.spill.is_some() {
                table = self.evict(table, len)?;
                continue;
            }
            // Nothing evictable now: wait for an unpin, a delete or another eviction.
            let (t, timed_out) = self.wait_until(table, Some(deadline));
            table = t;
            let evictable = self.spill.is_some() && !table.lru.is_empty();
            if timed_out && table.evicting == 0 && !evictable {
                if let Some(offset) = table.alloc.allocate(len) {
                    return Ok((table, offset));
                }
                return Err(StoreError::Full {
                    path: self.dir.clone(),
                    requested: len as u64,
                    free: table.alloc.free_bytes() as u64,
                    capacity: table.alloc.capacity() as u64,
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
        }
    }

    /// Move least recently used unpinned objects out of memory: at least `needed` bytes
    /// of them (and at least a few MiB, so that many small objects leave in one spill round,
    /// one file) unless the LRU list runs out first.
    fn evict<'a>(
        &'a self,
        mut table: MutexGuard<'a, Table>,
        needed: usize,
    ) -> Result<MutexGuard<'a, Table>> {
        let target = needed.max(EVICT_ROUND_MIN.min(table.alloc.capacity() / 8));
        // (id, offset, region_len); each victim is pinned by the evictor while it is written.
        let mut victims: Vec<(ObjectId, usize, usize)> = Vec::new();
        let mut to_write = Vec::new();
        let mut chosen = 0usize;
        while chosen < target {
            let Some((&key, &id)) = table.lru.iter().next() else {
                break;
            };
            table.lru.remove(&key);
            let e = table
                .objects
                .get_mut(&id)
                .expect("LRU entries are in the table");
            e.lru_key = None;
            let Place::Resident { offset } = e.place else {
                unreachable!("only resident objects are in the LRU list")
            };
            e.pins += 1;
            chosen += e.alloc_len();
            let region_len = e.header.region_len();
            if e.spilled.is_none() {
                to_write.push(victims.len());
            }
            victims.push((id, offset, region_len));
        }
        let mut copies: Vec<Option<SpillLocation>> = vec![None; victims.len()];
        let mut spill_error = None;
        if !to_write.is_empty() {
            table.evicting += 1;
            drop(table);
            let spill = self
                .spill
                .as_ref()
                .expect("evict is only called with a spill area");
            let objects = to_write
                .iter()
                .map(|&v| {
                    let (id, offset, len) = victims[v];
                    SpillObject {
                        id: id.0 as u64,
                        buffers: vec![Bytes::from_owner(RegionBytes {
                            arena: self.arena.clone(),
                            offset,
                            len,
                        })],
                    }
                })
                .collect();
            match spill.spill(objects) {
                Ok(locs) => {
                    for (&v, loc) in to_write.iter().zip(locs) {
                        copies[v] = Some(loc);
                    }
                }
                Err(e) => spill_error = Some(e),
            }
            table = self.lock();
            table.evicting -= 1;
            if spill_error.is_none() {
                table.counters.spilled_objects += to_write.len() as u64;
                table.counters.spilled_bytes +=
                    to_write.iter().map(|&v| victims[v].2 as u64).sum::<u64>();
            }
        }
        let t = &mut *table;
        for ((id, offset, _), copy) in victims.into_iter().zip(copies) {
            let e = t
                .objects
                .get_mut(&id)
                .expect("pinned entries stay in the table");
            e.pins -= 1;
            if copy.is_some() {
                e.spilled = copy;
            }
            if e.pins > 0 {
                continue; // pinned while we wrote it: stays resident (with a copy on disk)
            }
            let alloc_len = e.alloc_len();
            if e.deleted {
                t.objects.remove(&id);
                t.alloc.free(offset, alloc_len);
            } else if e.spilled.is_some() {
                e.place = Place::Spilled;
                t.alloc.free(offset, alloc_len);
                t.counters.evictions += 1;
            } else {
                // Its spill failed: it stays resident and evictable.
                t.lru_insert(id);
            }
        }
        self.changed.notify_all();
        match spill_error {
            Some(source) => Err(StoreError::Spill {
                path: self.dir.clone(),
                id: ObjectId(0),
                source: Box::new(source),
            }),
            None => Ok(table),
        }
    }

    pub fn create(
        &self,
        format: Format,
        meta_len: usize,
        data_len: usize,
        creator: Creator,
    ) -> Result<(ObjectId, usize)> {
        let id = ObjectId(
            ((self.nonce as u128) << 64) | self.next_id.fetch_add(1, Ordering::Relaxed) as u128,
        );
        let header = ObjectHeader {
            id,
            format,
            meta_len,
            data_len,
        };
        let region_len = header
            .data_offset()
            .checked_add(data_len)
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(|| StoreError::TooLarge {
                path: self.dir.clone(),
                requested: u64::MAX,
                capacity: self.arena.capacity() as u64,
            })?;
        let table = self.lock();
        let (mut table, offset) = self.allocate(table, region_len)?;
        // SAFETY: the region was just allocated to this object; nobody else can see it.
        unsafe { self.arena.slice_mut(offset, crate::layout::HEADER_LEN) }
            .copy_from_slice(&header.encode());
        table.objects.insert(
            id,
            Entry {
                header,
                place: Place::Writing { offset, creator },
                pins: 0,
                deleted: false,
                lru_key: None,
                spilled: None,
            },
        );
        Ok((id, offset))
    }

    pub fn seal(&self, id: ObjectId, creator: Creator) -> Result<()> {
        let mut table = self.lock();
        let e = table
            .objects
            .get_mut(&id)
            .ok_or_else(|| self.not_found(id))?;
        match e.place {
            Place::Writing { offset, creator: c } if c == creator => {
                e.place = Place::Resident { offset };
            }
            _ => {
                return Err(StoreError::Invalid {
                    path: self.dir.clone(),
                    reason: format!("object {id} is not being written by this process"),
                })
            }
        }
        table.counters.puts += 1;
        table.lru_insert(id);
        self.changed.notify_all();
        Ok(())
    }

    /// Free an object that was created but not sealed.
    pub fn abort(&self, id: ObjectId, creator: Creator) {
        let mut table = self.lock();
        if let Some(e) = table.objects.get(&id) {
            if let Place::Writing { offset, creator: c } = e.place {
                if c == creator {
                    let len = e.alloc_len();
                    table.objects.remove(&id);
                    table.alloc.free(offset, len);
                    self.changed.notify_all();
                }
            }
        }
    }

    /// Pin a sealed object in memory, restoring it from disk if it was evicted; returns
    /// the offset of its region. Each successful call must be matched by one `unpin`.
    pub fn pin(&self, id: ObjectId) -> Result<usize> {
        let mut table = self.lock();
        loop {
            let e = match table.objects.get_mut(&id) {
                Some(e) if !e.deleted => e,
                _ => return Err(self.not_found(id)),
            };
            match e.place {
                Place::Resident { offset } => {
                    e.pins += 1;
                    table.lru_remove(id);
                    return Ok(offset);
                }
                Place::Writing { .. } => {
                    return Err(StoreError::NotSealed {
                        path: self.dir.clone(),
                        id,
                    })
                }
                Place::Restoring => table = self.wait_until(table, None).0,
                Place::Spilled => return self.restore(table, id),
            }
        }
    }

    fn restore<'a>(&'a self, mut table: MutexGuard<'a, Table>, id: ObjectId) -> Result<usize> {
        let (len, loc) = {
            let e = table.objects.get_mut(&id).expect("caller found the entry");
            e.place = Place::Restoring;
            let loc = e
                .spilled
                .clone()
                .expect("spilled objects have a copy on disk");
            (e.header.region_len(), loc)
        };
        let (mut table, offset) = match self.allocate(table, len) {
            Ok(x) => x,
            Err(err) => {
                let mut table = self.lock();
                self.finish_failed_restore(&mut table, id);
                return Err(err);
            }
        };
        table
            .objects
            .get_mut(&id)
            .expect("restoring entries stay in the table")
            .pins += 1;
        drop(table);
        let spill = self
            .spill
            .as_ref()
            .expect("spilled objects imply a spill area");
        // SAFETY: the region was just allocated for this restore; the entry is `Restoring`,
        // so nobody else reads or writes it until we publish it below.
        let region = unsafe { self.arena.slice_mut(offset, len) };
        let result = spill.restore_into(&loc, &mut [region]);
        let mut table = self.lock();
        let t = &mut *table;
        let e = t
            .objects
            .get_mut(&id)
            .expect("restoring entries stay in the table");
        let result = result.map_err(|source| StoreError::Spill {
            path: self.dir.clone(),
            id,
            source: Box::new(source),
        });
        let header_ok = result.as_ref().is_ok()
            && ObjectHeader::decode(
                // SAFETY: restored region, still exclusively ours (entry is `Restoring`).
                unsafe { self.arena.slice(offset, crate::layout::HEADER_LEN) },
            )
            .is_ok_and(|h| h == e.header);
        let outcome = match result {
            Ok(()) if header_ok => {
                e.place = Place::Resident { offset };
                t.counters.restored_objects += 1;
                t.counters.restored_bytes += len as u64;
                if e.deleted {
                    // Deleted while we restored it: hand nothing out.
                    e.pins -= 1;
                    if e.pins == 0 {
                        let alloc_len = e.alloc_len();
                        t.objects.remove(&id);
                        t.alloc.free(offset, alloc_len);
                    }
                    Err(self.not_found(id))
                } else {
                    Ok(offset)
                }
            }
            other => {
                e.pins -= 1;
                let alloc_len = e.alloc_len();
                t.alloc.free(offset, alloc_len);
                self.finish_failed_restore(t, id);
                Err(other.err().unwrap_or_else(|| StoreError::Invalid {
                    path: self.dir.clone(),
                    reason: format!("object {id}: restored header does not match the table"),
                }))
            }
        };
        self.changed.notify_all();
        outcome
    }

    fn finish_failed_restore(&self, table: &mut Table, id: ObjectId) {
        if let Some(e) = table.objects.get_mut(&id) {
            e.place = Place::Spilled;
            if e.deleted && e.pins == 0 {
                table.objects.remove(&id);
            }
        }
        self.changed.notify_all();
    }

    pub fn unpin(&self, id: ObjectId) {
        let mut table = self.lock();
        let t = &mut *table;
        let Some(e) = t.objects.get_mut(&id) else {
            return;
        };
        debug_assert!(e.pins > 0, "unpin of unpinned object {id}");
        e.pins = e.pins.saturating_sub(1);
        if e.pins == 0 {
            if let Place::Resident { offset } = e.place {
                if e.deleted {
                    let len = e.alloc_len();
                    t.objects.remove(&id);
                    t.alloc.free(offset, len);
                } else {
                    t.lru_insert(id);
                }
            }
            self.changed.notify_all();
        }
    }

    /// Delete an object; its memory is freed now, or at the last unpin of a pinned object.
    /// Returns whether it existed.
    pub fn delete(&self, id: ObjectId) -> bool {
        let mut table = self.lock();
        let t = &mut *table;
        let Some(e) = t.objects.get_mut(&id) else {
            return false;
        };
        if e.deleted {
            return false;
        }
        if matches!(e.place, Place::Writing { .. }) {
            return false; // unsealed objects belong to their writer (abort frees them)
        }
        e.deleted = true;
        if e.pins == 0 {
            match e.place {
                Place::Resident { offset } => {
                    let len = e.alloc_len();
                    t.lru_remove(id);
                    t.objects.remove(&id);
                    t.alloc.free(offset, len);
                }
                Place::Spilled => {
                    t.objects.remove(&id);
                }
                // A restore in flight finishes and then frees it.
                Place::Restoring | Place::Writing { .. } => {}
            }
        }
        self.changed.notify_all();
        true
    }

    pub fn contains(&self, id: ObjectId) -> bool {
        let table = self.lock();
        table
            .objects
            .get(&id)
            .is_some_and(|e| !e.deleted && !matches!(e.place, Place::Writing { .. }))
    }

    pub fn stats(&self) -> StoreStats {
        let table = self.lock();
        let mut s = StoreStats {
            capacity: table.alloc.capacity() as u64,
            bytes_used: (table.alloc.capacity() - table.alloc.free_bytes()) as u64,
            free_extents: table.alloc.free_extents() as u64,
            largest_free: table.alloc.largest_free() as u64,
            puts: table.counters.puts,
            spilled_objects: table.counters.spilled_objects,
            spilled_bytes: table.counters.spilled_bytes,
            restored_objects: table.counters.restored_objects,
            restored_bytes: table.counters.restored_bytes,
            evictions: table.counters.evictions,
            ..StoreStats::default()
        };
        for e in table.objects.values() {
            if e.deleted || matches!(e.place, Place::Writing { .. }) {
                continue;
            }
            s.objects += 1;
            match e.place {
                Place::Resident { .. } => s.resident_objects += 1,
                Place::Spilled => s.objects_on_disk += 1,
                _ => {}
            }
            if e.pins > 0 {
                s.pinned_objects += 1;
            }
        }
        s
    }
}
