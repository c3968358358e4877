//! The fault-injection hook the protocol's tests kill the process with
//! (`FOREBAY_CRASH_AT=<point>:<n>`, see the module docs of `commit`).

use std::sync::atomic::{AtomicU64, Ordering};

/// The fault-injection hook of the protocol's tests (see the module docs).
pub(super) fn crash_point(point: &str) {
    static PLAN: std::sync::OnceLock<Option<(String, u64, AtomicU64)>> = std::sync::OnceLock::new();
    let plan = PLAN.get_or_init(|| {
        let spec = std::env::var("FOREBAY_CRASH_AT").ok()?;
        let (at, n) = spec.split_once(':')?;
        Some((at.to_string(), n.parse().ok()?, AtomicU64::new(0)))
    });
    if let Some((at, n, seen)) = plan {
        if at == point && seen.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            // SAFETY: raise only sends a signal to this process.
            unsafe { libc::raise(libc::SIGKILL) };
        }
    }
}
