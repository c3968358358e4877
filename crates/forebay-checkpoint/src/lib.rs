//! # forebay-checkpoint: which ids a previous run already finished
//!
//! Owns the id index of a resumable job: a set of ids split into `2^s` hash shards, loaded
//! from Parquet files (only the id column is read), probed in bulk (`contains`, `filter`),
//! grown as rows complete (`insert`, `merge`), and written back as hash-partitioned Parquet
//! files with an atomic commit. It does not decide when a row is complete: that is the
//! engine's job.
//!
//! ```text
//!  checkpoint files ──► forebay-parquet (id column only) ──► workers: hash ──► per-shard
//!  (flat or shard=<k>/)                                       fingerprints     vectors
//!                                                                  │ build (parallel)
//!                                                                  ▼
//!  input batch ──► hash ids ──► group rows by shard ──► probe shards in parallel ──► mask
//!                                                                  │
//!  completed ids ──► insert ──► pending ──► write: shard=<k>/part-<id>.parquet (commit)
//!
//!  ids of an output file ──► IdPartsWriter: encoded into their shard's part as they come
//!                            ──► finish: shard=<k>/<name>, for a caller's commit protocol,
//!                                or (one_file) all shards in one file, a row group each
//! ```
//!
//! ## Memory and correctness
//!
//! Each id costs about 10.5 bytes whatever its length (a 36-character UUID costs what an
//! int64 costs; 12.5 bytes in small shards of under 2^18 ids): a 100-bit fingerprint, of
//! which the shard and bucket bits are implied by position (see the [`shard`] module docs). There are never false negatives; the
//! false-positive probability per lookup is at most `n / 2^100` for `n` ids (2^-66.8 at
//! 10^10 ids); the hash and the shard layout are defined in [`fingerprint`]. The tables and
//! a load's packed fingerprints ask Linux for 2 MiB pages (`huge_pages`): probes are random
//! accesses all over them, and a load fills them fresh.
//!
//! ## Nulls
//!
//! A null id is not an id. `insert` and loading skip nulls; `contains` answers `false` for
//! a null; so `filter` always keeps rows whose id is null (they are processed again on
//! every run: give such rows an id if they must run exactly once).
//!
//! ## Modules
//!
//! | module        | what                                                                  |
//! |---------------|-----------------------------------------------------------------------|
//! | `index`       | [`CheckpointIndex`]: the shards, `contains`/`filter`, `insert`/`merge`   |
//! | `shard`       | one shard's table of packed fingerprints                               |
//! | `bucket_offsets` | where each bucket of a shard's table lies: blocks that stay in cache |
//! | `prefetch`    | asking the CPU for a cache line a few probes ahead                     |
//! | `huge_pages`  | 2 MiB pages under the large buffers                                    |
//! | `fingerprint` | the hash, and which shard and bucket an id falls in                    |
//! | `layout`      | the files' names: manifest, `shard=<k>/`, one-file parts and their keys |
//! | `load`        | [`CheckpointLoader`]: Parquet files to an index, on several threads    |
//! | `id_parts`    | [`IdPartsWriter`]: ids encoded into their shards' parts as they come    |
//! | `write`       | an index or chunks of ids written as parts, with the manifest          |
//! | `directory`   | the checkpoint's forebay-io `Dir`: manifest, top level, dead temp files |
//! | `stream`      | filtering batches against a shared index on several threads            |
//! | `durable`     | fsync helpers and `process_alive`                                      |
//!
//! ## Example
//!
//! ```no_run
//! use arrow_array::StringArray;
//! use forebay_checkpoint::CheckpointIndex;
//!
//! let mut done = CheckpointIndex::loader("s3://bucket/job/checkpoint", "id").load()?;
//! let batch_ids = StringArray::from(vec!["a", "b"]);
//! let mask = done.contains(&batch_ids)?;           // which rows are finished
//! done.insert(&StringArray::from(vec!["c"]))?;      // rows finished in this run
//! done.write("s3://bucket/job/checkpoint", &Default::default())?;
//! # let _ = mask;
//! # Ok::<(), forebay_checkpoint::CheckpointError>(())
//! ```

mod bucket_offsets;
mod directory;
pub mod error;
pub mod fingerprint;
mod huge_pages;
mod id_parts;
mod index;
mod layout;
mod load;
mod prefetch;
pub mod shard;
mod stream;
mod write;

pub use directory::{clean_stale_temp_files, WriteSummary};
pub use error::{CheckpointError, Result};
pub use fingerprint::{IdFamily, FINGERPRINT_BITS};
/// Durable local writes and process liveness (forebay-io's, here under their old path).
pub use forebay_io::durable;
pub use id_parts::IdPartsWriter;
pub use index::{CheckpointIndex, DEFAULT_NUM_SHARDS, MAX_NUM_SHARDS};
pub use layout::MANIFEST_FILE;
pub use load::CheckpointLoader;
pub use stream::{filter_in_parallel, FilteredBatches, SharedCheckpointIndex};
pub use write::{manifest_num_shards, manifest_num_shards_in, write_id_parts};
