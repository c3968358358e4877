//! Proof that spilling copies no payload bytes in user space: a counting global allocator
//! sees every allocation made while a 64 MiB object (four 16 MiB buffers) is spilled, and
//! none of them is anywhere near payload-sized; everything allocated adds up to a few KiB.
//! (A concatenate-then-write path must allocate at least the object's size.) Its own test
//! binary, so no other test allocates concurrently.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use forebay_spill::{SpillArea, SpillConfig, SpillObject};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
static TOTAL: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
            TOTAL.fetch_add(layout.size(), Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
            TOTAL.fetch_add(new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn spilling_allocates_nothing_payload_sized() {
    let dir = tempfile::tempdir().unwrap();
    let area = SpillArea::open(SpillConfig::new([dir.path()])).unwrap();
    let buffers: Vec<Bytes> = (0..4u8).map(|i| Bytes::from(vec![i; 16 << 20])).collect();
    let object = SpillObject {
        id: 1,
        buffers: buffers.clone(),
    };

    COUNTING.store(true, Ordering::SeqCst);
    let locations = area.spill(vec![object]).unwrap();
    COUNTING.store(false, Ordering::SeqCst);

    let largest = LARGEST.load(Ordering::SeqCst);
    let total = TOTAL.load(Ordering::SeqCst);
    assert!(
        largest < 64 << 10,
        "largest allocation while spilling: {largest} bytes"
    );
    assert!(
        total < 1 << 20,
        "allocated {total} bytes while spilling 64 MiB"
    );
    // And the bytes on disk are the buffers, in place.
    let back = area.restore(&locations[0]).unwrap();
    assert!(back.iter().zip(&buffers).all(|(b, w)| b[..] == w[..]));
}
