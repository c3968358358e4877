//! Where forebay's I/O and decoding run, and waiting for them from any thread.
//!
//! ```text
//!  use_host_runtime(handle) ──► the host's runtime  ─┐
//!          (never called)   ──► forebay's own pool ──┴─► handle(): what block_on, scans,
//!                              (started on first use,     directories and checkpoints
//!                               one worker per core,      spawn their tasks on
//!                               threads "forebay-io")
//! ```
//!
//! A program that has no tokio runtime of its own uses forebay's, started the first time
//! something needs it. A host engine that has one calls [`use_host_runtime`] once, before
//! its first forebay call: forebay then never starts a thread pool of its own, and all its
//! async work (requests, decoding) runs on the host's workers. A scan can also be given a
//! runtime of its own (`ParquetDatasetBuilder::with_runtime` in forebay-parquet).

use std::sync::OnceLock;

pub use crate::threads::default_threads;

use tokio::runtime::{Handle, RuntimeFlavor};

static OWN_RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
static HOST_RUNTIME: OnceLock<Handle> = OnceLock::new();

/// Why [`use_host_runtime`] refused the host's runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostRuntimeError {
    /// forebay's own runtime started before the call: work may already run on it.
    #[error(
        "forebay's own runtime is already running: call use_host_runtime before anything \
         else of forebay"
    )]
    OwnRuntimeStarted,
    /// Another host runtime was given first.
    #[error("a host runtime was already given to forebay")]
    AlreadySet,
}

/// Run all of forebay's async work on the host's runtime (`handle`), process-wide, instead
/// of a pool forebay starts. Call it once, before any other forebay call.
///
/// ```
/// let host = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
/// forebay_io::use_host_runtime(host.handle().clone())?;
/// assert_eq!(forebay_io::block_on(async { 6 * 7 }), 42); // ran on the host's workers
/// assert!(!forebay_io::runtime::own_runtime_started());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn use_host_runtime(handle: Handle) -> Result<(), HostRuntimeError> {
    if OWN_RUNTIME.get().is_some() {
        return Err(HostRuntimeError::OwnRuntimeStarted);
    }
    HOST_RUNTIME
        .set(handle)
        .map_err(|_| HostRuntimeError::AlreadySet)
}

/// The runtime forebay's tasks are spawned on: the host's ([`use_host_runtime`]) or
/// forebay's own (started now if it is not yet).
pub fn handle() -> Handle {
    match HOST_RUNTIME.get() {
        Some(host) => host.clone(),
        None => runtime().handle().clone(),
    }
}

/// Whether forebay's own runtime (its `forebay-io` threads) was started in this process.
pub fn own_runtime_started() -> bool {
    OWN_RUNTIME.get().is_some()
}

/// forebay's own pool: one worker per core (or as set by
/// [`set_own_runtime_threads`](crate::threads::set_own_runtime_threads)), threads named
/// `forebay-io` (see [`threads`](crate::threads)), started on first use. Prefer [`handle`],
/// which honours a host runtime.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    OWN_RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(crate::threads::own_runtime_threads())
            .thread_name(crate::threads::thread_name("io"))
            .enable_all()
            .build()
            .expect("cannot start the forebay I/O runtime (out of threads?)")
    })
}

/// Run `fut` on forebay's runtime ([`handle`]) and wait for it from any thread.
pub fn block_on<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    block_on_in(&handle(), fut)
}

/// Run `fut` on `runtime` and wait for it from the calling thread: a plain thread, a
/// blocking-pool thread, or a worker of a multi-threaded runtime (which is told it blocks,
/// so its other tasks move to other workers). Never from inside a task of a current-thread
/// runtime that is also `runtime`: nothing else would run `fut`, so it would wait forever
/// (call the async variant there: `build_async`, `count_rows_async`, `load_async`, ...).
pub fn block_on_in<T: Send + 'static>(
    runtime: &Handle,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let task = runtime.spawn(fut);
    let wait = move || match futures::executor::block_on(task) {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("forebay runtime task cancelled: {e}"),
    };
    match Handle::try_current().map(|current| current.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}
