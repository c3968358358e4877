//! The arena: one memory-mapped file of fixed capacity, and the allocator that hands out
//! regions of it.
//!
//! The file lives in a tmpfs directory (`/dev/shm` by default), so its pages are memory
//! that any process of the same user can map. The owner and every attached process map the
//! whole file shared; a region is addressed by its byte offset, which means the same thing
//! in every process.
//!
//! Allocation is best fit over free extents kept in two ordered maps (by size, by offset),
//! with immediate coalescing of neighbours on free. Every region starts and ends on a
//! 64-byte boundary (Arrow's recommended alignment), so internal fragmentation is < 64 bytes
//! per object; best fit with coalescing keeps external fragmentation low, and when a request
//! does not fit in any single extent the store evicts more objects (their extents then
//! coalesce) rather than failing while enough bytes are free in pieces.
//!
//! All `unsafe` of the crate that touches the mapping is here: turning (offset, len) into
//! slices. Callers guarantee the region is allocated to them (see the store's states).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

use crate::dir::io_err;
use crate::error::Result;

/// Alignment of every region, and of every object's data within its region.
pub const ALIGN: usize = 64;

/// `len` rounded up to [`ALIGN`].
pub const fn align_up(len: usize) -> usize {
    (len + ALIGN - 1) & !(ALIGN - 1)
}

/// The mapped arena file.
pub struct Arena {
    map: MmapRaw,
    path: PathBuf,
    _file: File,
}

impl Arena {
    /// Create the arena file (0600, must not exist) of `capacity` bytes and map it.
    /// `prefault` touches every page now (MAP_POPULATE) so first puts run at memcpy speed.
    pub fn create(path: &Path, capacity: usize, prefault: bool) -> Result<Arena> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io_err(path, "creating the arena file"))?;
        file.set_len(capacity as u64)
            .map_err(io_err(path, "sizing the arena file"))?;
        let mut options = MmapOptions::new();
        options.len(capacity);
        if prefault {
            options.populate();
        }
        let map = options
            .map_raw(&file)
            .map_err(io_err(path, "mapping the arena file"))?;
        Ok(Arena {
            map,
            path: path.to_path_buf(),
            _file: file,
        })
    }

    /// Map an existing arena file (an attaching process).
    pub fn open(path: &Path) -> Result<Arena> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err(path, "opening the arena file"))?;
        let map = MmapRaw::map_raw(&file).map_err(io_err(path, "mapping the arena file"))?;
        Ok(Arena {
            map,
            path: path.to_path_buf(),
            _file: file,
        })
    }

    pub fn capacity(&self) -> usize {
        self.map.len()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|end| end <= self.map.len()),
            "region {offset}+{len} outside the arena of {} bytes",
            self.map.len()
        );
    }

    /// Address of byte `offset` of the mapping.
    pub fn ptr(&self, offset: usize) -> *mut u8 {
        self.check(offset, 0);
        // SAFETY: offset <= len, so the result is within (or one past) the mapping.
        unsafe { self.map.as_mut_ptr().add(offset) }
    }

    /// The region as a shared slice.
    ///
    /// # Safety
    /// The region must be allocated and not written by anyone for the lifetime of the slice:
    /// sealed objects (immutable) or regions the caller holds exclusively.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        self.check(offset, len);
        // SAFETY: in bounds (checked); the caller guarantees no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(offset), len) }
    }

    /// The region as a mutable slice.
    ///
    /// # Safety
    /// The caller must hold the region exclusively (allocated to it, not yet sealed) and
    /// create at most one such slice at a time.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        self.check(offset, len);
        // SAFETY: in bounds (checked); exclusivity is the caller's guarantee.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(offset), len) }
    }
}

/// Best-fit allocator over `[0, capacity)` in [`ALIGN`]-byte units.
#[derive(Debug)]
pub struct Allocator {
    /// Free extents: offset -> length.
    by_offset: BTreeMap<usize, usize>,
    /// The same extents ordered by (length, offset) for best fit.
    by_size: BTreeSet<(usize, usize)>,
    free: usize,
    capacity: usize,
}

impl Allocator {
    pub fn new(capacity: usize) -> Allocator {
        let capacity = capacity & !(ALIGN - 1);
        let mut a = Allocator {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free: 0,
            capacity,
        };
        if capacity > 0 {
            a.insert(0, capacity);
        }
        a
    }

    fn insert(&mut self, offset: usize, len: usize) {
        self.by_offset.insert(offset, len);
        self.by_size.insert((len, offset));
        self.free += len;
    }

    fn remove(&mut self, offset: usize, len: usize) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(len, offset));
        self.free -= len;
    }

    /// Allocate `len` bytes (rounded up to [`ALIGN`]); `None` when no extent is large enough.
    pub fn allocate(&mut self, len: usize) -> Option<usize> {
        let len = align_up(len.max(1));
        let &(extent_len, offset) = self.by_size.range((len, 0)..).next()?;
        self.remove(offset, extent_len);
        if extent_len > len {
            self.insert(offset + len, extent_len - len);
        }
        Some(offset)
    }

    /// Return a region given out by [`allocate`](Self::allocate) with the same `len`.
    pub fn free(&mut self, offset: usize, len: usize) {
        let mut offset = offset;
        let mut len = align_up(len.max(1));
        debug_assert!(offset + len <= self.capacity);
        if let Some((&prev_off, &prev_len)) = self.by_offset.range(..offset).next_back() {
            debug_assert!(prev_off + prev_len <= offset, "double free at {offset}");
            if prev_off + prev_len == offset {
                self.remove(prev_off, prev_len);
                offset = prev_off;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.by_offset.get(&(offset + len)) {
            self.remove(offset + len, next_len);
            len += next_len;
        }
        self.insert(offset, len);
    }

    pub fn free_bytes(&self) -> usize {
        self.free
    }

    pub fn largest_free(&self) -> usize {
        self.by_size.iter().next_back().map_or(0, |&(len, _)| len)
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of free extents (a fragmentation measure: 1 means no fragmentation).
    pub fn free_extents(&self) -> usize {
        self.by_offset.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn coalesces_back_to_one_extent() {
        let mut a = Allocator::new(64 * 100);
        let x = a.allocate(100).unwrap();
        let y = a.allocate(64).unwrap();
        let z = a.allocate(1000).unwrap();
        assert_eq!((x, y, z), (0, 128, 192));
        a.free(y, 64);
        a.free(x, 100);
        assert_eq!(a.free_extents(), 2);
        a.free(z, 1000);
        assert_eq!(a.free_extents(), 1);
        assert_eq!(a.free_bytes(), 6400);
        assert!(a.allocate(6401).is_none());
        assert_eq!(a.allocate(6400), Some(0));
    }

    proptest! {
        /// Random allocate/free sequences: regions never overlap, stay aligned and inside the
        /// arena, and freeing everything restores one extent of the full capacity.
        #[test]
        fn allocations_never_overlap(ops in proptest::collection::vec((any::<bool>(), 1usize..5000), 1..300)) {
            let cap = 64 * 1024;
            let mut a = Allocator::new(cap);
            let mut live: Vec<(usize, usize)> = Vec::new();
            for (alloc, n) in ops {
                if alloc || live.is_empty() {
                    if let Some(off) = a.allocate(n) {
                        prop_assert_eq!(off % ALIGN, 0);
                        prop_assert!(off + align_up(n) <= cap);
                        for &(o, l) in &live {
                            prop_assert!(off + align_up(n) <= o || o + align_up(l) <= off);
                        }
                        live.push((off, n));
                    } else {
                        prop_assert!(a.largest_free() < align_up(n));
                    }
                } else {
                    let (o, l) = live.swap_remove(n % live.len());
                    a.free(o, l);
                }
                let used: usize = live.iter().map(|&(_, l)| align_up(l)).sum();
                prop_assert_eq!(a.free_bytes() + used, cap);
            }
            for (o, l) in live { a.free(o, l); }
            prop_assert_eq!(a.free_extents(), 1);
            prop_assert_eq!(a.largest_free(), cap);
        }
    }
}
