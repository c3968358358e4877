//! # forebay-datafusion: forebay's Parquet reader inside DataFusion
//!
//! ```text
//!  SessionContext ─► register_table("lineitem", ForebayTable) ─► SQL
//!                        │ projection, filters (as forebay Predicates), limit pushed down
//!                        ▼
//!  ForebayScanExec: partitions = shares of the scan's row groups (ParquetDataset::plan)
//!                        │ each partition: ParquetDataset::scan_units
//!                        ▼
//!  batches of forebay's arrow ─► C data interface (no copy) ─► DataFusion's arrow
//! ```
//!
//! The proof, for issue 40, that a host engine can plan with forebay's reader: statistics
//! (row count), filter and projection pushdown visible in `EXPLAIN`, one partition per
//! share of the row groups; the scan's memory charged to the session's pool
//! ([`SessionMemoryPool`]). `examples/tpch.rs` answers TPC-H Q1 and Q6 through it and
//! through DataFusion's own `ListingTable`, checks they agree and times both.

pub mod bridge;
pub mod filters;
pub mod memory;
pub mod provider;

pub use memory::SessionMemoryPool;
pub use provider::{ForebayScanExec, ForebayTable};
