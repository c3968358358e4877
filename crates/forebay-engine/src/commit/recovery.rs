//! Recovery at the start of every run: roll recorded commits forward, fold their inputs
//! into the snapshot, and roll back what was staged without a record. Folding also runs
//! during a run (`CommitLog` folds every `FOLD_EVERY` records it published), so that a
//! long job's resume opens a bounded number of records, not one per commit.

use std::collections::BTreeSet;

use super::crash::crash_point;
use super::records::{load_inputs, CommitRecord, InputsSnapshot};
use super::{corrupt, storage_err, COMMITS, FORMAT, INPUTS, STAGING};
use crate::error::{EngineError, Result};
use forebay_io::Dir;

/// Roll every recorded commit forward, fold the records into the inputs snapshot, delete
/// the records and everything staged. Returns the number of records found.
pub(super) fn recover(state: &Dir, output: &Dir) -> Result<usize> {
    recover_skipping(state, output, &BTreeSet::new())
}

/// [`recover`], trusting that the commits in `published` are published (this process
/// published them).
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
    let mut records = Vec::with_capacity(names.len());
    for name in &names {
        if snapshot.folded.contains(name) {
            continue; // folded and published already; its file was not deleted yet
        }
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
        if !published.contains(&record.commit) {
            publish(state, output, &record)?;
        }
        crash_point("recovering");
        records.push(record);
    }
    fold_records(state, &mut snapshot, &records, &names)?;
    // Staged files that no record names are commits that did not happen.
    state.delete_staging(STAGING).map_err(storage_err)?;
    output.delete_staging(STAGING).map_err(storage_err)?;
    Ok(records.len())
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
    for name in names {
        state.delete(&record_path(name)).map_err(storage_err)?;
        crash_point("folding");
    }
    Ok(())
}

/// Where the record of `commit` is, in the state directory.
pub(super) fn record_path(commit: &str) -> String {
    format!("{COMMITS}/{commit}.json")
}

/// Move a record's staged files to their final names (idempotent).
pub(super) fn publish(state: &Dir, output: &Dir, record: &CommitRecord) -> Result<()> {
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
    Err(EngineError::Write {
        stage: "checkpoint".into(),
        path: dir.shown(final_name),
        reason: format!(
            "commit {commit} recorded this file, but it is neither published nor staged (deleted \
             by hand?); restore it, or delete the checkpoint to start over"
        ),
    })
}
