//! A commit's ids: staged as hash-partitioned parts (one file, a row group per shard),
//! checked for the checkpoint's id type, and loaded back as the index a resumed run probes.

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::DataType;
use forebay_checkpoint::{CheckpointIndex, IdFamily, IdPartsWriter};

use super::records::IdPartsRecord;
use super::{checkpoint_err, IDS, STAGING};
use crate::error::{EngineError, Result};
use forebay_io::Dir;

/// Step 1 of a commit for its ids: write them as hash-partitioned parts under the state
/// directory's `_forebay_staging/<commit>/` (None when there are none).
pub(crate) fn stage_id_parts(
    state: &Dir,
    id_column: &str,
    num_shards: usize,
    commit: &str,
    ids: &[ArrayRef],
) -> Result<Option<IdPartsRecord>> {
    let mut writer = id_parts_writer(state, id_column, num_shards, commit)?;
    for chunk in ids {
        writer.push(chunk).map_err(checkpoint_err)?;
    }
    stage_ids(writer)
}

/// A writer of a commit's id parts, staged under the state directory's
/// `_forebay_staging/<commit>/` by [`stage_ids`].
pub(super) fn id_parts_writer(
    state: &Dir,
    id_column: &str,
    num_shards: usize,
    commit: &str,
) -> Result<IdPartsWriter> {
    IdPartsWriter::one_file_in(
        id_staging_dir(state, commit),
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
pub(super) fn id_staging_dir(state: &Dir, commit: &str) -> Dir {
    state.child(&format!("{STAGING}/{commit}"))
}

/// Where a commit's ids are published: one file, a row group per shard.
pub(super) fn id_file_name(commit: &str) -> String {
    format!("{IDS}/part-{commit}.parquet")
}

pub(super) fn id_family_of(id_type: &DataType) -> Result<IdFamily> {
    IdFamily::of(id_type).ok_or_else(|| {
        EngineError::InvalidArgument(format!("{id_type} is not a type of ids a checkpoint holds"))
    })
}

/// The ids of rows to commit: their `id_column`, checked against the checkpoint's kind of
/// ids (`expected`, when known); else why they cannot be committed.
pub(crate) fn ids_to_commit(
    batch: &RecordBatch,
    id_column: &str,
    expected: Option<IdFamily>,
) -> std::result::Result<ArrayRef, String> {
    let column = batch.column_by_name(id_column).ok_or_else(|| {
        format!(
            "the rows to write have no column '{id_column}', the checkpoint's id column (they \
             have {:?}); keep the id column in every step's output",
            batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
        )
    })?;
    match expected.and_then(|f| wrong_id_type(id_column, f, column.data_type())) {
        Some(reason) => Err(reason),
        None => Ok(column.clone()),
    }
}

/// Why ids of `got` cannot go into a checkpoint of `expected` ids, if they cannot: ids of
/// another kind would hash differently, so the checkpoint could never find them again (and
/// every later run would fail on its files). Checked before anything of them is staged.
fn wrong_id_type(id_column: &str, expected: IdFamily, got: &DataType) -> Option<String> {
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

/// The ids at `path` (a directory, or a local single id file), or `None` when there are none
/// yet (no Parquet files, no manifest).
pub(super) fn load_ids(
    path: &Dir,
    id_column: &str,
    num_shards: Option<usize>,
) -> forebay_checkpoint::Result<Option<CheckpointIndex>> {
    let mut loader = match path {
        // A local path may be a single file, which only the path loader reads.
        Dir::Local(local) => CheckpointIndex::loader(local.display().to_string(), id_column),
        Dir::Remote { .. } => CheckpointIndex::loader_in(path.clone(), id_column),
    };
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
