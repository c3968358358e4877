//! # Exactly-once, resumable writes: the commit protocol
//!
//! A checkpointed `write_parquet` commits each output file together with what it covers:
//! the input rows its batches consumed, by position in row groups not yet finished (so a
//! resumed run drops exactly those rows; module `positions`), the input files and row
//! groups it completes (so a resumed run skips them unread), and the ids of its rows
//! (hash-partitioned as forebay-checkpoint's loader reads them: one file per commit, one
//! row group per shard; Ray Data, `CheckpointFilter` and checkpoints known only by id use
//! them). Either all of that becomes visible, or none of it.
//!
//! ## Files
//!
//! ```text
//!  <output>/part-<commit>.parquet                  data files (what readers of the output see)
//!  <output>/_forebay_staging_<key>/part-<commit>.parquet  a data file not yet published
//!                                                  (<key>: the checkpoint's, see
//!                                                  `output_staging`: jobs sharing an output
//!                                                  directory stage apart)
//!  <output>/_dead_letter/<stage>/part-<commit>.parquet  rows set aside by the commit (module
//!                                                  `dead_letter`), staged and published
//!                                                  like its data file
//!  <checkpoint>/_forebay_checkpoint                manifest (forebay-checkpoint: shard count, id type)
//!  <checkpoint>/ids/part-<commit>.parquet          ids of committed rows (a row group per shard)
//!  <checkpoint>/_forebay_staging/<commit>/ids/part-<commit>.parquet   ids not yet published
//!  <checkpoint>/shard=<k>/*.parquet                ids written one file per shard (by
//!                                                  CheckpointIndex::write, or before the
//!                                                  one-file layout): read the same way
//!  <checkpoint>/_forebay_commits/<commit>.json     commit record: the decision
//!  <checkpoint>/_forebay_inputs.json               inputs finished by earlier runs
//!  <checkpoint>/_forebay_identity                  the checkpoint's identity (module `owners`)
//!  <output>/_forebay_checkpoints/<identity>        a checkpoint committed here (module `owners`)
//!  <checkpoint>/_forebay_transform.json            the map steps' fingerprints (module `transform`)
//! ```
//!
//! Names starting with `_` or `.` are skipped by every Parquet reader (forebay, pyarrow,
//! Spark, DuckDB's globs of `*.parquet`), so staged files are invisible to readers.
//!
//! ## Order of one commit
//!
//! ```text
//!  1 stage    write the data file and the id file under _forebay_staging (in parallel
//!             with other writers); the ids are encoded into their shards' parts as the
//!             file's batches arrive and held, compressed, until the file is complete,
//!             then joined into one file (a row group per shard); nothing is visible yet
//!  2 decide   (one commit at a time) release the file's batches to the lineage book, take
//!             the inputs completed so far, and PUT the commit record atomically
//!             (local: temp file, fsync, rename, fsync dir; object stores: one PUT)
//!             ─── the commit point: before it the commit did not happen, after it it did
//!  3 publish  move the staged id file, then the data file (then its dead letters), to
//!             their final names
//!             (local: rename; object stores: server-side copy, which makes the object
//!             appear whole, then delete the staged copy)
//! ```
//!
//! ## Recovery (at the start of every run, before anything is read)
//!
//! ```text
//!  for each record in _forebay_commits/:          (a corrupt record is an error, never a rerun)
//!      roll forward: publish every file it names that is still staged
//!      (a file neither staged nor published: error: it was deleted by hand)
//!  merge the records' inputs into _forebay_inputs.json (atomic; it names the records it
//!      folded), then delete the records (a record the snapshot names is deleted unfolded:
//!      a fold was killed before deleting it)
//!  delete _forebay_staging/ in both directories: staged files without a record are
//!      commits that never happened (rolled back; their rows are processed again)
//! ```
//!
//! A run folds its own records the same way every 256 commits (`Checkpoint::
//! with_fold_every`), once they are published: a resume reads the snapshot and at most that
//! many records, not one per commit of a job that committed 10,000 times.
//!
//! A SIGKILL at any moment leaves one of: staged files without a record (rolled back), a
//! record with files still staged (rolled forward), or a finished commit. Rows are written
//! once: a row's position is recorded only by the commit that publishes what it became,
//! and a resumed run drops rows at recorded positions. Inputs are skipped only once every
//! row derived from them is committed or was dropped empty (the `lineage` module).
//!
//! Positions need every done row recorded by position: the snapshot says whether all
//! folded commits recorded them. When not (a snapshot of an older forebay, forebay.ray
//! commits whose rows lost their position tags, id files another writer left under the
//! checkpoint path), or when this run
//! reads changed inputs again, the run drops done rows by id instead: every id under the
//! checkpoint path is loaded, and its records say they hold no positions. Rows that share
//! an id are then written once in all (what probing by id can do).
//!
//! On object stores there is no rename: staging keys are copied server-side to final keys;
//! a reader listing the output sees a data file only once it is complete and committed.
//!
//! The inputs snapshot and each record also name the scan filter (`read_parquet(filter=)`)
//! the inputs were finished under. A run with another filter does not skip them (a
//! finished input may hold rows the new filter keeps): it stops with an error, or with
//! `on_changed_input="reprocess"` reads them again, and the next fold drops the old
//! completions. Inputs finished with no filter stay finished under any filter.
//!
//! One run at a time may use a checkpoint: a lock guards local checkpoints, a lease with a
//! heartbeat those on object stores, and every decision checks it (the `lease` module).
//!
//! `delete_on_success` folds the records into `_forebay_inputs.json` as recovery does, then
//! deletes the id parts (the bulk of a checkpoint: ~10 bytes an id), records, staging and
//! manifest. It keeps the inputs snapshot (a few hundred bytes per input file) and the
//! identity: a rerun of a finished job, or of one killed while deleting, finds every input
//! finished and writes nothing again (it warns that it found the job done). Input files added since are read
//! and written; only their ids are no longer checked against the deleted ones.
//!
//! ## Testing the protocol
//!
//! `FOREBAY_CRASH_AT=<point>:<n>` makes the process SIGKILL itself the `n`-th time it
//! reaches `<point>` (`staged`, `recorded`, `ids-published`, `published`, `recovering`,
//! `folded`: a fold's snapshot written, `folding`: after each record a fold deletes,
//! `deleting`: inside `delete_on_success`), so that tests can stop it inside a commit, a
//! recovery, a fold or the final deletion at will. Unset, it costs one check.
//! `FOREBAY_FOLD_EVERY=<n>` folds every `n` commits (`Checkpoint::with_fold_every`), so
//! that a small test job folds often.
//!
//! ## Modules
//!
//! | module    | what                                                                   |
//! |-----------|------------------------------------------------------------------------|
//! | this one  | the user's [`Checkpoint`] options, the file names, [`ResumeReport`]     |
//! | `open`    | lock, recover, check recorded inputs against this run's                |
//! | `recovery`| roll forward what is recorded, roll back what is only staged           |
//! | `log`     | the run's `CommitLog`: stage, decide (the commit point), publish, finish |
//! | `ids`     | a commit's id parts: staged, type-checked, loaded back                 |
//! | `records` | the JSON the protocol writes: commit records, the inputs snapshot      |
//! | `owners`  | which checkpoints committed into an output; a stranger's is refused    |
//! | `transform` | the map steps' fingerprints the rows came from; a changed one is refused |
//! | `crash`   | `FOREBAY_CRASH_AT`, the tests' kill switch                             |

mod crash;
mod ids;
mod log;
mod open;
mod owners;
mod records;
mod recovery;
#[cfg(test)]
mod tests;
mod transform;

pub use records::FinishedInputs;
pub(crate) use transform::StepFingerprint;

pub(crate) use ids::{ids_to_commit, stage_id_parts, stage_ids};
pub(crate) use log::{CommitFiles, CommitLog, DoneRows, IdColumn, StagedData};
pub(crate) use records::{DataFileRecord, IdPartsRecord};

use forebay_parquet::StorageOptions;

use crate::error::EngineError;
use crate::lease::DEFAULT_LEASE_TTL;
use forebay_io::{DirError, DirLocation};

pub(crate) const STAGING: &str = "_forebay_staging";

/// Where a checkpoint's commits stage their files in the output directory:
/// `_forebay_staging_<hash of the checkpoint's location>`. Several jobs (each with its own
/// checkpoint) may write into one output directory; a run's recovery deletes only its own
/// checkpoint's staging directory, never the staged files of another job's commits still to
/// be published, nor a directory another job is creating. (The checkpoint's own
/// `_forebay_staging` is its own already.) A checkpoint reached by two spellings of its
/// location gets two staging directories: its records name their staged files, so nothing
/// is lost, and what a rolled-back commit left under the other name stays as hidden
/// garbage, as does what forebay before this layout left in the output's
/// `_forebay_staging` (its records still roll forward).
pub(crate) fn output_staging(state: &forebay_io::Dir) -> String {
    let key = xxhash_rust::xxh3::xxh3_64(state.root_uri().as_bytes());
    format!("{STAGING}_{key:016x}")
}

/// The directory of the commits' id files.
const IDS: &str = "ids";
const COMMITS: &str = "_forebay_commits";
const INPUTS: &str = "_forebay_inputs.json";
const FORMAT: u32 = 1;

/// What to do when an input file changed since a checkpoint recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnChangedInput {
    /// Fail the run, naming the file (the default: never skip data silently).
    Error,
    /// Read the file again; its rows are still filtered by id.
    Reprocess,
}

/// A checkpoint for a resumable, exactly-once `write_parquet`.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// None: rows are known by input position alone, and no id is written.
    pub(crate) id_column: Option<String>,
    /// Where it is (its Debug shows the option keys, never their values).
    pub(crate) location: DirLocation,
    pub(crate) num_shards: Option<usize>,
    pub(crate) delete_on_success: bool,
    pub(crate) on_changed_input: OnChangedInput,
    pub(crate) lease_ttl: std::time::Duration,
    /// Commit records a run folds into the inputs snapshot at a time (None: the default).
    pub(crate) fold_every: Option<usize>,
    /// Write into an output other checkpoints committed into (see `owners`).
    pub(crate) shares_output: bool,
    /// The longest a writer keeps rows uncommitted (None: until its file is full).
    pub(crate) commit_interval: Option<std::time::Duration>,
    /// The fingerprints of the run's map steps (set by the pipeline; see `transform`).
    pub(crate) transform: Vec<StepFingerprint>,
}

/// How long a writer keeps rows uncommitted by default: what a kill can lose is at most
/// about this much of the run's work (of calls to a paid endpoint, say), at the cost of a
/// file and a commit record per writer this often when rows come slowly.
pub const DEFAULT_COMMIT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

impl Checkpoint {
    /// A checkpoint at `path` (a directory or URI) keyed by the column `id_column`. A path
    /// that already holds Parquet files with that column (Ray Data's checkpoint layout, or a
    /// single file) counts their ids as done; forebay keeps its own state beside them (for a
    /// single file, in the directory `<file>.forebay`).
    pub fn new(id_column: impl Into<String>, path: impl Into<String>) -> Checkpoint {
        Checkpoint::at(Some(id_column.into()), DirLocation::uri(path))
    }

    /// A checkpoint keyed by `id_column` in a directory the caller opened: a local one,
    /// or a prefix of a store a host engine built ([`Dir::remote`](forebay_io::Dir::remote)),
    /// used as given (forebay never sees its credentials).
    pub fn in_dir(id_column: impl Into<String>, dir: forebay_io::Dir) -> Checkpoint {
        Checkpoint::at(Some(id_column.into()), DirLocation::opened(dir))
    }

    /// [`by_position`](Self::by_position) in a directory the caller opened.
    pub fn by_position_in(dir: forebay_io::Dir) -> Checkpoint {
        Checkpoint::at(None, DirLocation::opened(dir))
    }

    fn at(id_column: Option<String>, location: DirLocation) -> Checkpoint {
        Checkpoint {
            id_column,
            location,
            num_shards: None,
            delete_on_success: false,
            on_changed_input: OnChangedInput::Error,
            lease_ttl: DEFAULT_LEASE_TTL,
            fold_every: None,
            shares_output: false,
            commit_interval: Some(DEFAULT_COMMIT_INTERVAL),
            transform: Vec::new(),
        }
    }

    /// A checkpoint at `path` for input without an id column: rows are known by their
    /// input position alone (file, row group, row), valid while the inputs are unchanged
    /// (their identity is checked), and no id is written. Changed inputs cannot be read
    /// again (`OnChangedInput::Reprocess`: nothing tells their done rows apart), nor can the
    /// checkpoint hold ids of another writer.
    pub fn by_position(path: impl Into<String>) -> Checkpoint {
        Checkpoint::at(None, DirLocation::uri(path))
    }

    /// How long a checkpoint on an object store stays leased to a run that stopped renewing
    /// it (its machine died) before another run may take it over (default 30 s; a dead run
    /// on the same machine is noticed at once). The run renews it every third of that.
    pub fn with_lease_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.lease_ttl = ttl.max(std::time::Duration::from_millis(30));
        self
    }

    /// Fold the run's commit records into the inputs snapshot every `records` commits
    /// (default 256): a resume then reads the snapshot and fewer than `records` records,
    /// however many commits earlier runs made. Each fold rewrites the snapshot (a few
    /// hundred bytes per input file) and deletes the records it folded (a request each on
    /// object stores).
    pub fn with_fold_every(mut self, records: usize) -> Self {
        self.fold_every = Some(records.max(1));
        self
    }

    /// Commit what a writer holds once its file has been open this long, full or not
    /// (default [`DEFAULT_COMMIT_INTERVAL`]; `None`: only when a file reaches
    /// `rows_per_file`). A writer waiting for rows commits when the interval ends, so a kill
    /// loses at most about this much work of rows that reached the writer. Faster runs fill
    /// their files first and are not affected; slow ones write smaller files.
    pub fn with_commit_interval(mut self, interval: Option<std::time::Duration>) -> Self {
        self.commit_interval = interval.map(|i| i.max(std::time::Duration::from_millis(1)));
        self
    }

    /// Write into an output directory that holds files committed under other checkpoints:
    /// another job's, or this checkpoint's path before its directory was deleted. Without
    /// it a run whose checkpoint never committed into the output refuses such an output
    /// before reading anything, since a deleted checkpoint would write every row again
    /// beside the files committed before (the `owners` module).
    pub fn with_shared_output(mut self, shared: bool) -> Self {
        self.shares_output = shared;
        self
    }

    /// Hash shards of the id files (default: the checkpoint's own, else 16).
    pub fn with_num_shards(mut self, num_shards: usize) -> Self {
        self.num_shards = Some(num_shards);
        self
    }

    /// Delete forebay's checkpoint state once a run finishes successfully.
    pub fn with_delete_on_success(mut self, delete: bool) -> Self {
        self.delete_on_success = delete;
        self
    }

    pub fn with_on_changed_input(mut self, action: OnChangedInput) -> Self {
        self.on_changed_input = action;
        self
    }

    /// Options for the checkpoint's object store (`aws_endpoint`, credentials, ...); not
    /// for a checkpoint [`in_dir`](Self::in_dir), whose store is configured already (an
    /// error when the run starts).
    pub fn with_storage_options(mut self, options: StorageOptions) -> Self {
        self.location = self.location.with_options(options);
        self
    }

    /// Where the checkpoint is, as messages name it.
    pub fn path(&self) -> &str {
        self.location.shown()
    }

    /// The id column (None for a checkpoint [by position](Self::by_position)).
    pub fn id_column(&self) -> Option<&str> {
        self.id_column.as_deref()
    }
}

/// What the start of a checkpointed run found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumeReport {
    /// Commit records rolled forward (published) by recovery.
    pub commits_recovered: usize,
    /// Ids the checkpoint holds (rows already written).
    pub ids_done: u64,
    /// Input files recorded as finished (skipped unread when unchanged).
    pub files_done: usize,
    /// Input rows the checkpoint's commits account for under this run's scan filter: what
    /// a `limit()` of the job has used up (see `CommitRecord::input_rows`). None when a
    /// commit did not count them (forebay.ray's without positions, an older forebay's).
    pub input_rows_done: Option<u64>,
    /// Input files recorded as finished that are read again: changed since they were
    /// recorded, or finished under another scan filter (`on_changed_input="reprocess"`).
    pub files_changed: Vec<String>,
}

fn storage_err(e: DirError) -> EngineError {
    EngineError::storage("checkpoint", e)
}

fn corrupt(path: String, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Checkpoint {
        stage: "checkpoint".into(),
        source: Box::new(forebay_checkpoint::CheckpointError::Manifest {
            path,
            reason: format!(
                "{reason}; the checkpoint is damaged (restore the file, or delete the checkpoint \
                 directory to start over)"
            ),
        }),
    }
}

fn checkpoint_err(e: forebay_checkpoint::CheckpointError) -> EngineError {
    EngineError::Checkpoint {
        stage: "checkpoint".into(),
        source: Box::new(e),
    }
}

/// The error of a run that would skip inputs whose rows may differ (`on_changed_input`).
fn changed_input_error(reason: String) -> EngineError {
    EngineError::Checkpoint {
        stage: "checkpoint".into(),
        source: Box::new(forebay_checkpoint::CheckpointError::InvalidArgument(reason)),
    }
}
