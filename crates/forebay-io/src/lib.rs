//! # forebay-io: the I/O pieces every forebay crate shares
//!
//! The bottom of the workspace: forebay-parquet, forebay-checkpoint, forebay-spill and
//! forebay-engine build on it, and it depends on none of them.
//!
//! ```text
//!  forebay-engine ─────────────┐
//!  forebay-checkpoint ─────────┤
//!  forebay-parquet ────────────┼──► forebay-io ─┬─ runtime: the host's or forebay's pool, block_on from any thread
//!                                               ├─ memory: the pool trait a host shares with forebay
//!  forebay-spill ──────────────┘                ├─ location: path or URI ─► object store, path, shown URI
//!                                               ├─ storage_options: the user's keys checked, aliases resolved
//!                                               ├─ store_errors: a failed request's known cause, in words
//!                                               ├─ dir: a local directory or an object-store prefix
//!                                               │       that readers see whole files of (atomic
//!                                               │       puts, publish by rename/copy, list, delete)
//!                                               └─ durable: mkdir -p and fsync of directories,
//!                                                  syncs on several threads, process liveness
//! ```
//!
//! ```text
//!            location::open_location            Dir::put_atomic / put_all_atomic
//!  "s3://b/out" ──────────────────► Dir::Remote ──► PUT (atomic), 8 in flight
//!  "/data/out"  ──────────────────► Dir::Local  ──► .name.<pid>.tmp ─► fsync ─► rename ─► fsync dir
//!                                        │
//!                                        └─ get, list, entries, exists, publish(_all), delete(_tree)
//! ```
//!
//! Each piece used to live in the crate that needed it first, and was copied into the next
//! (three `process_alive`s, two durable `mkdir -p`s, the checkpoint's `Target` and the
//! engine's `Dir`), or made other crates depend on forebay-parquet for it (the runtime, URI
//! parsing; forebay-parquet re-exports both, so its API is unchanged). Object-store work
//! that every writer wants (retries, timeouts, request concurrency) belongs here.

pub mod dir;
pub mod durable;
pub mod location;
pub mod memory;
pub mod runtime;
#[cfg(feature = "remote")]
pub mod storage_options;
pub mod store_errors;
mod store_ops;
pub mod threads;

pub use dir::{Dir, DirError, DirLocation};

/// Options passed to object_store builders (`aws_endpoint`, `google_service_account`, ...);
/// checked by `storage_options` (built with the `remote` feature) before a store is built.
pub type StorageOptions = std::collections::HashMap<String, String>;
pub use runtime::{block_on, block_on_in, handle, runtime, use_host_runtime};
