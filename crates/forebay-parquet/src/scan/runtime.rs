//! The runtime the scan runs on (forebay-io's, re-exported: `forebay_parquet::block_on` stays
//! what it was), and the message of a caught panic.

pub use forebay_io::runtime::{block_on, default_threads, runtime};

/// The message of a caught panic.
pub(super) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}
