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
//!
//! # After `fork`
//!
//! A forked child has none of its parent's threads, only their memory: a pool inherited from
//! the parent would take tasks and never run them. Each process therefore has a pool of its
//! own: a `pthread_atfork` handler counts the forks, and the first call in a child starts a
//! new pool there. The parent's pool is left alone in the child, never dropped (dropping it
//! would wait for threads that are not there). So `multiprocessing`'s fork start method and
//! PyTorch DataLoader workers forked from a process that already used forebay work as in
//! the parent. A host runtime ([`use_host_runtime`]) is the host's to rebuild after a fork.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};

pub use crate::threads::default_threads;

use tokio::runtime::{Handle, RuntimeFlavor};

/// forebay's own pool in this process: null until first use, or one started before a fork
/// (its `process` is not [`PROCESS`]'s). Pools are leaked, never freed: one lives for its
/// process, and one inherited through a fork must not be dropped (see the module docs).
static OWN_RUNTIME: AtomicPtr<OwnRuntime> = AtomicPtr::new(std::ptr::null_mut());
static HOST_RUNTIME: OnceLock<Handle> = OnceLock::new();
/// Which process this is, counted in forks since the library loaded: the `pthread_atfork`
/// child handler adds one.
static PROCESS: AtomicU64 = AtomicU64::new(0);
static FORK_HANDLER: Once = Once::new();

struct OwnRuntime {
    /// The [`PROCESS`] whose threads run it.
    process: u64,
    runtime: tokio::runtime::Runtime,
}

extern "C" fn after_fork_in_child() {
    // Async-signal-safe: an atomic add, nothing else.
    PROCESS.fetch_add(1, Ordering::SeqCst);
}

/// The pool of this process, if it has started one.
fn own_runtime_of_this_process() -> Option<&'static tokio::runtime::Runtime> {
    let own = OWN_RUNTIME.load(Ordering::Acquire);
    // SAFETY: a non-null pointer came from `Box::leak` in `runtime()` and is never freed.
    let own = unsafe { own.as_ref() }?;
    (own.process == PROCESS.load(Ordering::Acquire)).then_some(&own.runtime)
}

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
    if own_runtime_of_this_process().is_some() {
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

/// Whether forebay's own runtime (its `forebay-io` threads) was started in this process (a
/// pool started before a fork does not count in the child).
pub fn own_runtime_started() -> bool {
    own_runtime_of_this_process().is_some()
}

/// forebay's own pool: one worker per core (or as set by
/// [`set_own_runtime_threads`](crate::threads::set_own_runtime_threads)), threads named
/// `forebay-io` (see [`threads`](crate::threads)), started on first use in each process.
/// Prefer [`handle`], which honours a host runtime.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    if let Some(runtime) = own_runtime_of_this_process() {
        return runtime;
    }
    FORK_HANDLER.call_once(|| {
        // SAFETY: registers a handler that only does an atomic add; no other precondition.
        let status = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        assert_eq!(status, 0, "pthread_atfork failed: {status}");
    });
    let process = PROCESS.load(Ordering::Acquire);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(crate::threads::own_runtime_threads())
        .thread_name(crate::threads::thread_name("io"))
        .enable_all()
        .build()
        .expect("cannot start the forebay I/O runtime (out of threads?)");
    let fresh = Box::into_raw(Box::new(OwnRuntime { process, runtime }));
    let mut current = OWN_RUNTIME.load(Ordering::Acquire);
    loop {
        // SAFETY: as in `own_runtime_of_this_process`: leaked, never freed.
        if let Some(other) = unsafe { current.as_ref() } {
            if other.process == process {
                // Another thread of this process started one first: use it, drop ours.
                // SAFETY: `fresh` came from `Box::into_raw` above and was never shared.
                let ours = unsafe { Box::from_raw(fresh) };
                ours.runtime.shutdown_background();
                return &other.runtime;
            }
        }
        match OWN_RUNTIME.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // The previous pool, if any, was the parent's: leaked, as the module docs say.
            // SAFETY: `fresh` is now published and never freed.
            Ok(_) => return &unsafe { &*fresh }.runtime,
            Err(now) => current = now,
        }
    }
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
