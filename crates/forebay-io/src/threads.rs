//! The threads forebay starts: their names, and how many its own runtime has.
//!
//! Every thread forebay starts (its runtime's workers, pipeline stages, spill writers, the
//! store server, the checkpoint lease) is named `<prefix>-<what>`, the prefix `forebay`
//! unless a host sets its own ([`set_thread_name_prefix`]) so that its profiles, `top -H`
//! and thread dumps tell them apart. forebay's own runtime starts one worker per core unless
//! a host sets a count ([`set_own_runtime_threads`]) before it starts; a host that gives
//! forebay its runtime (`use_host_runtime`) sizes that itself.
//!
//! ```
//! forebay_io::threads::set_thread_name_prefix("ingest");
//! assert_eq!(forebay_io::threads::thread_name("io"), "ingest-io");
//! ```

use std::sync::{OnceLock, RwLock};

static PREFIX: RwLock<Option<String>> = RwLock::new(None);
static OWN_RUNTIME_THREADS: OnceLock<usize> = OnceLock::new();

/// Name the threads forebay starts from now on `<prefix>-<what>` (default `forebay`).
/// Threads already running keep their names. Linux shows the first 15 bytes of a name.
pub fn set_thread_name_prefix(prefix: impl Into<String>) {
    let prefix: String = prefix.into();
    let prefix = prefix.trim_end_matches('-').to_string();
    *PREFIX.write().unwrap_or_else(|p| p.into_inner()) = Some(prefix);
}

/// The name of a thread forebay starts for `what` (`io`, `spill-0`, `map-1`, ...).
pub fn thread_name(what: &str) -> String {
    match PREFIX.read().unwrap_or_else(|p| p.into_inner()).as_deref() {
        Some(prefix) if !prefix.is_empty() => format!("{prefix}-{what}"),
        Some(_) => what.to_string(),
        None => format!("forebay-{what}"),
    }
}

/// Why [`set_own_runtime_threads`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OwnRuntimeThreadsError {
    #[error("forebay's own runtime has {0} threads: it started, or a count was set, before")]
    AlreadyDecided(usize),
    #[error("forebay's own runtime needs at least one thread")]
    Zero,
}

/// Start forebay's own runtime (when it starts, on first use) with `threads` workers
/// instead of one per core. Call it before anything of forebay runs.
pub fn set_own_runtime_threads(threads: usize) -> Result<(), OwnRuntimeThreadsError> {
    if threads == 0 {
        return Err(OwnRuntimeThreadsError::Zero);
    }
    OWN_RUNTIME_THREADS
        .set(threads)
        .map_err(|_| OwnRuntimeThreadsError::AlreadyDecided(own_runtime_threads()))
}

/// The workers forebay's own runtime starts with: the count set, else one per core. Once
/// read (the runtime starting reads it) it no longer changes.
pub(crate) fn own_runtime_threads() -> usize {
    *OWN_RUNTIME_THREADS.get_or_init(default_threads)
}

/// Threads of the pool (and a scan's default decoding threads): one per core.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(1)
}
