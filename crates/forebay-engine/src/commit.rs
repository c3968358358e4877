//! # Exactly-once, resumable writes: the commit protocol
//!
//! A checkpointed `write_parquet` commits each output file together with what it covers:
//! the ids of its rows (hash-partitioned as forebay-checkpoint's loader reads them: one file
//! per commit, one row group per shard, so a resumed run filters them out) and the input
//! files and row groups it completes (so a resumed run skips them unread). Either all of
//! that becomes visible, or none of it.
//!
//! ## Files
//!
//! ```text
//!  <output>/part-<commit>.parquet                  data files (what readers of the output see)
//!  <output>/_forebay_staging/part-<commit>.parquet a data file not yet published
//!  <checkpoint>/_forebay_checkpoint                manifest (forebay-checkpoint: shard count, id type)
//!  <checkpoint>/ids/part-<commit>.parquet          ids of committed rows (a row group per shard)
//!  <checkpoint>/_forebay_staging/<commit>/ids/part-<commit>.parquet   ids not yet published
//!  <checkpoint>/shard=<k>/*.parquet                ids written one file per shard (by
//!                                                  CheckpointIndex::write, or before the
//!                                                  one-file layout): read the same way
//!  <checkpoint>/_forebay_commits/<commit>.json     commit record: the decision
//!  <checkpoint>/_forebay_inputs.json               inputs finished by earlier runs
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
//!  3 publish  move the staged id file, then the data file, to its final name
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
//!  merge the records' inputs into _forebay_inputs.json (atomic), then delete the records
//!  delete _forebay_staging/ in both directories: staged files without a record are
//!      commits that never happened (rolled back; their rows are processed again)
//! ```
//!
//! A SIGKILL at any moment leaves one of: staged files without a record (rolled back), a
//! record with files still staged (rolled forward), or a finished commit. Rows are written
//! once: a row's id is published only by the commit that publishes its data file, and a
//! resumed run drops rows whose id is published. Inputs are skipped only once every row
//! derived from them is committed or was dropped empty (the `lineage` module).
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
//! manifest. It keeps the inputs snapshot (a few hundred bytes per input file): a rerun of a
//! finished job, or of one killed while deleting, finds every input finished and writes
//! nothing again (it warns that it found the job done). Input files added since are read
//! and written; only their ids are no longer checked against the deleted ones.
//!
//! ## Testing the protocol
//!
//! `FOREBAY_CRASH_AT=<point>:<n>` makes the process SIGKILL itself the `n`-th time it
//! reaches `<point>` (`staged`, `recorded`, `ids-published`, `published`, `recovering`,
//! `deleting`: inside `delete_on_success`), so that tests can stop it inside a commit, a
//! recovery or the final deletion at will. Unset, it costs one check.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::ArrayRef;
use arrow::datatypes::DataType;
use forebay_checkpoint::{CheckpointIndex, IdFamily, IdPartsWriter, SharedCheckpointIndex};
use forebay_parquet::{FileEntry, ParquetDataset, ScanSkip, StorageOptions};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::lease::{RunLock, DEFAULT_LEASE_TTL};
use crate::lineage::{Completed, LineageBook, UnitTicket};
use crate::storage::{Dir, StorageError};

pub(crate) const STAGING: &str = "_forebay_staging";
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
    pub(crate) id_column: String,
    pub(crate) path: String,
    pub(crate) num_shards: Option<usize>,
    pub(crate) delete_on_success: bool,
    pub(crate) on_changed_input: OnChangedInput,
    pub(crate) storage_options: StorageOptions,
    pub(crate) lease_ttl: std::time::Duration,
}

impl Checkpoint {
    /// A checkpoint at `path` (a directory or URI) keyed by the column `id_column`. A path
    /// that already holds Parquet files with that column (Ray Data's checkpoint layout, or a
    /// single file) counts their ids as done; forebay keeps its own state beside them (for a
    /// single file, in the directory `<file>.forebay`).
    pub fn new(id_column: impl Into<String>, path: impl Into<String>) -> Checkpoint {
        Checkpoint {
            id_column: id_column.into(),
            path: path.into(),
            num_shards: None,
            delete_on_success: false,
            on_changed_input: OnChangedInput::Error,
            storage_options: StorageOptions::new(),
            lease_ttl: DEFAULT_LEASE_TTL,
        }
    }

    /// How long a checkpoint on an object store stays leased to a run that stopped renewing
    /// it (its machine died) before another run may take it over (default 30 s; a dead run
    /// on the same machine is noticed at once). The run renews it every third of that.
    pub fn with_lease_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.lease_ttl = ttl.max(std::time::Duration::from_millis(30));
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

    pub fn with_storage_options(mut self, options: StorageOptions) -> Self {
        self.storage_options = options;
        self
    }

    pub fn id_column(&self) -> &str {
        &self.id_column
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
    /// Input files recorded as finished that are read again: changed since they were
    /// recorded, or finished under another scan filter (`on_changed_input="reprocess"`).
    pub files_changed: Vec<String>,
}

/// An identity of an input file, to notice that it changed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Identity {
    size: u64,
    modified_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    e_tag: Option<String>,
}

impl Identity {
    fn of(entry: &FileEntry) -> Identity {
        Identity {
            size: entry.size(),
            modified_ms: entry.last_modified_ms(),
            e_tag: entry.e_tag().map(str::to_string),
        }
    }

    /// Same file: same size, and the same entity tag when both have one (else the same
    /// modification time).
    fn same_as(&self, other: &Identity) -> bool {
        self.size == other.size
            && match (&self.e_tag, &other.e_tag) {
                (Some(a), Some(b)) => a == b,
                _ => self.modified_ms == other.modified_ms,
            }
    }
}

/// What earlier runs finished of one input file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct InputState {
    #[serde(flatten)]
    identity: Identity,
    #[serde(default)]
    complete: bool,
    #[serde(default)]
    row_groups: BTreeSet<usize>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct InputsSnapshot {
    format: u32,
    /// The scan filter (`read_parquet(filter=...)`, as text) the inputs were finished
    /// under: a file finished under one filter may hold rows another one keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scan_filter: Option<String>,
    files: BTreeMap<String, InputState>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DataFileRecord {
    pub staged: String,
    #[serde(rename = "final")]
    pub final_name: String,
    pub rows: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct IdPartsRecord {
    /// Relative to the checkpoint directory's staging directory of this commit.
    pub parts: Vec<String>,
    pub count: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct InputRecord {
    uri: String,
    #[serde(flatten)]
    identity: Identity,
    #[serde(default)]
    complete: bool,
    #[serde(default)]
    row_groups: Vec<usize>,
}

/// The decision of one commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CommitRecord {
    format: u32,
    commit: String,
    data: Option<DataFileRecord>,
    ids: Option<IdPartsRecord>,
    inputs: Vec<InputRecord>,
    /// The run's scan filter (see [`InputsSnapshot`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scan_filter: Option<String>,
}

/// A data file the writer staged, ready to commit.
#[derive(Debug, Clone)]
pub(crate) struct StagedData {
    pub staged: String,
    pub final_name: String,
    pub rows: u64,
    pub bytes: u64,
}

/// The commit protocol of one run.
pub(crate) struct CommitLog {
    output: Dir,
    /// The checkpoint's state directory (forebay's files).
    state: Dir,
    storage_options: StorageOptions,
    id_column: String,
    /// The kind of ids the checkpoint holds: every output batch's id column must be one.
    id_family: IdFamily,
    num_shards: usize,
    book: Arc<LineageBook>,
    files: Vec<(String, Identity)>,
    /// The scan filter this run reads under (recorded with every completion).
    scan_filter: Option<String>,
    /// One decision at a time (see the module docs: completions go to the next record).
    deciding: Mutex<()>,
    /// Commits this log published itself: the last recovery of a run need not publish them
    /// again (on an object store that was two requests per file of every commit).
    published: Mutex<BTreeSet<String>>,
    run_id: String,
    next: AtomicU64,
    /// This run's hold on the checkpoint, checked before every decision; `None` once
    /// released.
    lock: Mutex<Option<RunLock>>,
}

/// Everything a checkpointed run needs, prepared before it starts.
pub(crate) struct Prepared {
    pub log: Arc<CommitLog>,
    pub index: SharedCheckpointIndex,
    pub dataset: ParquetDataset,
    pub report: ResumeReport,
}

fn storage_err(e: StorageError) -> EngineError {
    EngineError::Write {
        stage: "checkpoint".into(),
        path: e.path,
        reason: e.reason,
    }
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

/// The input files and row groups earlier runs finished, by URI: the scan skips them.
/// Serialisable, so that readers in other processes (Ray read tasks) skip the same.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FinishedInputs(HashMap<String, InputState>);

impl FinishedInputs {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("finished inputs serialise")
    }

    pub fn from_json(text: &str) -> Result<FinishedInputs> {
        serde_json::from_str(text).map_err(|e| {
            EngineError::InvalidArgument(format!("not a list of finished inputs: {e}"))
        })
    }

    /// Only the entries of these files (what one reader of a subset needs).
    pub fn subset<'a>(&self, uris: impl IntoIterator<Item = &'a str>) -> FinishedInputs {
        FinishedInputs(
            uris.into_iter()
                .filter_map(|u| self.0.get(u).map(|s| (u.to_string(), s.clone())))
                .collect(),
        )
    }

    /// Files recorded as complete.
    pub fn complete_files(&self) -> usize {
        self.0.values().filter(|s| s.complete).count()
    }
}

impl ScanSkip for FinishedInputs {
    fn skip_file(&self, file: &FileEntry) -> bool {
        self.0.get(file.uri()).is_some_and(|s| s.complete)
    }
    fn skip_row_group(&self, file: &FileEntry, row_group: usize) -> bool {
        self.0
            .get(file.uri())
            .is_some_and(|s| s.complete || s.row_groups.contains(&row_group))
    }
}

/// A checkpoint's state directory, recovered, with the inputs earlier runs finished.
struct OpenedState {
    state: Dir,
    state_uri: String,
    /// The checkpoint path is a single id file; forebay's state lives in `<file>.forebay`.
    single_file: bool,
    run_id: String,
    lock: RunLock,
    finished: FinishedInputs,
    report: ResumeReport,
    /// The id column's value type in the input.
    id_type: DataType,
    files: Vec<(String, Identity)>,
    scan_filter: Option<String>,
}

impl OpenedState {
    /// Lock and recover the checkpoint, and check the inputs it recorded against
    /// `dataset`'s files (a changed file is an error, or read again).
    fn open(checkpoint: &Checkpoint, output: &Dir, dataset: &ParquetDataset) -> Result<Self> {
        let options = &checkpoint.storage_options;
        // Where forebay's own files go: the path itself, or beside a single id file.
        let given = Dir::open(&checkpoint.path, options).map_err(storage_err)?;
        let single_file = matches!(&given, Dir::Local(p) if p.is_file());
        let state_uri = if single_file {
            format!("{}.forebay", given.root_uri())
        } else {
            given.root_uri()
        };
        let state = Dir::open(&state_uri, options).map_err(storage_err)?;
        state.create().map_err(storage_err)?;
        output.create().map_err(storage_err)?;
        let run_id = run_id();
        let lock = RunLock::acquire(&state, &run_id, checkpoint.lease_ttl)?;

        let recovered = recover(&state, output)?;
        let mut snapshot = load_inputs(&state)?;

        // Inputs that changed since they were recorded.
        let mut report = ResumeReport {
            commits_recovered: recovered,
            ..Default::default()
        };
        for entry in dataset.files() {
            let Some(recorded) = snapshot.files.get(entry.uri()) else {
                continue;
            };
            if recorded.identity.same_as(&Identity::of(entry)) {
                continue;
            }
            match checkpoint.on_changed_input {
                OnChangedInput::Error => {
                    return Err(changed_input_error(format!(
                        "input {} changed since the checkpoint {} recorded it (size {} -> {}, \
                         modified {} -> {} ms); its rows may differ, so it is not skipped: \
                         pass on_changed_input='reprocess' to read it again (rows whose id is \
                         done are still skipped), or start a new checkpoint",
                        entry.uri(),
                        state.root_uri(),
                        recorded.identity.size,
                        entry.size(),
                        recorded.identity.modified_ms,
                        entry.last_modified_ms()
                    )))
                }
                OnChangedInput::Reprocess => report.files_changed.push(entry.uri().to_string()),
            }
        }
        // Inputs finished under another scan filter may hold rows this run's filter keeps
        // (inputs finished with no filter hold none: every row was read).
        let scan_filter = dataset.filter().map(|f| f.to_string());
        if snapshot.scan_filter.is_some()
            && snapshot.scan_filter != scan_filter
            && !snapshot.files.is_empty()
        {
            let shown = |f: &Option<String>| f.clone().unwrap_or_else(|| "none".into());
            match checkpoint.on_changed_input {
                OnChangedInput::Error => {
                    return Err(changed_input_error(format!(
                        "the checkpoint {} finished {} inputs under the scan filter {}, and this \
                         run filters {}: a finished input may hold rows the new filter keeps, so \
                         none is skipped silently: pass on_changed_input='reprocess' to read \
                         every input again (rows whose id is done are still skipped), or start \
                         a new checkpoint",
                        state.root_uri(),
                        snapshot.files.len(),
                        shown(&snapshot.scan_filter),
                        shown(&scan_filter),
                    )))
                }
                OnChangedInput::Reprocess => {
                    for uri in snapshot.files.keys() {
                        if !report.files_changed.contains(uri) {
                            report.files_changed.push(uri.clone());
                        }
                    }
                }
            }
        }
        for uri in &report.files_changed {
            snapshot.files.remove(uri);
        }
        report.files_done = snapshot.files.values().filter(|s| s.complete).count();

        let id_type = {
            let schema = dataset.schema();
            let field = schema.field_with_name(&checkpoint.id_column).map_err(|_| {
                EngineError::InvalidArgument(format!(
                    "the checkpoint's id column '{}' is not a column of the input (it has {:?})",
                    checkpoint.id_column,
                    schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
                ))
            })?;
            match field.data_type() {
                DataType::Dictionary(_, v) => v.as_ref().clone(),
                t => t.clone(),
            }
        };
        let files = dataset
            .files()
            .iter()
            .map(|e| (e.uri().to_string(), Identity::of(e)))
            .collect();
        Ok(OpenedState {
            state,
            state_uri,
            single_file,
            run_id,
            lock,
            finished: FinishedInputs(snapshot.files.into_iter().collect()),
            report,
            id_type,
            files,
            scan_filter,
        })
    }
}

impl CommitLog {
    /// Recover the checkpoint, load what it holds, and open the log for this run.
    pub(crate) fn prepare(
        checkpoint: &Checkpoint,
        output: Dir,
        dataset: &ParquetDataset,
        book: Arc<LineageBook>,
    ) -> Result<Prepared> {
        let opened = OpenedState::open(checkpoint, &output, dataset)?;
        let options = &checkpoint.storage_options;
        // The ids done: everything under the checkpoint path (forebay's parts, and any id
        // files that were there: Ray's layout, a single file).
        let mut index = load_ids(
            &checkpoint.path,
            options,
            &checkpoint.id_column,
            checkpoint.num_shards,
        )
        .map_err(checkpoint_err)?;
        if opened.single_file {
            let shards = index
                .as_ref()
                .map(|i| i.num_shards())
                .or(checkpoint.num_shards);
            if let Some(more) = load_ids(&opened.state_uri, options, &checkpoint.id_column, shards)
                .map_err(checkpoint_err)?
            {
                match index.as_mut() {
                    Some(i) => i.merge(&more).map_err(checkpoint_err)?,
                    None => index = Some(more),
                }
            }
        }
        let index = match index {
            Some(i) => i,
            None => CheckpointIndex::new(
                opened.id_type.clone(),
                checkpoint.id_column.clone(),
                checkpoint
                    .num_shards
                    .unwrap_or(forebay_checkpoint::DEFAULT_NUM_SHARDS),
            )
            .map_err(checkpoint_err)?,
        };
        index
            .prepare(&opened.state_uri, options)
            .map_err(checkpoint_err)?;
        let mut report = opened.report.clone();
        report.ids_done = index.len() as u64;
        let skip = Arc::new(opened.finished.clone());
        let family = id_family_of(index.id_type())?;
        let log = CommitLog::new(checkpoint, output, opened, index.num_shards(), family, book);
        Ok(Prepared {
            dataset: dataset.with_skip(skip),
            index: Arc::new(std::sync::RwLock::new(index)),
            log: Arc::new(log),
            report,
        })
    }

    /// Recover the checkpoint and open the log without loading the ids (they are loaded
    /// elsewhere: by the readers' filters in other processes). The id parts get the
    /// checkpoint's shard count (its manifest's; else the one asked for, else the default),
    /// and the manifest is written when missing.
    pub(crate) fn prepare_without_ids(
        checkpoint: &Checkpoint,
        output: Dir,
        dataset: &ParquetDataset,
    ) -> Result<(CommitLog, FinishedInputs, ResumeReport)> {
        let opened = OpenedState::open(checkpoint, &output, dataset)?;
        if opened.single_file {
            return Err(EngineError::InvalidArgument(format!(
                "the checkpoint {} is a single file; this writer needs a checkpoint directory \
                 (or URI prefix) that its readers in other processes can load",
                checkpoint.path
            )));
        }
        let options = &checkpoint.storage_options;
        let declared = forebay_checkpoint::manifest_num_shards(&opened.state_uri, options)
            .map_err(checkpoint_err)?;
        let num_shards = match (declared, checkpoint.num_shards) {
            (Some(have), Some(asked)) if have != asked => {
                return Err(EngineError::InvalidArgument(format!(
                    "the checkpoint {} has {have} shards, not the {asked} asked for (leave \
                     num_shards unset to use the checkpoint's)",
                    opened.state.root_uri()
                )))
            }
            (Some(have), _) => have,
            (None, asked) => asked.unwrap_or(forebay_checkpoint::DEFAULT_NUM_SHARDS),
        };
        // Creates the manifest, or checks it against the id column and type.
        CheckpointIndex::new(
            opened.id_type.clone(),
            checkpoint.id_column.clone(),
            num_shards,
        )
        .and_then(|layout| layout.prepare(&opened.state_uri, options))
        .map_err(checkpoint_err)?;
        let finished = opened.finished.clone();
        let report = opened.report.clone();
        let family = id_family_of(&opened.id_type)?;
        let log = CommitLog::new(
            checkpoint,
            output,
            opened,
            num_shards,
            family,
            Arc::new(LineageBook::default()),
        );
        Ok((log, finished, report))
    }

    fn new(
        checkpoint: &Checkpoint,
        output: Dir,
        opened: OpenedState,
        num_shards: usize,
        id_family: IdFamily,
        book: Arc<LineageBook>,
    ) -> CommitLog {
        CommitLog {
            id_family,
            output,
            state: opened.state,
            storage_options: checkpoint.storage_options.clone(),
            id_column: checkpoint.id_column.clone(),
            num_shards,
            book,
            files: opened.files,
            scan_filter: opened.scan_filter,
            deciding: Mutex::new(()),
            published: Mutex::new(BTreeSet::new()),
            run_id: opened.run_id,
            next: AtomicU64::new(0),
            lock: Mutex::new(Some(opened.lock)),
        }
    }

    pub(crate) fn num_shards(&self) -> usize {
        self.num_shards
    }

    /// Let the next run have the checkpoint (its lock or lease): the run is over, though
    /// handles of it may live on. Nothing is committed through this log afterwards.
    pub(crate) fn release(&self) {
        self.lock.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    pub(crate) fn state(&self) -> &Dir {
        &self.state
    }

    pub(crate) fn storage_options(&self) -> &StorageOptions {
        &self.storage_options
    }

    pub(crate) fn files(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(|(uri, _)| uri.as_str())
    }

    pub(crate) fn id_column(&self) -> &str {
        &self.id_column
    }

    pub(crate) fn id_family(&self) -> IdFamily {
        self.id_family
    }

    pub(crate) fn output(&self) -> &Dir {
        &self.output
    }

    /// A new commit: its id, and where its data file is staged and published.
    pub(crate) fn next_commit(&self) -> (String, String, String) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let commit = format!("{}-{n:06}", self.run_id);
        let name = format!("part-{commit}.parquet");
        (commit, format!("{STAGING}/{name}"), name)
    }

    /// Step 1 of a commit for its ids, streaming: a writer of the commit's id parts, to be
    /// staged by [`stage_ids`] when the commit's data file is complete.
    pub(crate) fn id_parts_writer(&self, commit: &str) -> Result<IdPartsWriter> {
        id_parts_writer(
            &self.state,
            &self.storage_options,
            &self.id_column,
            self.num_shards,
            commit,
        )
    }

    /// Commit a staged data file (or, with `data: None`, only completions) with its staged
    /// ids ([`stage_ids`]) and the lineage tickets of its batches.
    pub(crate) fn commit(
        &self,
        commit: &str,
        data: Option<StagedData>,
        ids: Option<IdPartsRecord>,
        tickets: Vec<Arc<UnitTicket>>,
    ) -> Result<()> {
        let data = data.map(|d| DataFileRecord {
            staged: d.staged,
            final_name: d.final_name,
            rows: d.rows,
            bytes: d.bytes,
        });
        self.decide_and_publish(commit, data, ids, tickets, Completed::default())
    }

    /// Steps 2 and 3 of a commit whose files are staged: one record at a time, holding the
    /// completions its tickets release, and `also_completed` (completions decided by the
    /// caller: readers in other processes), then publish.
    pub(crate) fn decide_and_publish(
        &self,
        commit: &str,
        data: Option<DataFileRecord>,
        ids: Option<IdPartsRecord>,
        tickets: Vec<Arc<UnitTicket>>,
        also_completed: Completed,
    ) -> Result<()> {
        // 2. decide.
        let record = {
            let _one_at_a_time = self.deciding.lock().unwrap_or_else(|p| p.into_inner());
            self.book.release(tickets);
            let mut completed = self.book.take_completed();
            completed.units.extend(also_completed.units);
            completed.files.extend(also_completed.files);
            let record = CommitRecord {
                format: FORMAT,
                commit: commit.to_string(),
                data,
                ids,
                inputs: self.input_records(&completed),
                scan_filter: self.scan_filter.clone(),
            };
            if record.data.is_none() && record.ids.is_none() && record.inputs.is_empty() {
                return Ok(());
            }
            crash_point("staged");
            // Only while this run holds the checkpoint (a lease can be lost).
            match &*self.lock.lock().unwrap_or_else(|p| p.into_inner()) {
                Some(lock) => lock.check()?,
                None => return Err(EngineError::Cancelled),
            }
            let bytes = serde_json::to_vec_pretty(&record).expect("records serialise");
            self.state
                .put_atomic(&format!("{COMMITS}/{commit}.json"), bytes)
                .map_err(storage_err)?;
            crash_point("recorded");
            record
        };
        // 3. publish.
        publish(&self.state, &self.output, &record)?;
        crash_point("published");
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(record.commit);
        Ok(())
    }

    fn input_records(&self, completed: &Completed) -> Vec<InputRecord> {
        let mut by_file: BTreeMap<usize, InputRecord> = BTreeMap::new();
        let record = |i: usize| {
            let (uri, identity) = &self.files[i];
            InputRecord {
                uri: uri.clone(),
                identity: identity.clone(),
                complete: false,
                row_groups: Vec::new(),
            }
        };
        for &(file, rg) in &completed.units {
            by_file
                .entry(file)
                .or_insert_with(|| record(file))
                .row_groups
                .push(rg);
        }
        for &file in &completed.files {
            by_file.entry(file).or_insert_with(|| record(file)).complete = true;
        }
        by_file.into_values().collect()
    }

    /// After a successful run: record the last completions, fold the records into the
    /// inputs snapshot, and delete forebay's state if asked.
    pub(crate) fn finish(&self, delete: bool) -> Result<()> {
        let (commit, _, _) = self.next_commit();
        self.commit(&commit, None, None, Vec::new())?;
        let published =
            std::mem::take(&mut *self.published.lock().unwrap_or_else(|p| p.into_inner()));
        recover_skipping(&self.state, &self.output, &published)?;
        if delete {
            // The ids go; the inputs snapshot (every input finished) stays, so that a rerun
            // reads none of them instead of writing every row again.
            // Id files of commits (and the shard directories of ids written before them).
            let trees: Vec<String> = (0..self.num_shards)
                .map(|k| format!("shard={k}"))
                .chain([IDS.to_string(), COMMITS.to_string(), STAGING.to_string()])
                .collect();
            self.state.delete_trees(&trees).map_err(storage_err)?;
            crash_point("deleting");
            self.state
                .delete(forebay_checkpoint::MANIFEST_FILE)
                .map_err(storage_err)?;
        }
        Ok(())
    }
}

/// Step 1 of a commit for its ids: write them as hash-partitioned parts under the state
/// directory's `_forebay_staging/<commit>/` (None when there are none).
pub(crate) fn stage_id_parts(
    state: &Dir,
    storage_options: &StorageOptions,
    id_column: &str,
    num_shards: usize,
    commit: &str,
    ids: &[ArrayRef],
) -> Result<Option<IdPartsRecord>> {
    let mut writer = id_parts_writer(state, storage_options, id_column, num_shards, commit)?;
    for chunk in ids {
        writer.push(chunk).map_err(checkpoint_err)?;
    }
    stage_ids(writer)
}

/// A writer of a commit's id parts, staged under the state directory's
/// `_forebay_staging/<commit>/` by [`stage_ids`].
fn id_parts_writer(
    state: &Dir,
    storage_options: &StorageOptions,
    id_column: &str,
    num_shards: usize,
    commit: &str,
) -> Result<IdPartsWriter> {
    IdPartsWriter::one_file(
        &id_staging_root(state, commit),
        storage_options,
        id_column,
        num_shards,
        &id_file_name(commit),
    )
    .map_err(checkpoint_err)
}

/// Write the ids a commit's writer holds into its staging directory (None when there were
/// none).
pub(crate) fn stage_ids(ids: IdPartsWriter) -> Result<Option<IdPartsRecord>> {
    let (parts, count) = ids.finish().map_err(checkpoint_err)?;
    Ok((!parts.is_empty()).then_some(IdPartsRecord {
        parts,
        count: count as u64,
    }))
}

/// Where a commit's id parts are staged: `<checkpoint>/_forebay_staging/<commit>/`.
fn id_staging_root(state: &Dir, commit: &str) -> String {
    state.child(&format!("{STAGING}/{commit}")).root_uri()
}

/// Where a commit's ids are published: one file, a row group per shard.
fn id_file_name(commit: &str) -> String {
    format!("{IDS}/part-{commit}.parquet")
}

fn id_family_of(id_type: &DataType) -> Result<IdFamily> {
    IdFamily::of(id_type).ok_or_else(|| {
        EngineError::InvalidArgument(format!("{id_type} is not a type of ids a checkpoint holds"))
    })
}

/// Why ids of `got` cannot go into a checkpoint of `expected` ids, if they cannot: ids of
/// another kind would hash differently, so the checkpoint could never find them again (and
/// every later run would fail on its files). Checked before anything of them is staged.
pub(crate) fn wrong_id_type(id_column: &str, expected: IdFamily, got: &DataType) -> Option<String> {
    let family = IdFamily::of(got);
    let kind = family.map_or("not an id type".to_string(), |f| {
        format!("{} ids", f.name())
    });
    match family {
        Some(family) if family == expected => None,
        _ => Some(format!(
            "the output's id column '{id_column}' is {got} ({kind}), and this checkpoint holds \
             {} ids: \
             a step changed the id's type; keep the id column as it was read (cast it back in \
             your function). Nothing of this batch was committed, and the checkpoint stays \
             usable",
            expected.name()
        )),
    }
}

fn checkpoint_err(e: forebay_checkpoint::CheckpointError) -> EngineError {
    EngineError::Checkpoint {
        stage: "checkpoint".into(),
        source: Box::new(e),
    }
}

/// The fault-injection hook of the protocol's tests (see the module docs).
fn crash_point(point: &str) {
    static PLAN: std::sync::OnceLock<Option<(String, u64, AtomicU64)>> = std::sync::OnceLock::new();
    let plan = PLAN.get_or_init(|| {
        let spec = std::env::var("FOREBAY_CRASH_AT").ok()?;
        let (at, n) = spec.split_once(':')?;
        Some((at.to_string(), n.parse().ok()?, AtomicU64::new(0)))
    });
    if let Some((at, n, seen)) = plan {
        if at == point && seen.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            // SAFETY: raise only sends a signal to this process.
            unsafe { libc::raise(libc::SIGKILL) };
        }
    }
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", nanos as u64, std::process::id())
}

/// Roll every recorded commit forward, fold the records into the inputs snapshot, delete
/// the records and everything staged. Returns the number of records found.
fn recover(state: &Dir, output: &Dir) -> Result<usize> {
    recover_skipping(state, output, &BTreeSet::new())
}

/// [`recover`], trusting that the commits in `published` are published (this process
/// published them).
fn recover_skipping(state: &Dir, output: &Dir, published: &BTreeSet<String>) -> Result<usize> {
    let mut names: Vec<String> = state
        .list(COMMITS)
        .map_err(storage_err)?
        .into_iter()
        .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
        .collect();
    names.sort();
    let mut records = Vec::with_capacity(names.len());
    for name in &names {
        let relative = format!("{COMMITS}/{name}");
        let bytes = state
            .get(&relative)
            .map_err(storage_err)?
            .ok_or_else(|| corrupt(state.shown(&relative), "vanished while being read"))?;
        let record: CommitRecord = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(state.shown(&relative), format!("not a commit record: {e}")))?;
        if record.format != FORMAT {
            return Err(corrupt(
                state.shown(&relative),
                format!("format {} (this forebay reads {FORMAT})", record.format),
            ));
        }
        if !published.contains(&record.commit) {
            publish(state, output, &record)?;
        }
        crash_point("recovering");
        records.push(record);
    }
    if !records.is_empty() {
        let mut snapshot = load_inputs(state)?;
        for record in &records {
            if record.scan_filter != snapshot.scan_filter {
                // A run under another filter. What was finished with no filter stays
                // finished (every row was read); what was finished under another filter
                // is not finished under this one, and is read again.
                if snapshot.scan_filter.is_some() {
                    snapshot.files.clear();
                }
                snapshot.scan_filter = record.scan_filter.clone();
            }
            for input in &record.inputs {
                let entry = snapshot
                    .files
                    .entry(input.uri.clone())
                    .or_insert_with(|| InputState {
                        identity: input.identity.clone(),
                        complete: false,
                        row_groups: BTreeSet::new(),
                    });
                if !entry.identity.same_as(&input.identity) {
                    // Recorded again after it changed (reprocess): the new identity wins.
                    *entry = InputState {
                        identity: input.identity.clone(),
                        complete: false,
                        row_groups: BTreeSet::new(),
                    };
                }
                entry.complete |= input.complete;
                entry.row_groups.extend(input.row_groups.iter().copied());
            }
        }
        snapshot.format = FORMAT;
        let bytes = serde_json::to_vec_pretty(&snapshot).expect("snapshots serialise");
        state.put_atomic(INPUTS, bytes).map_err(storage_err)?;
        for name in &names {
            state
                .delete(&format!("{COMMITS}/{name}"))
                .map_err(storage_err)?;
        }
    }
    // Staged files that no record names are commits that did not happen.
    state.delete_staging(STAGING).map_err(storage_err)?;
    output.delete_staging(STAGING).map_err(storage_err)?;
    Ok(records.len())
}

/// Move a record's staged files to their final names (idempotent).
fn publish(state: &Dir, output: &Dir, record: &CommitRecord) -> Result<()> {
    if let Some(ids) = &record.ids {
        let moves: Vec<(String, String)> = ids
            .parts
            .iter()
            .map(|part| (format!("{STAGING}/{}/{part}", record.commit), part.clone()))
            .collect();
        if let Err(e) = state.publish_all(&moves) {
            for (staged, part) in &moves {
                check_publishable(state, staged, part, &record.commit)?;
            }
            return Err(storage_err(e));
        }
        crash_point("ids-published");
    }
    if let Some(data) = &record.data {
        ensure_published(output, &data.staged, &data.final_name, &record.commit)?;
    }
    Ok(())
}

fn ensure_published(dir: &Dir, staged: &str, final_name: &str, commit: &str) -> Result<()> {
    dir.publish(staged, final_name).map_err(|e| {
        check_publishable(dir, staged, final_name, commit)
            .err()
            .unwrap_or_else(|| storage_err(e))
    })
}

/// A recorded file must be staged (to publish) or published already (publishing is then a
/// no-op); anything else is a checkpoint someone changed by hand. Asked only after a
/// publish failed, to say so instead of the store's "not found" (asking first would cost
/// every commit a request per file on object stores).
fn check_publishable(dir: &Dir, staged: &str, final_name: &str, commit: &str) -> Result<()> {
    if dir.exists(staged).map_err(storage_err)? || dir.exists(final_name).map_err(storage_err)? {
        return Ok(());
    }
    Err(EngineError::Write {
        stage: "checkpoint".into(),
        path: dir.shown(final_name),
        reason: format!(
            "commit {commit} recorded this file, but it is neither published nor staged (deleted \
             by hand?); restore it, or delete the checkpoint to start over"
        ),
    })
}

/// The error of a run that would skip inputs whose rows may differ (`on_changed_input`).
fn changed_input_error(reason: String) -> EngineError {
    EngineError::Checkpoint {
        stage: "checkpoint".into(),
        source: Box::new(forebay_checkpoint::CheckpointError::InvalidArgument(reason)),
    }
}

fn load_inputs(state: &Dir) -> Result<InputsSnapshot> {
    match state.get(INPUTS).map_err(storage_err)? {
        None => Ok(InputsSnapshot {
            format: FORMAT,
            scan_filter: None,
            files: BTreeMap::new(),
        }),
        Some(bytes) => {
            let snapshot: InputsSnapshot = serde_json::from_slice(&bytes).map_err(|e| {
                corrupt(state.shown(INPUTS), format!("not an inputs snapshot: {e}"))
            })?;
            if snapshot.format != FORMAT {
                return Err(corrupt(
                    state.shown(INPUTS),
                    format!("format {} (this forebay reads {FORMAT})", snapshot.format),
                ));
            }
            Ok(snapshot)
        }
    }
}

/// The ids under `path`, or `None` when there are none yet (no Parquet files, no manifest).
fn load_ids(
    path: &str,
    options: &StorageOptions,
    id_column: &str,
    num_shards: Option<usize>,
) -> forebay_checkpoint::Result<Option<CheckpointIndex>> {
    let mut loader = CheckpointIndex::loader(path, id_column).with_storage_options(options.clone());
    if let Some(n) = num_shards {
        loader = loader.with_num_shards(n);
    }
    match loader.load() {
        Ok(index) => Ok(Some(index)),
        Err(forebay_checkpoint::CheckpointError::Read { source, .. })
            if matches!(*source, forebay_parquet::ParquetError::NotFound { .. }) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> (tempfile::TempDir, Dir, Dir) {
        dirs_on("local")
    }

    /// A checkpoint and an output directory on `kind`: "local", or "memory" (an object
    /// store: no rename, publishing is copy + delete).
    fn dirs_on(kind: &str) -> (tempfile::TempDir, Dir, Dir) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp = tempfile::tempdir().unwrap();
        let (state, output) = match kind {
            "local" => (
                Dir::Local(tmp.path().join("ckpt")),
                Dir::Local(tmp.path().join("out")),
            ),
            _ => {
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let open = |name: &str| {
                    Dir::open(
                        &format!("memory://commit-tests-{n}/{name}"),
                        &Default::default(),
                    )
                    .unwrap()
                };
                (open("ckpt"), open("out"))
            }
        };
        state.create().unwrap();
        output.create().unwrap();
        (tmp, state, output)
    }

    fn record(commit: &str) -> CommitRecord {
        CommitRecord {
            format: FORMAT,
            commit: commit.into(),
            data: Some(DataFileRecord {
                staged: format!("{STAGING}/part-{commit}.parquet"),
                final_name: format!("part-{commit}.parquet"),
                rows: 3,
                bytes: 4,
            }),
            ids: Some(IdPartsRecord {
                parts: vec![format!("shard=1/part-{commit}.parquet")],
                count: 3,
            }),
            inputs: vec![InputRecord {
                uri: "/in/a.parquet".into(),
                identity: Identity {
                    size: 10,
                    modified_ms: 5,
                    e_tag: None,
                },
                complete: false,
                row_groups: vec![2, 0],
            }],
            scan_filter: None,
        }
    }

    fn stage(state: &Dir, output: &Dir, commit: &str) {
        output
            .put_atomic(
                &format!("{STAGING}/part-{commit}.parquet"),
                b"data".to_vec(),
            )
            .unwrap();
        state
            .put_atomic(
                &format!("{STAGING}/{commit}/shard=1/part-{commit}.parquet"),
                b"ids".to_vec(),
            )
            .unwrap();
    }

    #[test]
    fn a_recorded_commit_is_rolled_forward() {
        for kind in ["local", "memory"] {
            rolled_forward_on(kind);
        }
    }

    fn rolled_forward_on(kind: &str) {
        let (_tmp, state, output) = dirs_on(kind);
        stage(&state, &output, "c1");
        let bytes = serde_json::to_vec(&record("c1")).unwrap();
        state
            .put_atomic(&format!("{COMMITS}/c1.json"), bytes)
            .unwrap();
        // Killed after the record, before publishing: recovery publishes both.
        assert_eq!(recover(&state, &output).unwrap(), 1);
        assert_eq!(
            output.get("part-c1.parquet").unwrap().unwrap().as_ref(),
            b"data"
        );
        assert_eq!(
            state
                .get("shard=1/part-c1.parquet")
                .unwrap()
                .unwrap()
                .as_ref(),
            b"ids"
        );
        assert!(
            state.list(COMMITS).unwrap().is_empty(),
            "records folded into the snapshot"
        );
        assert!(!state.exists(STAGING).unwrap() && !output.exists(STAGING).unwrap());
        let snapshot = load_inputs(&state).unwrap();
        assert_eq!(
            snapshot.files["/in/a.parquet"].row_groups,
            BTreeSet::from([0, 2])
        );
        // Recovering again changes nothing (idempotent).
        assert_eq!(recover(&state, &output).unwrap(), 0);
        assert!(output.exists("part-c1.parquet").unwrap());
    }

    /// A commit as a run makes it (files staged, record written), killed before publishing,
    /// then recovered: rolled forward and folded into the inputs snapshot.
    fn recorded_then_recovered(state: &Dir, output: &Dir, record: &CommitRecord) {
        stage(state, output, &record.commit);
        let bytes = serde_json::to_vec(record).unwrap();
        state
            .put_atomic(&format!("{COMMITS}/{}.json", record.commit), bytes)
            .unwrap();
        recover(state, output).unwrap();
    }

    /// A record of run 2, under filter `B`, finishing row group 1 of another file.
    fn under_filter_b(commit: &str) -> CommitRecord {
        let mut record = record(commit);
        record.scan_filter = Some("B".into());
        record.inputs[0].uri = "/in/b.parquet".into();
        record.inputs[0].row_groups = vec![1];
        record
    }

    #[test]
    fn inputs_finished_under_another_scan_filter_are_not_kept() {
        let (_tmp, state, output) = dirs();
        let mut first = record("c1");
        first.scan_filter = Some("A".into());
        recorded_then_recovered(&state, &output, &first);
        assert_eq!(
            load_inputs(&state).unwrap().scan_filter.as_deref(),
            Some("A")
        );
        recorded_then_recovered(&state, &output, &under_filter_b("c2"));
        // What run 1 finished under A is read again under B; run 2's work is kept.
        let snapshot = load_inputs(&state).unwrap();
        assert_eq!(snapshot.scan_filter.as_deref(), Some("B"));
        assert_eq!(snapshot.files.keys().collect::<Vec<_>>(), ["/in/b.parquet"]);
        assert_eq!(
            snapshot.files["/in/b.parquet"].row_groups,
            BTreeSet::from([1])
        );
    }

    #[test]
    fn inputs_finished_with_no_scan_filter_stay_finished_under_one() {
        let (_tmp, state, output) = dirs();
        recorded_then_recovered(&state, &output, &record("c1"));
        recorded_then_recovered(&state, &output, &under_filter_b("c2"));
        let snapshot = load_inputs(&state).unwrap();
        assert_eq!(snapshot.scan_filter.as_deref(), Some("B"));
        assert_eq!(
            snapshot.files.len(),
            2,
            "every row of a.parquet was read before"
        );
    }

    #[test]
    fn staged_files_without_a_record_are_rolled_back() {
        let (_tmp, state, output) = dirs();
        stage(&state, &output, "c2");
        assert_eq!(recover(&state, &output).unwrap(), 0);
        assert!(!output.exists("part-c2.parquet").unwrap());
        assert!(!state.exists("shard=1/part-c2.parquet").unwrap());
        assert!(output.list("").unwrap().is_empty());
    }

    #[test]
    fn the_last_recovery_of_a_run_does_not_publish_again_what_the_run_published() {
        let (_tmp, state, output) = dirs_on("memory");
        // A record whose files are neither staged nor published: publishing it fails...
        let bytes = serde_json::to_vec(&record("c5")).unwrap();
        state
            .put_atomic(&format!("{COMMITS}/c5.json"), bytes)
            .unwrap();
        // ...so a recovery that trusts the commit as published must not have tried.
        let published = BTreeSet::from(["c5".to_string()]);
        assert_eq!(recover_skipping(&state, &output, &published).unwrap(), 1);
        assert!(state.list(COMMITS).unwrap().is_empty(), "record folded");
        let snapshot = load_inputs(&state).unwrap();
        assert_eq!(
            snapshot.files["/in/a.parquet"].row_groups,
            BTreeSet::from([0, 2])
        );
    }

    #[test]
    fn a_record_whose_files_vanished_is_an_error() {
        for kind in ["local", "memory"] {
            vanished_files_on(kind);
        }
    }

    fn vanished_files_on(kind: &str) {
        let (_tmp, state, output) = dirs_on(kind);
        let bytes = serde_json::to_vec(&record("c3")).unwrap();
        state
            .put_atomic(&format!("{COMMITS}/c3.json"), bytes)
            .unwrap();
        let err = recover(&state, &output).unwrap_err().to_string();
        assert!(
            err.contains("part-c3.parquet") && err.contains("deleted by hand"),
            "{err}"
        );
        state
            .put_atomic(&format!("{COMMITS}/c4.json"), b"{\"format\": 1".to_vec())
            .unwrap();
        state.delete(&format!("{COMMITS}/c3.json")).unwrap();
        let err = recover(&state, &output).unwrap_err().to_string();
        assert!(err.contains("c4.json") && err.contains("damaged"), "{err}");
    }
}
