//! # forebay-io: the I/O pieces every forebay crate shares
//!
//! The bottom of the workspace: forebay-parquet, forebay-checkpoint, forebay-spill and
//! forebay-engine build on it, and it depends on none of them.
//!
//! ```text
//!  forebay-engine ─────────────┐
//!  forebay-checkpoint ─────────┤
//!  forebay-parquet ────────────┼──► forebay-io ─┬─ runtime: one tokio pool, block_on from any thread
//!  forebay-spill ──────────────┘                ├─ location: path or URI ─► object store, path, shown URI
//!                                               └─ durable: mkdir -p and fsync of directories,
//!                                                  syncs on several threads, process liveness
//! ```
//!
//! Each piece used to live in the crate that needed it first, and was copied into the next
//! (three `process_alive`s, two durable `mkdir -p`s), or made other crates depend on
//! forebay-parquet for it (the runtime, URI parsing; forebay-parquet re-exports both, so its
//! API is unchanged). Still to come here (issue 35): one directory abstraction over local
//! disks and object stores (today forebay-checkpoint's `Target` and forebay-engine's `Dir`,
//! the same idea twice).

pub mod durable;
pub mod location;
pub mod runtime;

pub use runtime::{block_on, runtime};
