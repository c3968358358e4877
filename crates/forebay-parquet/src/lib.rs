//! # forebay-parquet: the streaming Parquet reader of forebay
//!
//! Owns reading Parquet: resolving paths/URIs into files, reading each footer once, column
//! projection (nested leaves included), row-group and page pruning from statistics, exact
//! filtering, bounded prefetch with parallel decoding, object_store I/O with request metrics,
//! and the provenance of each batch (file, row group, first row). It does not own memory
//! policy or checkpoints: those belong to `forebay-engine` and `forebay-checkpoint`, which
//! plugs its "is this id done?" test in as a [`ScanRowFilter`]. Opening a path or URI's
//! object store and the runtime everything runs on come from `forebay-io` (re-exported here
//! as [`open_location`], [`StorageOptions`], [`block_on`], [`runtime`]).
//!
//! ```text
//!  paths / dirs / globs / URIs ──► source::resolve ──► [FileEntry]
//!   (on object stores: HEAD and LIST at once,             │ (hive key=value directories:
//!    16 paths of a list at a time)                        │  columns; a filter's terms on
//!                                                          │  them drop files unopened)
//!                                                          │ footer (1 request, cached;
//!                                                          │  a small remote file is
//!                                                          │  fetched whole by it and
//!                                                          │  decoded from those bytes)
//!                                                          ▼
//!        Predicate ──bind──► prune row groups (min/max/nulls) ──► prune pages (page index)
//!                                                          │
//!                     (file, row group) units, ≤ prefetch in flight, decoded on the pool
//!                       (filter columns first; the rest only for rows the Predicate
//!                        and any ScanRowFilter keep; a ScanRowFilter may settle a whole
//!                        row group from its dictionary page)
//!                       (a row group read whole: flat columns, required or nullable, of
//!                        numbers, dates, timestamps, decimals, strings and binaries by
//!                        forebay's own decoders, `flat`; the rest by the parquet crate)
//!                       (on object stores: more units' column chunks requested ahead,
//!                        as deep as the link makes decoding wait; ranges become requests
//!                        by `io::request_plan`: a gap only when cheaper than a request,
//!                        long chunks in parallel parts, against the measured link)
//!                                                          ▼
//!                          ScanStream: ordered RecordBatches + BatchProvenance
//! ```
//!
//! Tasks share a dataset by [`ByteRangeSplit`] (a file's row groups starting in a byte
//! range, planned from file sizes alone) on top of any [`ScanSkip`] (a resume's finished
//! input), combined by [`ParquetDataset::and_skip`].
//!
//! ```no_run
//! use forebay_parquet::{DatasetSource, ParquetDataset, Predicate};
//!
//! let dataset = ParquetDataset::builder(DatasetSource::uris(["data/lineitem/"]))
//!     .with_columns(["l_orderkey", "l_quantity"])
//!     .with_filter(Predicate::gt("l_quantity", 45))
//!     .build()?;
//! // From a thread that may block; async code awaits `dataset.scan()`, a `Stream`.
//! for batch in dataset.scan().blocking_iter() {
//!     let batch = batch?;
//!     println!("{} rows from {}", batch.batch.num_rows(), batch.provenance.file);
//! }
//! # Ok::<(), forebay_parquet::ParquetError>(())
//! ```
//!
//! ## In a host engine
//!
//! The scan runs on forebay's own runtime unless the host hands it one, for the whole
//! process (`forebay_io::use_host_runtime`) or for one dataset
//! ([`ParquetDatasetBuilder::with_runtime`]); every blocking call has an async twin
//! (`build_async`, `count_rows_async`); a host's memory pool is charged what a scan holds
//! ([`ParquetDatasetBuilder::with_memory_pool`]); a store the host built is read as given
//! ([`DatasetSource::Store`]).

mod dictionary;
pub mod error;
mod flat;
pub mod io;
mod local;
mod pages;
pub mod predicate;
mod repair;
pub mod row_filter;
pub mod scan;
pub mod source;
pub mod split;
#[cfg(test)]
mod test_files;

/// The crates of forebay's public types, at the versions it was built with: a host names
/// `forebay_parquet::arrow_array::RecordBatch` or `forebay_parquet::object_store::ObjectStore`
/// and cannot end up with a second, incompatible copy.
pub use {arrow_array, arrow_schema, object_store, parquet};

pub use error::{ErrorKind, ParquetError, Result};
pub use io::{
    coalesce_ranges, plan_requests, FileEntry, IoMetricsSnapshot, LinkEstimate, RangePolicy,
    MIN_PART_BYTES,
};
pub use predicate::{CompareOp, Literal, Predicate};
pub use row_filter::{ArrowPredicates, RowFilterError, RowGroupDecision, ScanRowFilter};
pub use scan::{
    block_on, runtime, AllSkips, BatchProvenance, BlockingScan, ColumnStatistics, FileRowGroups,
    ParquetDataset, ParquetDatasetBuilder, ProvenancedBatch, RecordBatchIter, RowRange,
    ScanMetricsSnapshot, ScanSkip, ScanStream, ScanUnit, DEFAULT_MAX_COLUMN_CHUNK_BYTES,
};
pub use source::{
    global_memory_store, open_location, DatasetSource, StorageOptions, DEFAULT_FILE_EXTENSIONS,
};
pub use split::{row_group_start, ByteRangeSplit};
