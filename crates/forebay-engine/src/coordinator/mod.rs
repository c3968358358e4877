//! # Commits decided in one process, staged in others
//!
//! The commit protocol ([`crate::commit`]) with its steps split across processes, for
//! engines that run the map and write steps elsewhere (forebay.ray runs them in Ray tasks):
//!
//! ```text
//!  coordinator (one process: the driver)           stagers (any process, any number)
//!  ─────────────────────────────────────           ─────────────────────────────────
//!  CommitCoordinator::open
//!    lock, recover, check inputs, manifest
//!    ├─ finished_inputs() ── JSON ─────────────►  readers skip finished files/row groups,
//!    │                                             and the positions commits consumed
//!    │                                             (resumes_by_position(); else by id)
//!    └─ stager_spec() ────── JSON ─────────────►  CommitStager::new(spec, options)
//!                                                  stage(batches): the data file and the
//!                                                  id parts under _forebay_staging/
//!  commit(staged, completed inputs,  ◄── JSON ────  StagedCommit
//!         positions its rows hold)
//!    one record at a time (the commit point), then publish
//!  finish()
//! ```
//!
//! A staged file becomes visible only through the coordinator's record. A stager that dies
//! leaves staged files that no record names; the next run's recovery deletes them (its rows
//! are processed again). The caller decides which input units a commit completes (it tracks
//! each unit's rows across processes) and must report a unit complete only in the commit of
//! its last rows or after it: the record is what makes a later run skip the unit unread.
//! Likewise it tells each commit the input positions its rows hold (the `positions`
//! module: readers tag rows with them), so that a resume drops exactly those rows.
//!
//! The spec names the output and the checkpoint but carries no storage options: a stager
//! is given them by its caller ([`CommitStager::new`]), or the very directories when a host
//! opened them itself ([`CommitStager::in_dirs`]; in the coordinator's process,
//! [`CommitCoordinator::stager`]). Credentials never travel in the JSON.

use std::sync::Mutex;

use arrow_array::{ArrayRef, RecordBatch};
use forebay_checkpoint::IdFamily;
use forebay_parquet::{ParquetDataset, StorageOptions};
use serde::{Deserialize, Serialize};

mod host_file;

pub use host_file::StagingSlot;

use crate::commit::{
    ids_to_commit, stage_id_parts, Checkpoint, CommitFiles, CommitLog, DataFileRecord,
    FinishedInputs, IdPartsRecord, ResumeReport,
};
use crate::error::{EngineError, Result};
use crate::lineage::Completed;
use crate::positions::Consumed;
use crate::stats::WrittenFile;
use crate::writer::{OutputTarget, ParquetSink};
use forebay_io::Dir;

const STAGE: &str = "write_parquet";

/// Input positions a staged file's rows hold: per `(file, row_group)`, ranges
/// `(start, end)` of positions (see the `positions` module).
pub type ConsumedPositions = Vec<((usize, usize), Vec<(u64, u64)>)>;

/// What a stager needs to know, from the coordinator (serialisable: it goes to stagers in
/// other processes). It holds where the output and the checkpoint are, never how their
/// stores are opened (storage options, credentials).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StagerSpec {
    output: String,
    compression: String,
    row_group_rows: usize,
    /// The checkpoint's state directory.
    state: String,
    /// The output or the checkpoint is a directory the host opened: stagers are given
    /// directories ([`CommitStager::in_dirs`]), they cannot open them from `output`/`state`.
    #[serde(default)]
    opened_by_host: bool,
    /// None: a checkpoint by position (no ids are staged).
    id_column: Option<String>,
    /// The kind of ids the checkpoint holds (`IdFamily::name`); staged ids must be one.
    #[serde(default)]
    id_family: Option<String>,
    num_shards: usize,
    run_id: String,
}

impl StagerSpec {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("specs serialise")
    }

    pub fn from_json(text: &str) -> Result<StagerSpec> {
        serde_json::from_str(text)
            .map_err(|e| EngineError::InvalidArgument(format!("not a stager spec: {e}")))
    }

    pub fn id_column(&self) -> Option<&str> {
        self.id_column.as_deref()
    }

    /// The output directory (a path or URI; how messages name it when the host opened it).
    pub fn output(&self) -> &str {
        &self.output
    }

    /// The checkpoint's state directory, where the ids are staged.
    pub fn state(&self) -> &str {
        &self.state
    }
}

/// One staged commit: a data file and the ids of its rows, not yet visible.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StagedCommit {
    commit: String,
    data: Option<DataFileRecord>,
    ids: Option<IdPartsRecord>,
}

impl StagedCommit {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("staged commits serialise")
    }

    pub fn from_json(text: &str) -> Result<StagedCommit> {
        serde_json::from_str(text)
            .map_err(|e| EngineError::InvalidArgument(format!("not a staged commit: {e}")))
    }

    pub fn rows(&self) -> u64 {
        self.data.as_ref().map_or(0, |d| d.rows)
    }

    pub fn bytes(&self) -> u64 {
        self.data.as_ref().map_or(0, |d| d.bytes)
    }
}

/// Stages data files and their ids for a [`CommitCoordinator`] in another process.
pub struct CommitStager {
    spec: StagerSpec,
    output: OutputTarget,
    state: Dir,
}

impl CommitStager {
    /// A stager that opens the spec's output and checkpoint with these storage options
    /// (the ones the coordinator's sink and checkpoint were given; empty for local
    /// directories).
    pub fn new(
        spec: StagerSpec,
        output_options: &StorageOptions,
        checkpoint_options: &StorageOptions,
    ) -> Result<CommitStager> {
        if spec.opened_by_host {
            return Err(EngineError::InvalidArgument(format!(
                "the output {} or the checkpoint {} is a directory its host opened itself: a                  stager cannot open it by name; give it the same directories                  (CommitStager::in_dirs)",
                spec.output, spec.state
            )));
        }
        let output =
            Dir::open(&spec.output, output_options).map_err(|e| EngineError::storage(STAGE, e))?;
        let state = Dir::open(&spec.state, checkpoint_options)
            .map_err(|e| EngineError::storage("checkpoint", e))?;
        CommitStager::in_dirs(spec, output, state)
    }

    /// A stager writing into directories its caller opened: the output and the
    /// checkpoint's state directory the coordinator was given (`spec.output()`,
    /// `spec.state()`; a host's store, prefixes of it).
    pub fn in_dirs(spec: StagerSpec, output: Dir, state: Dir) -> Result<CommitStager> {
        for (dir, named, what) in [
            (&output, &spec.output, "output"),
            (&state, &spec.state, "checkpoint"),
        ] {
            if dir.root_uri() != *named {
                return Err(EngineError::InvalidArgument(format!(
                    "the stager was given the {what} directory {}, and the coordinator's is                      {named}",
                    dir.root_uri()
                )));
            }
        }
        let mut sink = ParquetSink::in_dir(output)
            .with_compression(&spec.compression)?
            .with_row_group_rows(spec.row_group_rows);
        if let Some(id_column) = &spec.id_column {
            sink = sink.with_unique_column(id_column);
        }
        let output = OutputTarget::open(sink, None)?;
        Ok(CommitStager {
            spec,
            output,
            state,
        })
    }

    /// Write `batches` as one staged data file and stage the ids of their rows (with an id
    /// column, which must be in every batch; it is written to the data file like any
    /// other).
    pub fn stage(&self, batches: &[RecordBatch]) -> Result<StagedCommit> {
        let commit = format!("{}-{}", self.spec.run_id, unique_suffix());
        let mut ids: Vec<ArrayRef> = Vec::with_capacity(batches.len());
        if let Some(id_column) = &self.spec.id_column {
            let expected = self.spec.id_family.as_deref().and_then(IdFamily::from_name);
            for batch in batches {
                let column = ids_to_commit(batch, id_column, expected)
                    .map_err(|reason| EngineError::write(STAGE, self.output_shown(), reason))?;
                ids.push(column);
            }
        }
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        if rows == 0 {
            return Ok(StagedCommit {
                commit,
                data: None,
                ids: None,
            });
        }
        let name = format!("part-{commit}.{}", self.output.extension());
        let staged = format!("{}/{name}", crate::commit::output_staging(&self.state));
        let written: WrittenFile = self.output.stage_file(&staged, batches)?;
        let ids = match &self.spec.id_column {
            Some(id_column) => {
                stage_id_parts(&self.state, id_column, self.spec.num_shards, &commit, &ids)?
            }
            None => None,
        };
        Ok(StagedCommit {
            commit,
            data: Some(DataFileRecord {
                staged,
                final_name: name,
                rows: written.rows,
                bytes: written.bytes,
            }),
            ids,
        })
    }

    fn output_shown(&self) -> String {
        self.spec.output.clone()
    }
}

/// Run `work` on the runtime's blocking threads and wait for it (the async variants); a
/// panic or a runtime shutting down is [`EngineError::Task`] saying `what` was done.
async fn on_blocking_thread<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(EngineError::Task {
            what: what.to_string(),
            reason: e.to_string(),
        })
    })
}

/// A name part no other stager of the run picks: the process, the time, a counter.
fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:x}-{nanos:x}-{:04}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The deciding side of a checkpointed write whose files are staged elsewhere.
pub struct CommitCoordinator {
    log: CommitLog,
    finished: FinishedInputs,
    report: ResumeReport,
    spec: StagerSpec,
    delete_on_success: bool,
    /// Earlier runs' progress is known by position (see [`resumes_by_position`]).
    by_position: bool,
    committed: Mutex<Vec<WrittenFile>>,
}

impl CommitCoordinator {
    /// Lock and recover the checkpoint (roll interrupted commits forward or back), check the
    /// inputs it recorded against `dataset`'s files, and write its manifest if missing. The
    /// ids it holds are not loaded here.
    pub fn open(
        checkpoint: &Checkpoint,
        sink: &ParquetSink,
        dataset: &ParquetDataset,
    ) -> Result<CommitCoordinator> {
        crate::locations::check_write_locations(
            dataset,
            sink.root(),
            Some(checkpoint.path()),
            false,
        )?;
        let output = sink.open_dir()?;
        let (log, finished, report) = CommitLog::prepare_without_ids(checkpoint, output, dataset)?;
        let spec = StagerSpec {
            output: log.output().root_uri(),
            compression: sink.compression_name.clone(),
            row_group_rows: sink.row_group_rows,
            state: log.state().root_uri(),
            opened_by_host: sink.location.is_opened() || checkpoint.location.is_opened(),
            id_column: checkpoint.id_column().map(str::to_string),
            id_family: log.ids().map(|ids| ids.family.name().to_string()),
            num_shards: log.num_shards(),
            run_id: log.run_id().to_string(),
        };
        Ok(CommitCoordinator {
            by_position: log.records_positions(),
            log,
            finished,
            report,
            spec,
            delete_on_success: checkpoint.delete_on_success,
            committed: Mutex::new(Vec::new()),
        })
    }

    /// What recovery found (`ids_done`: the ids forebay's commits published; the ids are
    /// not loaded here).
    pub fn report(&self) -> &ResumeReport {
        &self.report
    }

    /// The input files and row groups earlier runs finished.
    pub fn finished_inputs(&self) -> &FinishedInputs {
        &self.finished
    }

    /// The input files, in the order completions name them (`file` indices).
    pub fn files(&self) -> Vec<String> {
        self.log.files().map(str::to_string).collect()
    }

    pub fn stager_spec(&self) -> &StagerSpec {
        &self.spec
    }

    /// A stager in this process, on the coordinator's own directories (no store is opened
    /// again).
    pub fn stager(&self) -> Result<CommitStager> {
        CommitStager::in_dirs(
            self.spec.clone(),
            self.log.output().clone(),
            self.log.state().clone(),
        )
    }

    /// The checkpoint's state directory (where readers load the ids done).
    pub fn state_uri(&self) -> String {
        self.log.state().root_uri()
    }

    pub fn num_shards(&self) -> usize {
        self.log.num_shards()
    }

    /// Whether this run resumes by input position: readers drop the positions the
    /// finished inputs list (`consumed`) and need no id; else they drop done rows by id.
    pub fn resumes_by_position(&self) -> bool {
        self.by_position
    }

    /// Commit what a stager staged (or, with `None`, only completions), recording as
    /// finished the row groups `(file, row_group)` and the whole files in `completed_files`,
    /// and the input positions the staged rows hold: `consumed` lists, per `(file,
    /// row_group)`, ranges `start..end` of positions (see the `positions` module). `None`
    /// says the caller cannot tell which input rows the staged file holds: this commit and
    /// the run's later ones then record no positions, and a resume drops done rows by id.
    /// One commit at a time; when it returns, the data file is published.
    pub fn commit(
        &self,
        staged: Option<StagedCommit>,
        completed_units: Vec<(usize, usize)>,
        completed_files: Vec<usize>,
        consumed: Option<ConsumedPositions>,
    ) -> Result<()> {
        let files = self.log.files().count();
        let consumed_files = consumed.iter().flatten().map(|((f, _), _)| *f);
        if let Some(bad) = completed_units
            .iter()
            .map(|(f, _)| *f)
            .chain(completed_files.iter().copied())
            .chain(consumed_files)
            .find(|f| *f >= files)
        {
            return Err(EngineError::InvalidArgument(format!(
                "completion names input file {bad}, but the run has {files} input files"
            )));
        }
        // Rows counted only when the caller says which they are (or stages no data).
        let counted = consumed.is_some() || staged.as_ref().is_none_or(|s| s.data.is_none());
        let consumed = match consumed {
            Some(listed) => {
                let mut positions = Consumed::default();
                for (unit, ranges) in listed {
                    let held = positions.0.entry(unit).or_default();
                    for (start, end) in ranges {
                        if start >= end {
                            return Err(EngineError::InvalidArgument(format!(
                                "consumed positions {start}..{end} of input {unit:?} are empty"
                            )));
                        }
                        held.insert(start, end);
                    }
                }
                positions
            }
            None => {
                if staged.as_ref().is_some_and(|s| s.data.is_some()) {
                    if self.log.ids().is_none() {
                        return Err(EngineError::InvalidArgument(format!(
                            "a staged file's rows do not say which input rows they hold, and \
                             the checkpoint {} has no id column: a resume could not tell them \
                             apart from rows not written (keep forebay's tag columns through \
                             your steps, or checkpoint with an id column)",
                            self.log.state().root_uri()
                        )));
                    }
                    self.log.forget_positions();
                }
                Consumed::default()
            }
        };
        let completed = Completed {
            units: completed_units,
            files: completed_files,
        };
        let (commit, data, ids) = match staged {
            Some(s) => {
                if !s.commit.starts_with(self.log.run_id()) {
                    return Err(EngineError::InvalidArgument(format!(
                        "staged commit {} belongs to another run (this run is {})",
                        s.commit,
                        self.log.run_id()
                    )));
                }
                (s.commit, s.data, s.ids)
            }
            None => (self.log.next_commit_id(), None, None),
        };
        let published = data.as_ref().map(|d| WrittenFile {
            path: self.log.output().shown(&d.final_name),
            rows: d.rows,
            bytes: d.bytes,
        });
        let files = CommitFiles {
            data,
            dead_letters: Vec::new(),
            ids,
        };
        let input_rows = counted.then(|| consumed.rows());
        self.log
            .decide_and_publish(&commit, files, Vec::new(), completed, consumed, input_rows)?;
        if let Some(file) = published {
            self.committed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(file);
        }
        Ok(())
    }

    /// The data files committed so far.
    pub fn committed(&self) -> Vec<WrittenFile> {
        self.committed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// [`open`](Self::open) for async callers (the recovery's requests and fsyncs run on
    /// the runtime's blocking threads).
    pub async fn open_async(
        checkpoint: Checkpoint,
        sink: ParquetSink,
        dataset: ParquetDataset,
    ) -> Result<CommitCoordinator> {
        on_blocking_thread("opening the checkpoint", move || {
            CommitCoordinator::open(&checkpoint, &sink, &dataset)
        })
        .await
    }

    /// [`commit`](Self::commit) for async callers: one commit at a time still (a second
    /// waits for the first), on the runtime's blocking threads.
    pub async fn commit_async(
        self: &std::sync::Arc<Self>,
        staged: Option<StagedCommit>,
        completed_units: Vec<(usize, usize)>,
        completed_files: Vec<usize>,
        consumed: Option<ConsumedPositions>,
    ) -> Result<()> {
        let this = self.clone();
        on_blocking_thread("committing", move || {
            this.commit(staged, completed_units, completed_files, consumed)
        })
        .await
    }

    /// [`finish`](Self::finish) for async callers.
    pub async fn finish_async(self: &std::sync::Arc<Self>) -> Result<()> {
        let this = self.clone();
        on_blocking_thread("finishing the checkpoint", move || this.finish()).await
    }

    /// After a successful run: fold the records into the inputs snapshot, delete leftovers
    /// of stagers that died, and delete forebay's state if the checkpoint asks for it.
    pub fn finish(&self) -> Result<()> {
        self.log.finish(
            self.delete_on_success,
            crate::positions::Consumed::default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use forebay_parquet::DatasetSource;

    use super::*;

    fn input(dir: &std::path::Path) -> ParquetDataset {
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..100)) as ArrayRef,
            ),
            (
                "text",
                Arc::new(StringArray::from_iter_values(
                    (0..100).map(|i| format!("t{i}")),
                )),
            ),
        ])
        .unwrap();
        let path = dir.join("in.parquet");
        let file = std::fs::File::create(&path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        ParquetDataset::builder(DatasetSource::uris([path.to_str().unwrap()]))
            .build()
            .unwrap()
    }

    fn data_files(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".parquet"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn staged_elsewhere_visible_only_once_committed_and_finished_inputs_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let dataset = input(tmp.path());
        let out = tmp.path().join("out");
        let ckpt = tmp.path().join("ckpt");
        let checkpoint = Checkpoint::new("id", ckpt.to_str().unwrap());
        let sink = ParquetSink::new(out.to_str().unwrap());
        let coordinator = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        assert_eq!(coordinator.files().len(), 1);

        // A stager in "another process": only the JSON spec crosses.
        let spec = StagerSpec::from_json(&coordinator.stager_spec().to_json()).unwrap();
        let none = StorageOptions::new();
        let stager = CommitStager::new(spec, &none, &none).unwrap();
        let batch = dataset.scan().next_blocking().unwrap().unwrap().batch;
        let staged = stager.stage(std::slice::from_ref(&batch)).unwrap();
        assert_eq!(staged.rows(), 100);
        assert!(data_files(&out).is_empty(), "staged files are invisible");
        // A second stager that dies before its commit: its file must never appear.
        let _orphan = stager.stage(&[batch.slice(0, 10)]).unwrap();

        let staged = StagedCommit::from_json(&staged.to_json()).unwrap();
        coordinator
            .commit(Some(staged), vec![(0, 0)], vec![0], None)
            .unwrap();
        assert_eq!(data_files(&out).len(), 1);
        assert_eq!(coordinator.committed()[0].rows, 100);
        coordinator.finish().unwrap();
        drop(coordinator);

        // The next run: the ids are in the checkpoint, the input is finished, the orphan gone.
        let ids = forebay_checkpoint::CheckpointIndex::loader(ckpt.to_str().unwrap(), "id")
            .load()
            .unwrap();
        assert_eq!(ids.len(), 100);
        let again = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        assert_eq!(again.report().files_done, 1);
        assert_eq!(again.finished_inputs().complete_files(), 1);
        assert_eq!(data_files(&out).len(), 1);
        let staging: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(crate::commit::STAGING))
            .collect();
        assert!(staging.is_empty(), "{staging:?}");
    }

    #[test]
    fn a_commit_of_another_run_or_an_unknown_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dataset = input(tmp.path());
        let checkpoint = Checkpoint::new("id", tmp.path().join("ckpt").to_str().unwrap());
        let sink = ParquetSink::new(tmp.path().join("out").to_str().unwrap());
        let coordinator = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        let stranger = StagedCommit {
            commit: "another-run-1".into(),
            data: None,
            ids: None,
        };
        let err = coordinator
            .commit(Some(stranger), vec![], vec![], None)
            .unwrap_err();
        assert!(err.to_string().contains("another run"), "{err}");
        let err = coordinator
            .commit(None, vec![(3, 0)], vec![], None)
            .unwrap_err();
        assert!(err.to_string().contains("input file 3"), "{err}");
    }

    #[test]
    fn rows_without_the_id_column_are_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dataset = input(tmp.path());
        let checkpoint = Checkpoint::new("id", tmp.path().join("ckpt").to_str().unwrap());
        let sink = ParquetSink::new(tmp.path().join("out").to_str().unwrap());
        let coordinator = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        let stager = coordinator.stager().unwrap();
        let batch = RecordBatch::try_from_iter([(
            "other",
            Arc::new(Int64Array::from_iter_values(0..3)) as ArrayRef,
        )])
        .unwrap();
        let err = stager.stage(&[batch]).unwrap_err();
        assert!(err.to_string().contains("'id'"), "{err}");
    }

    /// A run of the tests' job: its input, checkpoint path and sink under `tmp`.
    fn job(tmp: &std::path::Path) -> (ParquetDataset, std::path::PathBuf, ParquetSink) {
        let sink = ParquetSink::new(tmp.join("out").to_str().unwrap());
        (input(tmp), tmp.join("ckpt"), sink)
    }

    fn uri(dataset: &ParquetDataset) -> String {
        dataset.files()[0].uri().to_string()
    }

    #[test]
    fn positions_committed_elsewhere_are_what_the_next_run_drops() {
        let tmp = tempfile::tempdir().unwrap();
        let (dataset, ckpt, sink) = job(tmp.path());
        let checkpoint = Checkpoint::new("id", ckpt.to_str().unwrap());
        let coordinator = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        assert!(coordinator.resumes_by_position(), "a new checkpoint");
        let stager = coordinator.stager().unwrap();
        let batch = dataset.scan().next_blocking().unwrap().unwrap().batch;
        // Rows 0-39 and 50-59 of row group 0, committed; then the run dies.
        let staged = stager
            .stage(&[batch.slice(0, 40), batch.slice(50, 10)])
            .unwrap();
        let held = vec![((0, 0), vec![(50, 60), (0, 40)])];
        coordinator
            .commit(Some(staged), vec![], vec![], Some(held))
            .unwrap();
        drop(coordinator);

        let again = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        assert!(again.resumes_by_position());
        assert_eq!(again.report().ids_done, 50);
        let consumed = again.finished_inputs().consumed(&uri(&dataset), 0).cloned();
        assert_eq!(consumed.unwrap().uncovered(0, 100), vec![40..50, 60..100]);
        // A commit whose rows do not say their positions: from now on, by id.
        let stager = again.stager().unwrap();
        let staged = stager.stage(&[batch.slice(40, 10)]).unwrap();
        again.commit(Some(staged), vec![], vec![], None).unwrap();
        drop(again);
        let third = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        assert!(!third.resumes_by_position());
        let err = third
            .commit(None, vec![], vec![], Some(vec![((0, 0), vec![(5, 5)])]))
            .unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }

    #[test]
    fn a_checkpoint_by_position_stages_no_id_and_needs_positions() {
        let tmp = tempfile::tempdir().unwrap();
        let (dataset, ckpt, sink) = job(tmp.path());
        let checkpoint = Checkpoint::by_position(ckpt.to_str().unwrap());
        let coordinator = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        let stager = coordinator.stager().unwrap();
        let batch = dataset.scan().next_blocking().unwrap().unwrap().batch;
        let staged = stager.stage(&[batch.slice(0, 10)]).unwrap();
        assert!(staged.ids.is_none(), "no id is staged");
        let err = coordinator
            .commit(Some(staged.clone()), vec![], vec![], None)
            .unwrap_err();
        assert!(err.to_string().contains("no id column"), "{err}");
        coordinator
            .commit(
                Some(staged),
                vec![],
                vec![],
                Some(vec![((0, 0), vec![(0, 10)])]),
            )
            .unwrap();
        coordinator.finish().unwrap();
        drop(coordinator);
        assert!(!ckpt.join("ids").exists());
        // Marked as by position: a run with an id column is refused.
        let with_ids = Checkpoint::new("id", ckpt.to_str().unwrap());
        let err = CommitCoordinator::open(&with_ids, &sink, &dataset)
            .err()
            .unwrap();
        assert!(err.to_string().contains("without an id column"), "{err}");
    }

    #[test]
    fn a_run_folds_its_records_so_a_resume_reads_few() {
        let tmp = tempfile::tempdir().unwrap();
        let (dataset, ckpt, sink) = job(tmp.path());
        let checkpoint = Checkpoint::new("id", ckpt.to_str().unwrap()).with_fold_every(4);
        let coordinator = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        let stager = coordinator.stager().unwrap();
        let batch = dataset.scan().next_blocking().unwrap().unwrap().batch;
        for i in 0..10 {
            let staged = stager.stage(&[batch.slice(i * 10, 10)]).unwrap();
            let held = vec![((0, 0), vec![(i as u64 * 10, i as u64 * 10 + 10)])];
            coordinator
                .commit(Some(staged), vec![], vec![], Some(held))
                .unwrap();
        }
        // Killed before finishing: 8 records folded, 2 left.
        drop(coordinator);
        let records = std::fs::read_dir(ckpt.join("_forebay_commits"))
            .unwrap()
            .count();
        assert_eq!(records, 2);
        let again = CommitCoordinator::open(&checkpoint, &sink, &dataset).unwrap();
        assert_eq!(again.report().commits_recovered, 2);
        assert_eq!(again.report().ids_done, 100);
        let consumed = again.finished_inputs().consumed(&uri(&dataset), 0).cloned();
        assert!(consumed.unwrap().uncovered(0, 100).is_empty());
        assert_eq!(data_files(&tmp.path().join("out")).len(), 10);
    }
}
