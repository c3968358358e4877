//! Opening a checkpoint for a run: lock (or lease) it, recover interrupted commits, and
//! check the inputs it recorded against this run's files and scan filter.

use arrow_schema::DataType;
use forebay_parquet::ParquetDataset;

use super::owners;
use super::records::{load_inputs, FinishedInputs, Identity};
use super::recovery::recover;
use super::transform::check_transform;
use super::{changed_input_error, storage_err, Checkpoint, OnChangedInput, ResumeReport};
use crate::error::{EngineError, Result};
use crate::lease::RunLock;
use forebay_io::Dir;

/// A checkpoint's state directory, recovered, with the inputs earlier runs finished.
pub(super) struct OpenedState {
    /// The checkpoint path: forebay's state, or a single id file beside it.
    pub(super) given: Dir,
    pub(super) state: Dir,
    /// The checkpoint path is a single id file; forebay's state lives in `<file>.forebay`.
    pub(super) single_file: bool,
    pub(super) run_id: String,
    pub(super) lock: RunLock,
    pub(super) finished: FinishedInputs,
    pub(super) report: ResumeReport,
    /// The id column's value type in the input (None: a checkpoint by position).
    pub(super) id_type: Option<DataType>,
    pub(super) files: Vec<(String, Identity)>,
    pub(super) scan_filter: Option<String>,
    /// Earlier runs' progress is known by input positions alone (see `positions`): this
    /// run drops done rows by position and needs no id of theirs.
    pub(super) positions: bool,
    /// Ids the folded commits published.
    pub(super) ids_published: u64,
    /// The checkpoint's identity (the `owners` module).
    pub(super) identity: String,
    /// The output holds this checkpoint's mark already.
    pub(super) output_marked: bool,
}

impl OpenedState {
    /// Lock and recover the checkpoint, and check the inputs it recorded against
    /// `dataset`'s files (a changed file is an error, or read again).
    pub(super) fn open(
        checkpoint: &Checkpoint,
        output: &Dir,
        dataset: &ParquetDataset,
    ) -> Result<Self> {
        // Where forebay's own files go: the path itself, or beside a single id file.
        let given = checkpoint.location.open().map_err(storage_err)?;
        let single_file = matches!(&given, Dir::Local(p) if p.is_file());
        let state = match &given {
            Dir::Local(file) if single_file => {
                let mut beside = file.clone().into_os_string();
                beside.push(".forebay");
                Dir::Local(beside.into())
            }
            _ => given.clone(),
        };
        state.create().map_err(storage_err)?;
        output.create().map_err(storage_err)?;
        let run_id = run_id();
        let lock = RunLock::acquire(&state, &run_id, checkpoint.lease_ttl)?;

        let identity = owners::identity(&state, &run_id)?;
        let output_marked = owners::check_output(output, &identity, checkpoint, &state)?;
        let recovered = recover(&state, output)?;
        let mut snapshot = load_inputs(&state)?;
        let committed_anything = recovered > 0 || snapshot.ids > 0 || !snapshot.files.is_empty();
        check_transform(&state, &checkpoint.transform, committed_anything)?;

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
        // Positions stand for rows only under the scan filter they were counted under, and
        // only while every done row is recorded by them (no id files of another writer).
        let has_positions = snapshot.files.values().any(|s| !s.consumed.is_empty());
        let foreign_ids = !single_file && has_foreign_ids(&given)?;
        let positions = snapshot.positions
            && !single_file
            && report.files_changed.is_empty()
            && (snapshot.scan_filter == scan_filter || !has_positions)
            && !foreign_ids;
        if checkpoint.id_column.is_none() {
            check_by_position(&state, &report, single_file || foreign_ids, positions)?;
        } else if state.exists(BY_POSITION).map_err(storage_err)? {
            return Err(changed_input_error(format!(
                "the checkpoint {} was written without an id column (by position), so it \
                 holds no id of the rows it finished: pass id_column=None to resume it, or \
                 start a new checkpoint to key rows by '{}'",
                state.root_uri(),
                checkpoint.id_column.as_deref().unwrap_or_default()
            )));
        }
        report.files_done = snapshot.files.values().filter(|s| s.complete).count();
        // Rows counted under another scan filter belong to another job.
        report.input_rows_done = if snapshot.scan_filter == scan_filter {
            snapshot.input_rows
        } else {
            Some(0)
        };

        let id_type = match &checkpoint.id_column {
            None => None,
            Some(id_column) => {
                let schema = dataset.schema();
                let field = schema.field_with_name(id_column).map_err(|_| {
                    EngineError::InvalidArgument(format!(
                        "the checkpoint's id column '{id_column}' is not a column of the input \
                         (it has {:?})",
                        schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
                    ))
                })?;
                Some(match field.data_type() {
                    DataType::Dictionary(_, v) => v.as_ref().clone(),
                    t => t.clone(),
                })
            }
        };
        let files = dataset
            .files()
            .iter()
            .map(|e| (e.uri().to_string(), Identity::of(e)))
            .collect();
        Ok(OpenedState {
            given,
            state,
            single_file,
            run_id,
            lock,
            finished: FinishedInputs(snapshot.files.into_iter().collect()),
            report,
            id_type,
            files,
            scan_filter,
            positions,
            ids_published: snapshot.ids,
            identity,
            output_marked,
        })
    }
}

/// The mark of a checkpoint written without an id column (by position): a run with an id
/// column must not take it over (it holds no id of the rows it finished).
pub(super) const BY_POSITION: &str = "_forebay_by_position";

/// A checkpoint by position (no id column) resumes only by position: every reason to
/// drop rows by id is an error here.
fn check_by_position(
    state: &Dir,
    report: &ResumeReport,
    holds_ids: bool,
    positions: bool,
) -> Result<()> {
    let shown = state.root_uri();
    let manifest =
        forebay_checkpoint::manifest_num_shards_in(state).map_err(super::checkpoint_err)?;
    let reason = if manifest.is_some() || holds_ids {
        "it holds ids (it was written with an id column, or holds id files of another \
         writer): pass that id column"
            .to_string()
    } else if !report.files_changed.is_empty() {
        format!(
            "reading changed or re-filtered inputs again ({}) needs ids to tell their done \
             rows apart: restore the inputs, or start a new checkpoint",
            report.files_changed.join(", ")
        )
    } else if !positions {
        "its progress was recorded by id (an older forebay, or forebay.ray rows without \
         their position tags): pass its id column"
            .to_string()
    } else {
        return Ok(());
    };
    Err(changed_input_error(format!(
        "the checkpoint {shown} cannot be resumed without an id column: {reason}"
    )))
}

/// Whether the checkpoint path holds id files forebay's commits did not write (Ray Data's
/// layout, `CheckpointIndex::write`'s shards): their rows are known only by id.
fn has_foreign_ids(path: &Dir) -> Result<bool> {
    let entries = path.entries("").map_err(storage_err)?;
    Ok(entries.iter().any(|e| {
        !(e.name.starts_with('_') || e.name.starts_with('.') || (e.is_dir && e.name == super::IDS))
    }))
}

pub(super) fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", nanos as u64, std::process::id())
}
