//! Asking the CPU to fetch a cache line before it is read: how probes of tables far larger
//! than the caches keep several memory accesses in flight (see `CheckpointIndex::contains`).

/// Ask the CPU to start loading the cache line holding `value`. A probe touches two or
/// three random cache lines of a table far larger than the caches; issuing those loads a few
/// probes ahead overlaps their latency instead of paying it one after another.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no visible effect on memory;
    // the pointer comes from a live reference anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (value as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
