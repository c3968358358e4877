//! Files a caller wrote itself, committed like forebay's own: a name reserved in the
//! output's staging directory ([`CommitStager::reserve`]), the file written there by the
//! caller, then staged with the ids of its rows ([`CommitStager::stage_written`]) for the
//! coordinator's commit.

use arrow_array::{ArrayRef, RecordBatch};
use forebay_checkpoint::IdFamily;
use forebay_io::Dir;

use super::{unique_suffix, CommitStager, StagedCommit, STAGE};
use crate::commit::{ids_to_commit, stage_id_parts, DataFileRecord};
use crate::error::{EngineError, Result};

impl CommitStager {
    /// Where to write a file of the caller's own for the next commit: a name in the output's
    /// staging directory (`_forebay_staging_<key>/part-<commit>.<extension>`, `extension`
    /// without its dot). Write it there (a local path, or an object of the output's store),
    /// then [`stage_written`](Self::stage_written). Nothing is visible until the commit: a
    /// file left half written by a crash is deleted by the next run's recovery.
    pub fn reserve(&self, extension: &str) -> Result<StagingSlot> {
        let commit = format!("{}-{}", self.spec.run_id, unique_suffix());
        let final_name = format!("part-{commit}.{}", extension.trim_start_matches('.'));
        let output = self.output.dir();
        let staging = crate::commit::output_staging(&self.state);
        output
            .child(&staging)
            .create()
            .map_err(|e| EngineError::storage(STAGE, e))?;
        Ok(StagingSlot {
            staged: format!("{staging}/{final_name}"),
            final_name,
            commit,
            output: output.clone(),
        })
    }

    /// Stage the file the caller wrote at `slot` with the ids of its rows (with an id
    /// column: `ids` hold exactly one id per row of the file, in any chunks; without one,
    /// `ids` is empty). A Parquet file's rows are counted from its footer and must match the
    /// ids; a file of another format is taken as it is (`rows` then counts its ids).
    pub fn stage_written(&self, slot: StagingSlot, ids: &[ArrayRef]) -> Result<StagedCommit> {
        let shown = slot.shown();
        let bad = |reason: String| EngineError::write(STAGE, &shown, reason);
        let bytes = match (slot.local_path(), slot.object()) {
            (Some(path), _) => std::fs::metadata(&path)
                .map_err(|e| bad(format!("the file to commit is not there: {e}")))?
                .len(),
            (None, Some((store, location))) => forebay_io::block_on(async move {
                object_store::ObjectStoreExt::head(&store, &location)
                    .await
                    .map(|meta| meta.size)
            })
            .map_err(|e| bad(format!("the object to commit is not there: {e}")))?,
            (None, None) => unreachable!("a directory is local or remote"),
        };
        let id_rows: usize = ids.iter().map(|c| c.len()).sum();
        let rows = if slot.final_name.ends_with(".parquet") {
            let source = match slot.object() {
                Some((store, location)) => forebay_parquet::DatasetSource::Store {
                    store,
                    display_prefix: String::new(),
                    paths: vec![location.to_string()],
                },
                None => forebay_parquet::DatasetSource::uris([shown.clone()]),
            };
            forebay_parquet::ParquetDataset::builder(source)
                .build()
                .and_then(|d| d.count_rows())
                .map_err(|e| bad(format!("not a readable Parquet file: {e}")))?
        } else {
            id_rows as u64
        };
        let mut chunks: Vec<ArrayRef> = Vec::with_capacity(ids.len());
        match &self.spec.id_column {
            Some(id_column) => {
                if id_rows as u64 != rows {
                    return Err(bad(format!(
                        "the file holds {rows} rows but {id_rows} ids were given: a commit \
                         needs the id of every row it writes"
                    )));
                }
                let expected = self.spec.id_family.as_deref().and_then(IdFamily::from_name);
                for chunk in ids {
                    let batch = RecordBatch::try_from_iter([(id_column.as_str(), chunk.clone())])
                        .map_err(|e| bad(e.to_string()))?;
                    chunks.push(ids_to_commit(&batch, id_column, expected).map_err(bad)?);
                }
            }
            None if !ids.is_empty() => {
                return Err(bad(
                    "ids were given, but the checkpoint has no id column (it resumes by input \
                     position)"
                        .into(),
                ))
            }
            None => {}
        }
        let ids = match &self.spec.id_column {
            Some(id_column) if rows > 0 => stage_id_parts(
                &self.state,
                id_column,
                self.spec.num_shards,
                &slot.commit,
                &chunks,
            )?,
            _ => None,
        };
        Ok(StagedCommit {
            commit: slot.commit,
            data: Some(DataFileRecord {
                staged: slot.staged,
                final_name: slot.final_name,
                rows,
                bytes,
            }),
            ids,
        })
    }
}

/// A name reserved for a file the caller writes itself ([`CommitStager::reserve`]).
#[derive(Debug, Clone)]
pub struct StagingSlot {
    commit: String,
    /// Its name once committed, in the output directory.
    final_name: String,
    /// Relative to the output directory.
    staged: String,
    output: Dir,
}

impl StagingSlot {
    /// The local file to write (None when the output is on an object store).
    pub fn local_path(&self) -> Option<std::path::PathBuf> {
        self.output.local_path(&self.staged)
    }

    /// The store and object to write (None for a local output).
    pub fn object(
        &self,
    ) -> Option<(
        std::sync::Arc<dyn object_store::ObjectStore>,
        object_store::path::Path,
    )> {
        self.output.object(&self.staged)
    }

    /// The path or URI, for messages.
    pub fn shown(&self) -> String {
        self.output.shown(&self.staged)
    }

    /// The file's name in the output once committed.
    pub fn final_name(&self) -> &str {
        &self.final_name
    }
}
