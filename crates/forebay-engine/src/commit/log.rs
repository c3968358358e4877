//! The commit log of one run: hands out commit names, stages a commit's ids, takes one
//! decision at a time (the commit point) and publishes, and finishes the checkpoint at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use forebay_checkpoint::{CheckpointIndex, IdFamily, IdPartsWriter, SharedCheckpointIndex};
use forebay_parquet::ParquetDataset;

use super::crash::crash_point;
use super::ids::{id_family_of, id_parts_writer, load_ids};
use super::open::OpenedState;
use super::open::BY_POSITION;
use super::owners;
use super::records::{
    load_inputs, CommitRecord, DataFileRecord, FinishedInputs, IdPartsRecord, Identity, InputRecord,
};
use super::recovery::{fold_records, publish, record_path, recover_skipping};
use super::{
    checkpoint_err, output_staging, storage_err, Checkpoint, ResumeReport, COMMITS, FORMAT, IDS,
    STAGING,
};
use crate::error::{EngineError, Result};
use crate::lease::RunLock;
use crate::lineage::{Completed, LineageBook, UnitTicket};
use crate::positions::{Consumed, RunPositions};
use forebay_io::Dir;

/// A data file the writer staged, ready to commit.
#[derive(Debug, Clone)]
pub(crate) struct StagedData {
    pub staged: String,
    pub final_name: String,
    pub rows: u64,
    pub bytes: u64,
}

/// The staged files one commit publishes.
pub(crate) struct CommitFiles {
    pub data: Option<DataFileRecord>,
    pub dead_letters: Vec<DataFileRecord>,
    pub ids: Option<IdPartsRecord>,
}

/// The commit protocol of one run.
pub(crate) struct CommitLog {
    output: Dir,
    /// The checkpoint's state directory (forebay's files).
    state: Dir,
    /// The ids each commit writes (None: a checkpoint by position writes none).
    ids: Option<IdColumn>,
    book: Arc<LineageBook>,
    files: Vec<(String, Identity)>,
    /// The scan filter this run reads under (recorded with every completion).
    scan_filter: Option<String>,
    /// This run records the positions each commit consumed (see `positions`); false when
    /// its rows are probed by id instead (a checkpoint with ids known only by id), and from
    /// the first commit whose positions its caller could not say (`forget_positions`).
    positions: AtomicBool,
    /// One decision at a time (see the module docs: completions go to the next record).
    deciding: Mutex<()>,
    /// Records this log published and has not folded into the inputs snapshot yet.
    unfolded: Mutex<Vec<CommitRecord>>,
    /// Records folded at a time (`Checkpoint::with_fold_every`, else `FOLD_EVERY` or
    /// `FOREBAY_FOLD_EVERY`).
    fold_every: usize,
    /// One fold at a time (each rewrites the snapshot).
    folding: Mutex<()>,
    /// Commits this log published itself: the last recovery of a run need not publish them
    /// again (on an object store that was two requests per file of every commit).
    published: Mutex<BTreeSet<String>>,
    run_id: String,
    next: AtomicU64,
    /// This run's hold on the checkpoint, checked before every decision; `None` once
    /// released.
    lock: Mutex<Option<RunLock>>,
    /// The checkpoint's identity, and whether the output holds its mark (written before
    /// the first record that publishes a file; see `owners`).
    identity: String,
    output_marked: AtomicBool,
    /// `Checkpoint::with_commit_interval`.
    commit_interval: Option<std::time::Duration>,
}

/// The id column of a checkpoint and how its commits write ids.
#[derive(Debug, Clone)]
pub(crate) struct IdColumn {
    pub name: String,
    /// The kind of ids the checkpoint holds: every output batch's id column must be one.
    pub family: IdFamily,
    pub num_shards: usize,
}

/// Everything a checkpointed run needs, prepared before it starts.
pub(crate) struct Prepared {
    pub log: Arc<CommitLog>,
    /// What a resume drops: rows at positions earlier commits consumed, or (a checkpoint
    /// whose rows are known only by id) rows whose id the loaded index holds.
    pub done: DoneRows,
    pub dataset: ParquetDataset,
    pub report: ResumeReport,
}

/// How a checkpointed run recognises rows earlier runs finished.
pub(crate) enum DoneRows {
    /// By input position (see `positions`); no id is loaded.
    Positions(Arc<RunPositions>),
    /// By id: every id under the checkpoint path, loaded.
    Ids(SharedCheckpointIndex),
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
        let (Some(id_column), Some(id_type), false) =
            (&checkpoint.id_column, &opened.id_type, opened.positions)
        else {
            // (Opening a checkpoint without an id column checked that it resumes by position.)
            return Self::prepare_positions(checkpoint, output, dataset, book, opened);
        };
        // The ids done: everything under the checkpoint path (forebay's parts, and any id
        // files that were there: Ray's layout, a single file).
        let mut index =
            load_ids(&opened.given, id_column, checkpoint.num_shards).map_err(checkpoint_err)?;
        if opened.single_file {
            let shards = index
                .as_ref()
                .map(|i| i.num_shards())
                .or(checkpoint.num_shards);
            if let Some(more) =
                load_ids(&opened.state, id_column, shards).map_err(checkpoint_err)?
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
                id_type.clone(),
                id_column.clone(),
                checkpoint
                    .num_shards
                    .unwrap_or(forebay_checkpoint::DEFAULT_NUM_SHARDS),
            )
            .map_err(checkpoint_err)?,
        };
        index
            .prepare_in(opened.state.clone())
            .map_err(checkpoint_err)?;
        let mut report = opened.report.clone();
        report.ids_done = index.len() as u64;
        let skip = Arc::new(opened.finished.clone());
        let ids = IdColumn {
            name: id_column.clone(),
            family: id_family_of(index.id_type())?,
            num_shards: index.num_shards(),
        };
        let log = CommitLog::new(checkpoint, output, opened, Some(ids), book);
        Ok(Prepared {
            dataset: dataset.with_skip(skip),
            done: DoneRows::Ids(Arc::new(std::sync::RwLock::new(index))),
            log: Arc::new(log),
            report,
        })
    }

    /// [`prepare`](Self::prepare) of a checkpoint whose progress is recorded by position:
    /// no id is loaded (the manifest is checked against the id column and type; without
    /// an id column, the checkpoint is marked as one by position).
    fn prepare_positions(
        checkpoint: &Checkpoint,
        output: Dir,
        dataset: &ParquetDataset,
        book: Arc<LineageBook>,
        opened: OpenedState,
    ) -> Result<Prepared> {
        let ids = Self::id_column_or_mark(checkpoint, &opened)?;
        let mut report = opened.report.clone();
        report.ids_done = opened.ids_published;
        let finished = Arc::new(opened.finished.clone());
        let log = CommitLog::new(checkpoint, output, opened, ids, book);
        Ok(Prepared {
            dataset: dataset.with_skip(finished.clone()),
            done: DoneRows::Positions(Arc::new(RunPositions::new(finished))),
            log: Arc::new(log),
            report,
        })
    }

    /// [`id_column`](Self::id_column), and without one the checkpoint marked as one by
    /// position (a run with an id column must not take it over).
    fn id_column_or_mark(
        checkpoint: &Checkpoint,
        opened: &OpenedState,
    ) -> Result<Option<IdColumn>> {
        let ids = Self::id_column(checkpoint, opened)?;
        if ids.is_none() {
            opened
                .state
                .put_atomic(BY_POSITION, b"rows are known by input position".to_vec())
                .map_err(storage_err)?;
        }
        Ok(ids)
    }

    /// The checkpoint's id column (None without one), with its shard count (its
    /// manifest's; else the one asked for, else the default), the manifest written when
    /// missing, or checked against the id column and type.
    fn id_column(checkpoint: &Checkpoint, opened: &OpenedState) -> Result<Option<IdColumn>> {
        let (Some(id_column), Some(id_type)) = (&checkpoint.id_column, &opened.id_type) else {
            return Ok(None);
        };
        let declared =
            forebay_checkpoint::manifest_num_shards_in(&opened.state).map_err(checkpoint_err)?;
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
        CheckpointIndex::new(id_type.clone(), id_column.clone(), num_shards)
            .and_then(|layout| layout.prepare_in(opened.state.clone()))
            .map_err(checkpoint_err)?;
        Ok(Some(IdColumn {
            name: id_column.clone(),
            family: id_family_of(id_type)?,
            num_shards,
        }))
    }

    /// Recover the checkpoint and open the log without loading any id (readers in other
    /// processes drop done rows: by the positions in the finished inputs when
    /// [`records_positions`](Self::records_positions), else by id in their own filters).
    /// The id parts get the checkpoint's shard count (its manifest's; else the one asked
    /// for, else the default), and the manifest is written when missing; a checkpoint
    /// without an id column is marked as one by position.
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
                checkpoint.path()
            )));
        }
        // (Opening a checkpoint without an id column checked that it resumes by position.)
        let ids = Self::id_column_or_mark(checkpoint, &opened)?;
        let finished = opened.finished.clone();
        let mut report = opened.report.clone();
        report.ids_done = opened.ids_published;
        // Whether this run resumes by position (`records_positions`) is the readers' to
        // follow: they drop the positions in `finished`, else probe ids.
        let log = CommitLog::new(
            checkpoint,
            output,
            opened,
            ids,
            Arc::new(LineageBook::default()),
        );
        Ok((log, finished, report))
    }

    fn new(
        checkpoint: &Checkpoint,
        output: Dir,
        opened: OpenedState,
        ids: Option<IdColumn>,
        book: Arc<LineageBook>,
    ) -> CommitLog {
        CommitLog {
            output,
            state: opened.state,
            ids,
            book,
            files: opened.files,
            scan_filter: opened.scan_filter,
            positions: AtomicBool::new(opened.positions),
            deciding: Mutex::new(()),
            unfolded: Mutex::new(Vec::new()),
            fold_every: checkpoint.fold_every.unwrap_or_else(fold_every),
            folding: Mutex::new(()),
            published: Mutex::new(BTreeSet::new()),
            run_id: opened.run_id,
            next: AtomicU64::new(0),
            lock: Mutex::new(Some(opened.lock)),
            identity: opened.identity,
            output_marked: AtomicBool::new(opened.output_marked),
            commit_interval: checkpoint.commit_interval,
        }
    }

    /// Whether this run records the positions its commits consume: earlier runs' progress
    /// is known by position, so a resume drops rows by position, not by id.
    pub(crate) fn records_positions(&self) -> bool {
        self.positions.load(Ordering::Relaxed)
    }

    /// Commits from now on do not record positions: their caller cannot say which input
    /// rows they hold (a resume then drops done rows by id).
    pub(crate) fn forget_positions(&self) {
        self.positions.store(false, Ordering::Relaxed);
    }

    /// Shards of the checkpoint's id files (0 without an id column).
    pub(crate) fn num_shards(&self) -> usize {
        self.ids.as_ref().map_or(0, |i| i.num_shards)
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

    pub(crate) fn files(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(|(uri, _)| uri.as_str())
    }

    /// The checkpoint's id column (None: a checkpoint by position, which writes no id).
    /// The longest a writer keeps rows uncommitted (`Checkpoint::with_commit_interval`).
    pub(crate) fn commit_interval(&self) -> Option<std::time::Duration> {
        self.commit_interval
    }

    pub(crate) fn ids(&self) -> Option<&IdColumn> {
        self.ids.as_ref()
    }

    pub(crate) fn output(&self) -> &Dir {
        &self.output
    }

    /// This checkpoint's staging directory in the output (see [`output_staging`]).
    pub(crate) fn output_staging(&self) -> String {
        output_staging(&self.state)
    }

    /// A new commit's id.
    pub(crate) fn next_commit_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n:06}", self.run_id)
    }

    /// A new commit: its id, and where its data file is staged and published.
    /// `extension` is the data file format's (`"parquet"`).
    pub(crate) fn next_commit(&self, extension: &str) -> (String, String, String) {
        let commit = self.next_commit_id();
        let name = format!("part-{commit}.{extension}");
        (commit, format!("{}/{name}", self.output_staging()), name)
    }

    /// Step 1 of a commit for its ids, streaming: a writer of the commit's id parts, to be
    /// staged by [`stage_ids`] when the commit's data file is complete.
    /// None without an id column.
    pub(crate) fn id_parts_writer(&self, commit: &str) -> Result<Option<IdPartsWriter>> {
        self.ids
            .as_ref()
            .map(|ids| id_parts_writer(&self.state, &ids.name, ids.num_shards, commit))
            .transpose()
    }

    /// Commit a staged data file (or, with `data: None`, only completions) and the staged
    /// files of rows set aside (`dead_letters`, see `dead_letter`) with its staged ids
    /// ([`stage_ids`]) and the lineage tickets of its batches.
    pub(crate) fn commit(
        &self,
        commit: &str,
        data: Option<StagedData>,
        dead_letters: Vec<StagedData>,
        ids: Option<IdPartsRecord>,
        tickets: Vec<Arc<UnitTicket>>,
        consumed: Consumed,
    ) -> Result<()> {
        let record = |d: StagedData| DataFileRecord {
            staged: d.staged,
            final_name: d.final_name,
            rows: d.rows,
            bytes: d.bytes,
        };
        let files = CommitFiles {
            data: data.map(record),
            dead_letters: dead_letters.into_iter().map(record).collect(),
            ids,
        };
        let input_rows = Some(consumed.rows());
        self.decide_and_publish(
            commit,
            files,
            tickets,
            Completed::default(),
            consumed,
            input_rows,
        )
    }

    /// Steps 2 and 3 of a commit whose files are staged: one record at a time, holding the
    /// completions its tickets release, `also_completed` (completions decided by the
    /// caller: readers in other processes), the positions its rows consumed and how many
    /// input rows it accounts for (None: not known), then publish.
    pub(crate) fn decide_and_publish(
        &self,
        commit: &str,
        files: CommitFiles,
        tickets: Vec<Arc<UnitTicket>>,
        also_completed: Completed,
        consumed: Consumed,
        input_rows: Option<u64>,
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
                data: files.data,
                dead_letters: files.dead_letters,
                ids: files.ids,
                inputs: self.input_records(&completed, consumed),
                scan_filter: self.scan_filter.clone(),
                positions: self.positions.load(Ordering::Relaxed),
                input_rows,
            };
            if record.output_files().next().is_none()
                && record.ids.is_none()
                && record.inputs.is_empty()
            {
                return Ok(());
            }
            crash_point("staged");
            // Only while this run holds the checkpoint (a lease can be lost).
            match &*self.lock.lock().unwrap_or_else(|p| p.into_inner()) {
                Some(lock) => lock.check()?,
                None => return Err(EngineError::Cancelled),
            }
            if record.output_files().next().is_some() && !self.output_marked.load(Ordering::Relaxed)
            {
                owners::mark_output(&self.output, &self.identity, &self.state)?;
                self.output_marked.store(true, Ordering::Relaxed);
            }
            let bytes = serde_json::to_vec_pretty(&record).expect("records serialise");
            self.state
                .put_atomic(&record_path(commit), bytes)
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
            .insert(record.commit.clone());
        // Every `fold_every` records, fold them into the inputs snapshot.
        let due = {
            let mut unfolded = self.unfolded.lock().unwrap_or_else(|p| p.into_inner());
            unfolded.push(record);
            (unfolded.len() >= self.fold_every).then(|| std::mem::take(&mut *unfolded))
        };
        match due {
            Some(records) => self.fold(records),
            None => Ok(()),
        }
    }

    /// Fold records this log published into the inputs snapshot and delete them, so that a
    /// resume reads the snapshot and at most `fold_every` records, however many commits
    /// the run made (recovery's fold, during the run).
    fn fold(&self, records: Vec<CommitRecord>) -> Result<()> {
        let _one_fold_at_a_time = self.folding.lock().unwrap_or_else(|p| p.into_inner());
        match &*self.lock.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(lock) => lock.check()?,
            None => return Err(EngineError::Cancelled),
        }
        let mut snapshot = load_inputs(&self.state)?;
        let names: Vec<String> = records.iter().map(|r| r.commit.clone()).collect();
        fold_records(&self.state, &mut snapshot, &records, &names)?;
        let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        for name in &names {
            published.remove(name);
        }
        Ok(())
    }

    fn input_records(&self, completed: &Completed, consumed: Consumed) -> Vec<InputRecord> {
        let mut by_file: BTreeMap<usize, InputRecord> = BTreeMap::new();
        let record = |i: usize| {
            let (uri, identity) = &self.files[i];
            InputRecord {
                uri: uri.clone(),
                identity: identity.clone(),
                complete: false,
                row_groups: Vec::new(),
                consumed: BTreeMap::new(),
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
        if self.positions.load(Ordering::Relaxed) {
            for ((file, rg), ranges) in consumed.0 {
                let entry = by_file.entry(file).or_insert_with(|| record(file));
                // A row group this record finishes needs no positions.
                if !entry.complete && !entry.row_groups.contains(&rg) {
                    entry.consumed.insert(rg, ranges);
                }
            }
        }
        by_file.into_values().collect()
    }

    /// After a successful run: record the last completions, fold the records into the
    /// inputs snapshot, and delete forebay's state if asked.
    /// `emptied`: rows maps turned into nothing since the last commit took them.
    pub(crate) fn finish(&self, delete: bool, emptied: Consumed) -> Result<()> {
        let commit = self.next_commit_id();
        self.commit(&commit, None, Vec::new(), None, Vec::new(), emptied)?;
        let _one_fold_at_a_time = self.folding.lock().unwrap_or_else(|p| p.into_inner());
        let published =
            std::mem::take(&mut *self.published.lock().unwrap_or_else(|p| p.into_inner()));
        recover_skipping(&self.state, &self.output, &published)?;
        self.unfolded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        if delete {
            // The ids go; the inputs snapshot (every input finished) stays, so that a rerun
            // reads none of them instead of writing every row again.
            // Id files of commits (and the shard directories of ids written before them).
            let trees: Vec<String> = (0..self.num_shards())
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

/// Records a run folds into the inputs snapshot at a time: a resume reads at most this many
/// records besides the snapshot. Each fold rewrites the snapshot (a few hundred bytes per
/// input file) and deletes the records, one request each on object stores.
const FOLD_EVERY: usize = 256;

/// [`FOLD_EVERY`], or `FOREBAY_FOLD_EVERY` (the protocol's tests fold every few commits to
/// kill the process inside folds).
fn fold_every() -> usize {
    std::env::var("FOREBAY_FOLD_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(FOLD_EVERY)
}
