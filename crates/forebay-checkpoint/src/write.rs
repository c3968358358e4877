//! Writing ids: a whole index ([`CheckpointIndex::write`]) or chunks of ids as parts, with
//! the manifest.

use arrow_array::ArrayRef;
use arrow_schema::DataType;
use forebay_parquet::StorageOptions;

use crate::directory::{clean_stale_temp_files, open_dir, read_manifest, WriteSummary};
use crate::error::{CheckpointError, Result};
use crate::id_parts::IdPartsWriter;
use crate::index::CheckpointIndex;
use crate::layout::{unique_part_name, Manifest, MANIFEST_FILE};
use forebay_io::Dir;

impl CheckpointIndex {
    /// Persist the ids inserted since the last write into the checkpoint at `path`, one new
    /// part file per shard that received ids (`<path>/shard=<k>/part-<id>.parquet`), each
    /// committed atomically. Creates the manifest on first write and refuses a checkpoint
    /// whose manifest disagrees (shard count, id family, id column). Ids already loaded from
    /// files are not rewritten: a checkpoint is an append-only set of parts. On error the ids
    /// stay pending, so the write can be retried (re-written ids are harmless duplicates).
    pub fn write(&mut self, path: &str, storage_options: &StorageOptions) -> Result<WriteSummary> {
        self.write_to(open_dir(path, storage_options)?)
    }

    /// [`write`](Self::write) into a directory the caller opened: a local one, or a prefix
    /// of a store it built (`Dir::Remote`), whose credentials forebay never sees.
    pub fn write_to(&mut self, dir: Dir) -> Result<WriteSummary> {
        let job = self.write_job(dir);
        let pending = job.pending.clone();
        job.run().inspect_err(|_| self.restore_pending(pending))
    }

    /// [`write_to`](Self::write_to) for async callers: the requests and the encoding run on
    /// the runtime's blocking threads, not on the caller's task.
    ///
    /// ```no_run
    /// # async fn run(mut done: forebay_checkpoint::CheckpointIndex,
    /// #              store: std::sync::Arc<dyn object_store::ObjectStore>)
    /// #              -> forebay_checkpoint::Result<()> {
    /// let dir = forebay_io::Dir::remote(store, "job/checkpoint", "s3://bucket/job/checkpoint")?;
    /// let summary = done.write_async(dir).await?;
    /// println!("{} ids in {} files", summary.ids, summary.files.len());
    /// # Ok(()) }
    /// ```
    pub async fn write_async(&mut self, dir: Dir) -> Result<WriteSummary> {
        let job = self.write_job(dir);
        let pending = job.pending.clone();
        let written = tokio::task::spawn_blocking(move || job.run())
            .await
            .unwrap_or_else(|e| Err(CheckpointError::task("writing checkpoint ids", e)));
        written.inspect_err(|_| self.restore_pending(pending))
    }

    /// Everything a write needs, owned: the pending ids move into it (given back on error).
    fn write_job(&mut self, dir: Dir) -> WriteJob {
        WriteJob {
            dir,
            wanted: self.manifest(),
            pending: self.take_pending(),
            shard_bits: self.shard_bits,
        }
    }

    fn manifest(&self) -> Manifest {
        Manifest {
            num_shards: self.num_shards(),
            family: self.family,
            id_column: self.id_column.clone(),
            id_type: self.id_type.clone(),
        }
    }

    /// Make `path` a checkpoint of this index's layout: create its manifest, or check the
    /// one there (shard count, id family, id column) and remove dead writers' temp files.
    pub fn prepare(&self, path: &str, storage_options: &StorageOptions) -> Result<()> {
        self.prepare_in(open_dir(path, storage_options)?)
    }

    /// [`prepare`](Self::prepare) a directory the caller opened (a host's store).
    pub fn prepare_in(&self, dir: Dir) -> Result<()> {
        prepare_dir(dir, &self.manifest()).map(drop)
    }
}

/// One write of an index's pending ids.
struct WriteJob {
    dir: Dir,
    wanted: Manifest,
    pending: Vec<ArrayRef>,
    shard_bits: u32,
}

impl WriteJob {
    fn run(self) -> Result<WriteSummary> {
        let target = prepare_dir(self.dir, &self.wanted)?;
        write_parts(
            target,
            &self.pending,
            &self.wanted.id_column,
            &self.wanted.id_type,
            self.shard_bits,
        )
    }
}

/// Make `target` a checkpoint of layout `wanted`: create its manifest, or check the one there,
/// and remove dead writers' temp files.
fn prepare_dir(target: Dir, wanted: &Manifest) -> Result<Dir> {
    match read_manifest(&target)? {
        Some(m) => {
            if m.num_shards != wanted.num_shards
                || m.family != wanted.family
                || m.id_column != wanted.id_column
            {
                return Err(CheckpointError::Manifest {
                    path: target.shown(MANIFEST_FILE),
                    reason: format!(
                        "checkpoint has {} shards of {} ids in column '{}'; this index has {} shards of {} ids in column '{}'",
                        m.num_shards, m.family.name(), m.id_column,
                        wanted.num_shards, wanted.family.name(), wanted.id_column
                    ),
                });
            }
        }
        None => {
            target.put_atomic(MANIFEST_FILE, wanted.to_text().into_bytes())?;
        }
    }
    if let Dir::Local(dir) = &target {
        clean_stale_temp_files(dir);
    }
    Ok(target)
}

/// The shard count the manifest at `path` declares, or `None` when `path` has no manifest
/// (no checkpoint yet, or ids written by another writer).
pub fn manifest_num_shards(path: &str, storage_options: &StorageOptions) -> Result<Option<usize>> {
    manifest_num_shards_in(&open_dir(path, storage_options)?)
}

/// [`manifest_num_shards`] of a directory the caller opened (a host's store).
pub fn manifest_num_shards_in(dir: &Dir) -> Result<Option<usize>> {
    Ok(read_manifest(dir)?.map(|m| m.num_shards))
}

/// Write `ids` (of column `id_column`; the chunks of one column, e.g. the batches of one
/// output file) under `root` as hash-partitioned part files all named `part_name`:
/// `root/shard=<k>/<part_name>` for each shard `k` that gets ids, each written atomically.
/// No manifest is written or read: this is for callers that stage parts and publish them
/// into a checkpoint themselves (the engine's commit protocol). Nulls are skipped. The chunks
/// are not concatenated: they go through an [`IdPartsWriter`] a block at a time. Returns the
/// files written, relative to `root`, and the ids written.
pub fn write_id_parts(
    root: &str,
    storage_options: &StorageOptions,
    id_column: &str,
    ids: &[ArrayRef],
    num_shards: usize,
    part_name: &str,
) -> Result<(Vec<String>, usize)> {
    let mut writer = IdPartsWriter::new(root, storage_options, id_column, num_shards, part_name)?;
    for chunk in ids {
        writer.push(chunk)?;
    }
    writer.finish()
}

/// Write `chunks` (ids of type `id_type`) into one part file per shard that gets ids, each
/// with a name of its own; null ids are skipped.
fn write_parts(
    target: Dir,
    chunks: &[ArrayRef],
    id_column: &str,
    id_type: &DataType,
    shard_bits: u32,
) -> Result<WriteSummary> {
    let mut writer = IdPartsWriter::with_names(
        target,
        id_column,
        Some(id_type.clone()),
        shard_bits,
        Box::new(|_| unique_part_name()),
    )?;
    for chunk in chunks {
        writer.push(chunk)?;
    }
    writer.finish_summary()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::Arc;

    use crate::fingerprint::shard_of;

    use super::*;

    #[test]
    fn id_parts_gather_every_chunk_by_shard_in_input_order() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::Int32Type;
        use arrow_array::{DictionaryArray, StringArray};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        // Three chunks of one column: plain with nulls, longer than two blocks, and
        // dictionary-encoded (cast to the first chunk's type).
        let plain: ArrayRef = Arc::new(StringArray::from_iter(
            (0..50).map(|i| (i % 7 != 3).then(|| format!("a{i}"))),
        ));
        let long: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..70_000).map(|i| format!("b{i}")),
        ));
        let dict: ArrayRef = Arc::new(
            ["c0", "c1", "c0", "c2"]
                .into_iter()
                .collect::<DictionaryArray<Int32Type>>(),
        );
        let (files, count) = write_id_parts(
            root,
            &StorageOptions::new(),
            "id",
            &[plain.clone(), long.clone(), dict],
            8,
            "part-x.parquet",
        )
        .unwrap();
        let expected: Vec<String> = plain
            .as_string::<i32>()
            .iter()
            .flatten()
            .map(str::to_string)
            .chain(long.as_string::<i32>().iter().flatten().map(str::to_string))
            .chain(["c0", "c1", "c0", "c2"].map(str::to_string))
            .collect();
        assert_eq!(count, expected.len());
        assert_eq!(files.len(), 8, "{files:?}");
        let mut seen = 0;
        for k in 0..8 {
            let relative = format!("shard={k}/part-x.parquet");
            assert!(files.contains(&relative), "{files:?}");
            let bytes = bytes::Bytes::from(fs::read(dir.path().join(&relative)).unwrap());
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(bytes, 1 << 20)
                    .unwrap();
            let got: Vec<String> = reader
                .flat_map(|b| {
                    let b = b.unwrap();
                    b.column(0)
                        .as_string::<i32>()
                        .iter()
                        .flatten()
                        .map(str::to_string)
                        .collect::<Vec<_>>()
                })
                .collect();
            let want: Vec<String> = expected
                .iter()
                .filter(|id| shard_of(crate::fingerprint::fingerprint_bytes(id.as_bytes()), 3) == k)
                .cloned()
                .collect();
            assert_eq!(got, want, "shard {k}");
            seen += got.len();
        }
        assert_eq!(seen, expected.len());
    }
}
