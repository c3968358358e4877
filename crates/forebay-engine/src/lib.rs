//! # forebay-engine: memory-capped pipelines over forebay's components
//!
//! Owns pipelines: a source (a forebay-parquet scan, each batch with its provenance), map
//! stages (a Rust function, Python on threads or in worker processes through bindings, the
//! checkpoint filter), and a sink (an iterator handed to the caller, or a Parquet writer that
//! publishes each file atomically), connected by queues bounded in batches and bytes, all
//! under one memory pool with a hard cap. It does not own Python (the bindings implement
//! [`MapFn`] for Python callables) or the file formats of the components.
//!
//! ```text
//!             ┌──────────────────── MemoryPool (hard cap; every batch in flight reserved) ───────────────────┐
//!  Parquet ──► source ──► queue ──► map stage ──► queue ──► … ──► sink
//!  (scan)    (waits for    (bytes +   dispatcher      │             ├─ iter: re-chunk / shuffle ─► prefetch ─► caller
//!             room: back-   batches)  (batch_size)    │             └─ write_parquet: workers ─► FileFormat ─► temp ─► rename
//!             pressure)               workers × N     │
//!                                     ordered? ──► reorder buffer ──over budget──► forebay-store ──► forebay-spill
//!                                     processes? ──► batches by object id through forebay-store
//! ```
//!
//! * **Memory.** [`MemoryPool`] charges every batch by the distinct allocations it
//!   references (a one-row slice of a 128 MB buffer costs 128 MB; batches sharing a buffer
//!   are charged once). Queues, stages, buffers and the scan's prefetch window are holders;
//!   their bytes add up to the pool's. Only the source waits for room, so backpressure starts
//!   at the source and nothing downstream deadlocks. A run's pool also counts what the
//!   process holds beyond its books (decoder pages, allocator retention), so the limit caps
//!   the process's growth; the batches always get a quarter of it.
//! * **Order.** By default batches flow as they finish; with `preserve_order` a stage's
//!   outputs are re-ordered in a bounded window, held batches beyond the window's byte budget
//!   move into the run's object store (and on to disk when it is full).
//! * **Failure.** The first error anywhere cancels the run; every thread stops within
//!   ~50 ms; the caller gets that error, naming the stage and the batch (a user function's
//!   error is kept as the original value).
//!   A worker may instead set the rows its function fails on aside (module [`errored`]):
//!   counted, reported, and with [`MapStage::with_dead_letter`] written beside the output
//!   and committed with it (module [`dead_letter`]).
//! * **Exactly once** ([`commit`]): a checkpointed write commits each output file together
//!   with the ids of its rows, the input rows it consumed (by position: module `positions`)
//!   and the input it finishes (stage, one atomic record, publish); every run first
//!   recovers interrupted commits, then skips finished input unread and drops the rows of
//!   unfinished row groups that earlier commits consumed, in the source. A checkpoint whose
//!   rows are known only by id (Ray Data's layout, forebay.ray's commits) drops done ids
//!   inside the scan instead (module `resume_filter`: only the id column of a done row is
//!   ever decoded). The module docs draw the files, the order of a commit and the recovery
//!   rules.
//! * **Edges.** Before a write touches anything it checks where it goes (module
//!   `locations`: never over its own input, never mixed with its checkpoint) and takes the
//!   checkpoint for itself (module `lease`: a lock locally, a renewed lease on object stores).
//! * **Commits across processes** ([`coordinator`]): the same protocol with the files
//!   staged in other processes (Ray tasks) and decided by one coordinator.
//! * **Worker processes** ([`process`]): batches travel through a forebay-store by object id;
//!   a dead worker is detected by its socket and its batch retried or reported.
//!
//! ## Where new things go
//!
//! * **A new compute mode** (a remote endpoint, another accelerator): one [`MapFn`]
//!   implementation. Its `start_worker` makes a [`MapWorker`] for each of the stage's
//!   threads; the worker's `call` maps one batch, `next_batch_preparer` may start on the
//!   next batch while a call runs, `close` releases what the worker holds; a worker that
//!   keeps many calls running (an event loop) says so with `in_flight` and takes `submit` /
//!   `completed` instead of `call` (module `stage::in_flight`). The stage
//!   (module `stage`) already gives it batching, ordering, memory accounting, errors naming
//!   the batch and cancellation; a `MapStage::new(name, your_fn)` adds it to a pipeline. The
//!   existing ones: Rust closures (`stage`), Python on threads (`python/src/udf.rs`), async
//!   Python on an event loop (`python/src/udf_async.rs`), worker processes ([`process`], with
//!   an environment per worker for its devices). On the Python side it is one more value of
//!   `map_batches(compute=...)` in `python/forebay/_dataset.py`.
//! * **A new output format** (CSV, JSON lines, Arrow IPC): one [`format::FileFormat`]
//!   implementation (its extension, and `open` giving a [`format::FormatWriter`] that
//!   encodes batches into the [`format::FileSink`] it is given and reports the memory it
//!   holds), plus a way to choose it (today `ParquetSink::format` builds the Parquet one).
//!   Everything around a file is the same for every format and stays where it is: rolling
//!   files, temporary names, uploads and cleanup in `writer`; the names of committed data
//!   files (`part-<commit>.<extension>`) in `commit::log` and [`coordinator`]; where a write
//!   may go in `locations`. The id files of a checkpoint stay Parquet whatever the output's
//!   format.
//!
//! ```no_run
//! use forebay_engine::{IterOptions, MapStage, ParquetSink, Pipeline, Source};
//! use forebay_parquet::{DatasetSource, ParquetDataset};
//!
//! let dataset = ParquetDataset::builder(DatasetSource::uris(["data/"]))
//!     .with_columns(["id", "text"])
//!     .build()?;
//! let stats = Pipeline::new(Source::Parquet(dataset))
//!     .with_memory_limit(1 << 30)
//!     .map(MapStage::rust("identity", |batch| Ok(batch)).with_concurrency(2))
//!     .write_parquet(ParquetSink::new("out/"))?;
//! println!("{} rows in {} files", stats.rows, stats.files.len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod batch;
pub mod commit;
mod concat;
pub mod coordinator;
pub mod dead_letter;
mod error;
pub mod errored;
mod events;
pub mod format;
mod lease;
mod lineage;
mod locations;
pub mod memory;
mod output_schema;
mod pipeline;
mod positions;
pub mod process;
mod process_memory;
mod progress;
mod queue;
mod rechunk;
mod reorder;
mod resources;
mod resume_filter;
mod shuffle;
mod source;
mod stage;
mod stats;
pub mod training;
mod writer;

pub use batch::{EngineBatch, Origin};
pub use commit::{
    Checkpoint, FinishedInputs, OnChangedInput, ResumeReport, DEFAULT_COMMIT_INTERVAL,
};
pub use coordinator::{
    CommitCoordinator, CommitStager, ConsumedPositions, StagedCommit, StagerSpec, StagingSlot,
};
pub use error::{BatchLabel, EngineError, Result, UserError};
pub use errored::{errored_rows_batch, ErroredRow};
pub use events::{EventSink, PipelineEvent};
pub use memory::{Admission, CancelToken, MemoryConsumer, MemoryPool, PoolSnapshot, Reservation};
pub use pipeline::{
    default_memory_limit, BatchStream, IterOptions, Pipeline, PipelineOptions, Poll, RunningWrite,
};
pub use source::{BatchIterator, Source};
pub use stage::{MapFn, MapStage, MapWorker, PrepareNext, StageFailure, WorkerContext};
pub use stats::{ResumeStats, RunStats, StageStats, WriteStats, WrittenFile};
pub use writer::{ParquetSink, WriteMode, DEFAULT_ROWS_PER_FILE};
