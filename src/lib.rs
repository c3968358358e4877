//! # forebay: the data plane for resumable batch inference and training ingest
//!
//! The facade crate for Rust embedders: each component is re-exported under a short name.
//!
//! ```text
//!  parquet (read) ──► engine (filter ─► map ─► write / iterate, under one memory cap) ──► files
//!                        │ checkpoint (done ids)   │ store (zero-copy objects) ─► spill (disk)
//!  io (under all of them: the runtime, paths and URIs to object stores, durable local writes)
//! ```
//!
//! See `examples/engine_pipeline.rs` for a pipeline built and run from Rust.

//!
//! ## Features
//!
//! | feature      | adds                                                               |
//! |--------------|--------------------------------------------------------------------|
//! | `cloud`      | s3://, gs://, az://, http(s):// (object_store's backends, TLS)      |
//! | `checkpoint` | [`checkpoint`]: the id index                                        |
//! | `engine`     | [`engine`], [`store`], [`spill`] (and `checkpoint`)                 |
//!
//! All are on by default. `default-features = false` is the reader alone: [`reader`] and
//! [`io`] with local files and stores the host builds, no engine, no HTTP client.
//!
//! The reader is `forebay::reader` (the `forebay-parquet` crate), so that `parquet` stays
//! the name of the Apache crate, re-exported with `arrow`'s crates and `object_store`
//! by [`reader`] for hosts that want the very versions forebay was built with.

#[cfg(feature = "checkpoint")]
pub use forebay_checkpoint as checkpoint;
#[cfg(feature = "engine")]
pub use forebay_engine as engine;
pub use forebay_io as io;
pub use forebay_parquet as reader;
#[cfg(feature = "engine")]
pub use forebay_spill as spill;
#[cfg(feature = "engine")]
pub use forebay_store as store;

/// The README's Rust snippets, run as doctests: they compile and run as written.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeRustSnippets;
