//! A Python thread state kept for the life of an engine worker thread.
//!
//! An engine thread that calls Python (a `map_batches` worker) has no Python thread state of
//! its own. Each `Python::attach` on such a thread makes one (`PyGILState_Ensure`) and the
//! matching release destroys it again, and every new thread state also maps a fresh frame
//! stack: a few syscalls and a TLB shoot-down per batch, paid with the GIL held. Holding one
//! "ensure" for the worker's lifetime keeps the thread state, so each call only takes and
//! drops the GIL.

use std::thread::ThreadId;

use pyo3::ffi;
use pyo3::Python;

/// This thread's Python thread state, kept while the value lives (the GIL is not held in
/// between). Create and drop it on the same thread; dropped elsewhere it leaks the thread
/// state rather than release another thread's.
pub(crate) struct KeptThreadState {
    thread: ThreadId,
    gil_state: ffi::PyGILState_STATE,
    saved: *mut ffi::PyThreadState,
}

// SAFETY: the raw pointer is only dereferenced (by CPython) in `drop`, and only when `drop`
// runs on the thread that created the value (checked against `thread`). Moving the value to
// another thread is harmless: there it does nothing.
unsafe impl Send for KeptThreadState {}

impl KeptThreadState {
    /// Attach this thread to the interpreter and keep it attached, GIL released. Call it with
    /// the GIL released (as on an engine thread); `Python::attach` inside later reuses it.
    pub(crate) fn new() -> KeptThreadState {
        // Make sure the interpreter is initialised, as `Python::attach` does.
        Python::attach(|_| ());
        // SAFETY: PyGILState_Ensure may be called on any thread once the interpreter is up; it
        // returns with the GIL held, which PyEval_SaveThread then releases, returning this
        // thread's state for PyEval_RestoreThread in `drop`.
        let (gil_state, saved) = unsafe {
            let gil_state = ffi::PyGILState_Ensure();
            (gil_state, ffi::PyEval_SaveThread())
        };
        KeptThreadState {
            thread: std::thread::current().id(),
            gil_state,
            saved,
        }
    }
}

impl Drop for KeptThreadState {
    fn drop(&mut self) {
        if std::thread::current().id() != self.thread {
            return;
        }
        // SAFETY: same thread as `new`, which left this thread state saved and the GIL
        // released; restoring it and releasing the ensure undoes `new` in reverse order. An
        // interpreter that is finalising blocks or exits the thread in PyEval_RestoreThread,
        // as any `Python::attach` would.
        unsafe {
            ffi::PyEval_RestoreThread(self.saved);
            ffi::PyGILState_Release(self.gil_state);
        }
    }
}
