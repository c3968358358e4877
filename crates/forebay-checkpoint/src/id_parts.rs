//! Ids partitioned by shard into part files, encoded as they arrive.
//!
//! ```text
//!  push(ids) ──► block (≤ 32 Ki raw ids) ──full──► fingerprint each id ──► its shard k
//!                                                        │ gather shard k's ids
//!                                                        ▼
//!                        shard k: Parquet writer into memory (small pages, LZ4_RAW)
//!  finish() ──► flush the block ──► close each shard's writer ──► put root/shard=<k>/<name>
//!               (one_file: their column chunks copied into root/<name>, a row group each)
//! ```
//!
//! Between pushes an [`IdPartsWriter`] holds at most one block of raw ids and, per shard, the
//! ids encoded and compressed so far: a writer that stages the ids of a large output file
//! while the file is written holds much less than the ids themselves, and needs no gathering
//! pass over all of them when it finishes. Nothing is written to storage before
//! [`IdPartsWriter::finish`], and each part is put atomically, so an abandoned writer leaves
//! nothing behind.

use std::io::Write;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use arrow_select::interleave::interleave;
use bytes::Bytes;
use forebay_parquet::StorageOptions;
use parquet::arrow::{ArrowWriter, ARROW_SCHEMA_META_KEY};
use parquet::basic::Compression;
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::{KeyValue, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;

use crate::directory::{open_dir, WriteSummary};
use crate::error::{CheckpointError, Result};
use crate::fingerprint::{fingerprints_into, shard_of};
use crate::index::{id_value_type, shard_bits_for};
use crate::layout::{NUM_SHARDS_KEY, SHARDS_KEY};
use forebay_io::Dir;

/// Raw ids gathered before they are split by shard: large enough that each shard's share
/// of a block is hundreds of ids (one encoder call, not one per batch), small enough to be
/// a rounding error next to what the caller holds.
const BLOCK_IDS: usize = 32 * 1024;
/// Ids are fingerprinted this many at a time.
const FINGERPRINT_ROWS: usize = 8192;
/// Encoded ids wait in a page of at most this size before it is compressed.
const PAGE_BYTES: usize = 32 * 1024;

/// Writes ids into one part file per shard that gets any, or all shards into one file
/// ([`IdPartsWriter::one_file`]). Build with [`IdPartsWriter::new`];
/// [`IdPartsWriter::push`] the ids (chunks of one column, any number, nulls skipped), then
/// [`IdPartsWriter::finish`].
pub struct IdPartsWriter {
    target: Dir,
    id_column: String,
    /// The ids' value type: the first chunk's, unless the caller fixed it. Later chunks of
    /// another type (a dictionary, a wider string) are cast to it.
    id_type: Option<DataType>,
    shard_bits: u32,
    name_of: Box<dyn Fn(usize) -> String + Send>,
    /// Set: every shard's ids go into this one file (relative to the root), one row group
    /// per shard, instead of one file per shard.
    one_file: Option<String>,
    block: Vec<ArrayRef>,
    block_ids: usize,
    shards: Vec<Option<ArrowWriter<Vec<u8>>>>,
    ids: usize,
    fingerprints: Vec<u128>,
}

impl IdPartsWriter {
    /// Parts named `part_name` in every shard: `root/shard=<k>/<part_name>`.
    pub fn new(
        root: &str,
        storage_options: &StorageOptions,
        id_column: &str,
        num_shards: usize,
        part_name: &str,
    ) -> Result<IdPartsWriter> {
        IdPartsWriter::in_dir(
            open_dir(root, storage_options)?,
            id_column,
            num_shards,
            part_name,
        )
    }

    /// [`new`](Self::new) in a directory the caller opened (a host's store).
    pub fn in_dir(
        root: Dir,
        id_column: &str,
        num_shards: usize,
        part_name: &str,
    ) -> Result<IdPartsWriter> {
        let part_name = part_name.to_string();
        IdPartsWriter::with_names(
            root,
            id_column,
            None,
            shard_bits_for(num_shards)?,
            Box::new(move |_| part_name.clone()),
        )
    }

    /// Every shard's ids in one file, `root/<name>`, one row group per shard (in shard
    /// order; the key-value metadata `forebay.shards` lists each row group's shard): one file
    /// to store, sync, publish and delete per commit rather than one per shard, which on a
    /// local disk is one device flush each, on an object store one request each.
    pub fn one_file(
        root: &str,
        storage_options: &StorageOptions,
        id_column: &str,
        num_shards: usize,
        name: &str,
    ) -> Result<IdPartsWriter> {
        IdPartsWriter::one_file_in(
            open_dir(root, storage_options)?,
            id_column,
            num_shards,
            name,
        )
    }

    /// [`one_file`](Self::one_file) in a directory the caller opened (a host's store).
    pub fn one_file_in(
        root: Dir,
        id_column: &str,
        num_shards: usize,
        name: &str,
    ) -> Result<IdPartsWriter> {
        let mut writer = IdPartsWriter::with_names(
            root,
            id_column,
            None,
            shard_bits_for(num_shards)?,
            Box::new(|_| String::new()), // per-shard names: not used
        )?;
        writer.one_file = Some(name.to_string());
        Ok(writer)
    }

    /// The general form: ids of `id_type` (or the first chunk's type), shard `k`'s part named
    /// `name_of(k)`.
    pub(crate) fn with_names(
        target: Dir,
        id_column: &str,
        id_type: Option<DataType>,
        shard_bits: u32,
        name_of: Box<dyn Fn(usize) -> String + Send>,
    ) -> Result<IdPartsWriter> {
        Ok(IdPartsWriter {
            target,
            id_column: id_column.to_string(),
            id_type,
            shard_bits,
            name_of,
            one_file: None,
            block: Vec::new(),
            block_ids: 0,
            shards: (0..1usize << shard_bits).map(|_| None).collect(),
            ids: 0,
            fingerprints: Vec::with_capacity(FINGERPRINT_ROWS),
        })
    }

    /// Add ids. They are encoded when a block is full; until then the chunk is held as is
    /// (see [`IdPartsWriter::unencoded`]).
    pub fn push(&mut self, ids: &ArrayRef) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let id_type = match &self.id_type {
            Some(t) => t.clone(),
            None => {
                let t = id_value_type(ids.data_type(), &self.target.shown(""), &self.id_column)?;
                self.id_type = Some(t.clone());
                t
            }
        };
        let chunk = if ids.data_type() == &id_type {
            ids.clone()
        } else {
            arrow_cast::cast(ids, &id_type).map_err(encode_err)?
        };
        self.block_ids += chunk.len();
        self.block.push(chunk);
        if self.block_ids >= BLOCK_IDS {
            self.encode_block()?;
        }
        Ok(())
    }

    /// Bytes of the ids encoded so far (the shards' parts in memory).
    pub fn encoded_bytes(&self) -> usize {
        let parts: usize = self
            .shards
            .iter()
            .flatten()
            .map(|w| w.inner().capacity() + w.memory_size())
            .sum();
        parts + self.shards.capacity() * std::mem::size_of::<Option<ArrowWriter<Vec<u8>>>>()
    }

    /// The ids pushed but not encoded yet (fewer than a block), as they were pushed: slices
    /// keep their whole buffers alive, which the caller may want to count.
    pub fn unencoded(&self) -> &[ArrayRef] {
        &self.block
    }

    /// Write every shard's part (atomically, each under its final name). Returns the files
    /// written, relative to the root, and the number of ids.
    pub fn finish(mut self) -> Result<(Vec<String>, usize)> {
        let summary = self.finish_summary()?;
        let base = self.target.shown("");
        let relative = summary
            .files
            .iter()
            .map(|f| {
                f.strip_prefix(base.trim_end_matches('/'))
                    .unwrap_or(f)
                    .trim_start_matches('/')
                    .to_string()
            })
            .collect();
        Ok((relative, summary.ids))
    }

    /// [`IdPartsWriter::finish`] with the files as shown paths (URIs for object stores).
    pub(crate) fn finish_summary(&mut self) -> Result<WriteSummary> {
        self.encode_block()?;
        // Each part is encoded to the end only when it is stored (or copied into the one
        // file), so one part's bytes are held at a time.
        if let Some(name) = self.one_file.clone() {
            let shards = std::mem::take(&mut self.shards);
            if shards.iter().all(Option::is_none) {
                return Ok(WriteSummary {
                    files: Vec::new(),
                    ids: self.ids,
                });
            }
            let shown = self.target.shown(&name);
            self.target.put_atomic_written(&name, |out| {
                join_shards(shards, out).map_err(|e| CheckpointError::Encode {
                    what: shown.clone(),
                    reason: e.to_string(),
                })
            })?;
            return Ok(WriteSummary {
                files: vec![shown],
                ids: self.ids,
            });
        }
        let (target, name_of) = (&self.target, &self.name_of);
        let mut files = Vec::new();
        let parts = self
            .shards
            .iter_mut()
            .enumerate()
            .filter_map(|(k, writer)| {
                let writer = writer.take()?;
                let relative = format!("shard={k}/{}", name_of(k));
                files.push(target.shown(&relative));
                Some(match writer.into_inner() {
                    Ok(bytes) => Ok((relative, bytes)),
                    Err(e) => Err(CheckpointError::Encode {
                        what: target.shown(&relative),
                        reason: e.to_string(),
                    }),
                })
            });
        target.put_all_atomic(parts)?;
        Ok(WriteSummary {
            files,
            ids: self.ids,
        })
    }

    /// Split the block by shard and encode each shard's ids, in input order.
    fn encode_block(&mut self) -> Result<()> {
        if self.block.is_empty() {
            return Ok(());
        }
        let block = std::mem::take(&mut self.block);
        self.block_ids = 0;
        let num_shards = self.shards.len();
        // (chunk, row) of every non-null id, by shard.
        let mut picks: Vec<Vec<(usize, usize)>> = vec![Vec::new(); num_shards];
        for (c, chunk) in block.iter().enumerate() {
            let nulls = chunk.logical_nulls();
            for start in (0..chunk.len()).step_by(FINGERPRINT_ROWS) {
                let len = FINGERPRINT_ROWS.min(chunk.len() - start);
                fingerprints_into(chunk.slice(start, len).as_ref(), &mut self.fingerprints);
                for (i, fp) in self.fingerprints.iter().enumerate() {
                    let row = start + i;
                    if nulls.as_ref().is_none_or(|n| n.is_valid(row)) {
                        picks[shard_of(*fp, self.shard_bits)].push((c, row));
                    }
                }
            }
        }
        let sources: Vec<&dyn Array> = block.iter().map(|c| c.as_ref()).collect();
        let schema = self.schema();
        for (k, rows) in picks.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let ids = interleave(&sources, rows).map_err(encode_err)?;
            let batch = RecordBatch::try_new(schema.clone(), vec![ids]).map_err(encode_err)?;
            let writer = match &mut self.shards[k] {
                Some(w) => w,
                slot => slot.insert(
                    ArrowWriter::try_new(Vec::new(), schema.clone(), Some(part_properties()))
                        .map_err(|e| CheckpointError::Encode {
                            what: self.target.shown(&format!("shard={k}")),
                            reason: e.to_string(),
                        })?,
                ),
            };
            writer.write(&batch).map_err(|e| CheckpointError::Encode {
                what: self.target.shown(&format!("shard={k}")),
                reason: e.to_string(),
            })?;
            self.ids += batch.num_rows();
        }
        Ok(())
    }

    fn schema(&self) -> SchemaRef {
        let id_type = self.id_type.clone().expect("set by the first push");
        Arc::new(Schema::new(vec![Field::new(
            &self.id_column,
            id_type,
            false,
        )]))
    }
}

/// Write one file of the shards' parts (each a complete file in memory, ids of one shard)
/// into `out`: their column chunks are copied as they are, encoded, into one row group
/// each, and each part is let go once copied.
fn join_shards(
    shards: Vec<Option<ArrowWriter<Vec<u8>>>>,
    out: &mut (dyn Write + Send),
) -> parquet::errors::Result<()> {
    let num_shards = shards.len();
    let read = |writer: ArrowWriter<Vec<u8>>| -> parquet::errors::Result<(Bytes, ParquetMetaData)> {
        let part = Bytes::from(writer.into_inner()?);
        let meta = ParquetMetaDataReader::new().parse_and_finish(&part)?;
        Ok((part, meta))
    };
    let mut parts = shards
        .into_iter()
        .enumerate()
        .filter_map(|(k, writer)| writer.map(|w| (k, w)));
    let Some((first_shard, first)) = parts.next() else {
        return Err(ParquetError::General("no shard holds ids".into()));
    };
    let (part, meta) = read(first)?;
    // Readers decode the ids to the same Arrow type as the parts' (say LargeUtf8).
    let arrow_schema = meta
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|e| e.key == ARROW_SCHEMA_META_KEY))
        .cloned();
    let mut writer = SerializedFileWriter::new(
        out,
        meta.file_metadata().schema_descr().root_schema_ptr(),
        Arc::new(part_properties()),
    )?;
    let mut order = Vec::new();
    append_part(&mut writer, &part, &meta, first_shard, &mut order)?;
    drop((part, meta));
    for (shard, part) in parts {
        let (part, meta) = read(part)?;
        append_part(&mut writer, &part, &meta, shard, &mut order)?;
    }
    if let Some(schema) = arrow_schema {
        writer.append_key_value_metadata(schema);
    }
    let order: Vec<String> = order.iter().map(usize::to_string).collect();
    writer.append_key_value_metadata(KeyValue::new(
        SHARDS_KEY.to_string(),
        format!("[{}]", order.join(", ")),
    ));
    writer.append_key_value_metadata(KeyValue::new(
        NUM_SHARDS_KEY.to_string(),
        num_shards.to_string(),
    ));
    writer.close()?;
    Ok(())
}

/// Copy each row group of one shard's part (`part`, its footer `meta`) into `writer`.
fn append_part<W: Write + Send>(
    writer: &mut SerializedFileWriter<W>,
    part: &Bytes,
    meta: &ParquetMetaData,
    shard: usize,
    order: &mut Vec<usize>,
) -> parquet::errors::Result<()> {
    for group in meta.row_groups() {
        let mut row_group = writer.next_row_group()?;
        for column in group.columns() {
            row_group.append_column(
                part,
                ColumnCloseResult {
                    bytes_written: column.compressed_size() as u64,
                    rows_written: group.num_rows() as u64,
                    metadata: column.clone(),
                    bloom_filter: None,
                    column_index: None,
                    offset_index: None,
                },
            )?;
        }
        row_group.close()?;
        order.push(shard);
    }
    Ok(())
}

/// How part files are encoded. Ids in a checkpoint are distinct: a dictionary would only
/// cost the hashing of each one until it reached its size limit, and statistics of hashed
/// ids prune nothing. Small pages are compressed soon, so little waits uncompressed.
/// LZ4_RAW rather than Snappy: as small, cheaper to write (the seed job ~4 % faster) and to
/// load (8 M string ids 0.16 → 0.13 s; BENCHMARKS.md). Parts written with
/// Snappy before still load: the codec is recorded per column chunk.
pub(crate) fn part_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::LZ4_RAW)
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_data_page_size_limit(PAGE_BYTES)
        .build()
}

fn encode_err(e: arrow_schema::ArrowError) -> CheckpointError {
    CheckpointError::Encode {
        what: "checkpoint ids".into(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::StringArray;

    #[test]
    fn ids_are_held_encoded_and_written_only_at_finish() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let mut writer =
            IdPartsWriter::new(root, &StorageOptions::new(), "id", 16, "part.parquet").unwrap();
        // Ids as an output file's batches bring them: 1,000 at a time, 7 digits each.
        let mut arrow_bytes = 0;
        for chunk in 0..400 {
            let ids: ArrayRef = Arc::new(StringArray::from_iter_values(
                (chunk * 1000..(chunk + 1) * 1000).map(|i| format!("{:07}", 8_000_000 + i)),
            ));
            arrow_bytes += ids.get_array_memory_size();
            writer.push(&ids).unwrap();
        }
        let held = writer.encoded_bytes()
            + writer
                .unencoded()
                .iter()
                .map(|a| a.get_array_memory_size())
                .sum::<usize>();
        assert!(
            held < arrow_bytes / 2,
            "held {held} bytes for ids of {arrow_bytes}"
        );
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "nothing is written before finish"
        );
        let (files, ids) = writer.finish().unwrap();
        assert_eq!(ids, 400_000);
        assert_eq!(files.len(), 16, "{files:?}");
    }

    #[test]
    fn one_file_holds_each_shard_in_its_own_row_group() {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let mut writer =
            IdPartsWriter::one_file(root, &StorageOptions::new(), "id", 16, "ids/c.parquet")
                .unwrap();
        let ids: Vec<String> = (0..100_000).map(|i| format!("id-{i}")).collect();
        for chunk in ids.chunks(7_000) {
            let array: ArrayRef = Arc::new(arrow_array::LargeStringArray::from_iter_values(chunk));
            writer.push(&array).unwrap();
        }
        let (files, count) = writer.finish().unwrap();
        assert_eq!((files, count), (vec!["ids/c.parquet".to_string()], 100_000));

        let file = std::fs::File::open(dir.path().join("ids/c.parquet")).unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let meta = builder.metadata().clone();
        let shards = meta
            .file_metadata()
            .key_value_metadata()
            .and_then(|kv| kv.iter().find(|e| e.key == SHARDS_KEY))
            .and_then(|e| e.value.clone())
            .unwrap();
        assert_eq!(
            shards,
            format!(
                "[{}]",
                (0..16)
                    .map(|k| k.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        );
        assert_eq!(meta.num_row_groups(), 16);
        // Decoded as written (LargeUtf8), every id once, each in its shard's row group.
        let mut seen = Vec::new();
        for k in 0..16 {
            let reader = ParquetRecordBatchReaderBuilder::try_new(
                std::fs::File::open(dir.path().join("ids/c.parquet")).unwrap(),
            )
            .unwrap()
            .with_row_groups(vec![k])
            .build()
            .unwrap();
            for batch in reader {
                let column = batch.unwrap().column(0).clone();
                assert_eq!(column.data_type(), &DataType::LargeUtf8);
                let mut fps = Vec::new();
                fingerprints_into(column.as_ref(), &mut fps);
                assert!(fps.iter().all(|fp| shard_of(*fp, 4) == k), "row group {k}");
                let strings = column
                    .as_any()
                    .downcast_ref::<arrow_array::LargeStringArray>()
                    .unwrap();
                seen.extend(strings.iter().map(|s| s.unwrap().to_string()));
            }
        }
        seen.sort();
        let mut want = ids;
        want.sort();
        assert_eq!(seen, want);

        // No ids, no file.
        let empty =
            IdPartsWriter::one_file(root, &StorageOptions::new(), "id", 16, "ids/none.parquet")
                .unwrap();
        assert_eq!(empty.finish().unwrap(), (Vec::new(), 0));
        assert!(!dir.path().join("ids/none.parquet").exists());
    }
}
