//! Recovery at the start of every run: roll recorded commits forward, fold their inputs
//! into the snapshot, and roll back what was staged without a record. Folding also runs
//! during a run (`CommitLog` folds every `FOLD_EVERY` records it published), so that a
//! long job's resume opens a bounded number of records, not one per commit.

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;

use super::crash::crash_point;
use super::records::{load_inputs, CommitRecord, DataFileRecord, InputsSnapshot};
use super::{corrupt, output_staging, storage_err, COMMITS, FORMAT, INPUTS, STAGING};
use crate::error::{EngineError, Result};
use forebay_io::durable::in_parallel;
use forebay_io::Dir;

/// Roll every recorded commit forward, fold the records into the inputs snapshot, delete
/// the records and everything staged. Returns the number of records found.
pub(super) fn recover(state: &Dir, output: &Dir) -> Result<usize> {
    recover_skipping(state, output, &BTreeSet::new())
}

/// [`recover`], trusting that the commits in `published` are published (this process
/// published them).
///
/// A record is read, and its files published, on several threads: on an object store each
/// is a round trip. A record none of whose files is still staged was published already (a
/// publish removes a staged file only after its copy or rename): only the files' presence
/// is checked, instead of a publish that finds nothing to move (a failed copy, a check and
/// a delete a file, on object stores). One listing of each staging directory tells them
/// apart.
pub(super) fn recover_skipping(
    state: &Dir,
    output: &Dir,
    published: &BTreeSet<String>,
) -> Result<usize> {
    let mut names: Vec<String> = state
        .list(COMMITS)
        .map_err(storage_err)?
        .into_iter()
        .filter_map(|n| Some(n.strip_suffix(".json")?.to_string()))
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let mut snapshot = load_inputs(state)?;
    // Records folded and published already, whose files were not deleted yet, are skipped.
    let to_roll: Vec<&String> = names
        .iter()
        .filter(|name| !snapshot.folded.contains(*name))
        .collect();
    let staged = if to_roll.is_empty() {
        StillStaged::default()
    } else {
        StillStaged::list(state, output)?
    };
    let rolled: Vec<Mutex<Option<CommitRecord>>> =
        to_roll.iter().map(|_| Mutex::new(None)).collect();
    let slots: Vec<(&String, &Mutex<Option<CommitRecord>>)> =
        to_roll.iter().copied().zip(&rolled).collect();
    in_parallel(&slots, |(name, slot)| {
        let record = read_record(state, name)?;
        if !published.contains(&record.commit) {
            if staged.holds_any_of(&record) {
                publish(state, output, &record)?;
            } else {
                check_published(state, output, &record)?;
            }
        }
        crash_point("recovering");
        *slot.lock().expect("no recovery thread panics holding it") = Some(record);
        Ok::<(), EngineError>(())
    })?;
    let records: Vec<CommitRecord> = rolled
        .into_iter()
        .filter_map(|slot| slot.into_inner().expect("no recovery thread panicked"))
        .collect();
    fold_records(state, &mut snapshot, &records, &names)?;
    // Staged files that no record names are commits that did not happen. In the output,
    // only this checkpoint's: other jobs may stage into the same output directory.
    state.delete_staging(STAGING).map_err(storage_err)?;
    output
        .delete_staging(&output_staging(state))
        .map_err(storage_err)?;
    Ok(records.len())
}

/// The commit record `name`, checked to be one this forebay reads.
fn read_record(state: &Dir, name: &str) -> Result<CommitRecord> {
    let relative = record_path(name);
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
    Ok(record)
}

/// The files left in the staging directories of the checkpoint and of the output (its
/// own, and the legacy shared one).
#[derive(Default)]
struct StillStaged {
    state: HashSet<String>,
    output: HashSet<String>,
}

impl StillStaged {
    fn list(state: &Dir, output: &Dir) -> Result<StillStaged> {
        let files_in = |dir: &Dir, staging: &str| -> Result<HashSet<String>> {
            Ok(dir
                .files_under(staging)
                .map_err(storage_err)?
                .into_iter()
                .collect())
        };
        // The output's: this checkpoint's staging directory, and the one shared by every
        // job before staging was per checkpoint (records of that forebay name it).
        let mut in_output = files_in(output, &output_staging(state))?;
        in_output.extend(files_in(output, STAGING)?);
        Ok(StillStaged {
            state: files_in(state, STAGING)?,
            output: in_output,
        })
    }

    /// Whether any file of `record` is still staged (its commit is not fully published).
    fn holds_any_of(&self, record: &CommitRecord) -> bool {
        let ids = record.ids.iter().flat_map(|ids| &ids.parts).any(|part| {
            self.state
                .contains(&format!("{STAGING}/{}/{part}", record.commit))
        });
        let data = record
            .output_files()
            .any(|data| self.output.contains(&data.staged));
        ids || data
    }
}

/// A record with nothing left staged: its files must be at their final names. Anything else
/// is a checkpoint someone changed by hand.
fn check_published(state: &Dir, output: &Dir, record: &CommitRecord) -> Result<()> {
    let ids = record
        .ids
        .iter()
        .flat_map(|ids| &ids.parts)
        .map(|p| (state, p));
    let data = record.output_files().map(|data| (output, &data.final_name));
    for (dir, final_name) in ids.chain(data) {
        if !dir.exists(final_name).map_err(storage_err)? {
            return Err(neither_published_nor_staged(
                dir,
                final_name,
                &record.commit,
            ));
        }
    }
    Ok(())
}

/// Fold published `records` into `snapshot` (as loaded from the state directory), write it,
/// then delete the record files `names` (the records' commits, and any the snapshot says
/// were folded already). The snapshot is written first and names what it folded, so a kill
/// at any moment loses nothing and folds nothing twice.
pub(super) fn fold_records(
    state: &Dir,
    snapshot: &mut InputsSnapshot,
    records: &[CommitRecord],
    names: &[String],
) -> Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    for record in records {
        snapshot.fold(record);
    }
    snapshot.format = FORMAT;
    snapshot.folded = names.to_vec();
    // Compact: a snapshot of 100,000 input files is rewritten by every fold.
    let bytes = serde_json::to_vec(&snapshot).expect("snapshots serialise");
    state.put_atomic(INPUTS, bytes).map_err(storage_err)?;
    crash_point("folded");
    // One bulk request on object stores, not one per record.
    let paths: Vec<String> = names.iter().map(|name| record_path(name)).collect();
    state
        .delete_files(&paths, || crash_point("folding"))
        .map_err(storage_err)
}

/// Where the record of `commit` is, in the state directory.
pub(super) fn record_path(commit: &str) -> String {
    format!("{COMMITS}/{commit}.json")
}

/// Move a record's staged files to their final names (idempotent). The id parts and each
/// output file are independent moves once the record is durable: they go at once, so a
/// commit on an object store waits one copy-and-delete, not one after another per file.
pub(super) fn publish(state: &Dir, output: &Dir, record: &CommitRecord) -> Result<()> {
    enum Move<'a> {
        IdParts(Vec<(String, String)>),
        OutputFile(&'a DataFileRecord),
    }
    let mut moves: Vec<Move> = Vec::new();
    if let Some(ids) = &record.ids {
        moves.push(Move::IdParts(
            ids.parts
                .iter()
                .map(|part| (format!("{STAGING}/{}/{part}", record.commit), part.clone()))
                .collect(),
        ));
    }
    moves.extend(record.output_files().map(Move::OutputFile));
    in_parallel(&moves, |one| match one {
        Move::IdParts(parts) => publish_id_parts(state, parts, &record.commit),
        Move::OutputFile(data) => {
            ensure_published(output, &data.staged, &data.final_name, &record.commit)
        }
    })
}

fn publish_id_parts(state: &Dir, parts: &[(String, String)], commit: &str) -> Result<()> {
    if let Err(e) = state.publish_all(parts) {
        for (staged, part) in parts {
            check_publishable(state, staged, part, commit)?;
        }
        return Err(storage_err(e));
    }
    crash_point("ids-published");
    Ok(())
}

pub(super) fn ensure_published(
    dir: &Dir,
    staged: &str,
    final_name: &str,
    commit: &str,
) -> Result<()> {
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
pub(super) fn check_publishable(
    dir: &Dir,
    staged: &str,
    final_name: &str,
    commit: &str,
) -> Result<()> {
    if dir.exists(staged).map_err(storage_err)? || dir.exists(final_name).map_err(storage_err)? {
        return Ok(());
    }
    Err(neither_published_nor_staged(dir, final_name, commit))
}

fn neither_published_nor_staged(dir: &Dir, final_name: &str, commit: &str) -> EngineError {
    EngineError::Write {
        stage: "checkpoint".into(),
        path: dir.shown(final_name),
        reason: format!(
            "commit {commit} recorded this file, but it is neither published nor staged (deleted \
             by hand?); restore it, or delete the checkpoint to start over"
        ),
        source: None,
    }
}
