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

pub use forebay_checkpoint as checkpoint;
pub use forebay_engine as engine;
pub use forebay_io as io;
pub use forebay_parquet as parquet;
pub use forebay_spill as spill;
pub use forebay_store as store;
