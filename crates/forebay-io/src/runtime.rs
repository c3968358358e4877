//! The tokio runtime that runs forebay's I/O and decoding, and waiting for it from any thread.

use std::sync::OnceLock;

/// The pool that runs forebay's I/O and decoding: one worker per core.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(default_threads())
            .thread_name("forebay-io")
            .enable_all()
            .build()
            .expect("cannot start the forebay I/O runtime (out of threads?)")
    })
}

/// Threads of the pool (and a scan's default decoding threads): one per core.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(1)
}

/// Run `fut` on the forebay runtime and wait for it from any thread (also from inside
/// another async runtime, where `Runtime::block_on` would panic).
pub fn block_on<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let handle = runtime().spawn(fut);
    match futures::executor::block_on(handle) {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("forebay runtime task cancelled: {e}"),
    }
}
