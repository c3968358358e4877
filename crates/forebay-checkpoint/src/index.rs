//! [`CheckpointIndex`]: the set of finished ids, split into hash shards.

use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_arith::boolean::not;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_buffer::{BooleanBuffer, MutableBuffer};
use arrow_cast::cast;
use arrow_schema::DataType;
use arrow_select::filter::filter_record_batch;

use crate::error::{CheckpointError, Result};
use crate::fingerprint::{
    fingerprints_into, fingerprints_into_slice, shard_of, IdFamily, FINGERPRINT_BITS,
};
use crate::shard::{ProbeKey, ShardTable};

/// Shard count of a new index when none is given. A checkpoint's manifest records its own.
pub const DEFAULT_NUM_SHARDS: usize = 16;
/// Largest shard count (2^16).
pub const MAX_NUM_SHARDS: usize = 1 << 16;
/// Below this many rows a probe runs on the caller's thread: spawning workers costs more.
const PARALLEL_MIN_ROWS: usize = 1 << 16;

/// The number of worker threads used for parallel probes, loads and builds.
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One row's probe: the row, its shard's table and where in it to look.
struct RowProbe<'a> {
    row: usize,
    table: &'a ShardTable,
    key: ProbeKey,
}

/// Which ids are already done: fingerprints of ids, split into `2^s` shards.
///
/// Probing never misses an id that was loaded or inserted; an id that was not has a
/// false-positive chance of at most `len() / 2^100` (see [`crate::fingerprint`]). Null ids
/// are never stored and never reported present.
///
/// ```
/// use std::sync::Arc;
/// use arrow_array::{ArrayRef, RecordBatch, StringArray};
/// use arrow_schema::DataType;
/// use forebay_checkpoint::CheckpointIndex;
///
/// let mut done = CheckpointIndex::new(DataType::Utf8, "id", 16)?;
/// done.insert(&StringArray::from(vec!["a", "c"]))?;
/// let mask = done.contains(&StringArray::from(vec![Some("a"), Some("b"), None]))?;
/// assert_eq!(mask, vec![true, false, false].into());
///
/// // The rows of a batch still to do:
/// let ids: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c", "d"]));
/// let todo = done.filter(&RecordBatch::try_from_iter([("id", ids)])?)?;
/// assert_eq!(todo.num_rows(), 2);
///
/// // Persisted as Parquet parts, and loaded back by the next run.
/// let dir = std::env::temp_dir().join(format!("forebay-doc-ckpt-{}", std::process::id()));
/// let path = dir.display().to_string();
/// done.write(&path, &Default::default())?;
/// let again = CheckpointIndex::loader(&path, "id").load()?;
/// assert_eq!(again.len(), 2);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CheckpointIndex {
    pub(crate) shard_bits: u32,
    /// One table per shard; `None` where this index did not load the shard (another worker
    /// owns it), so a probe landing there is an error, never a silent "not done".
    pub(crate) shards: Vec<Option<ShardTable>>,
    pub(crate) family: IdFamily,
    /// Arrow type of the ids this index writes (dictionaries resolved to their values).
    pub(crate) id_type: DataType,
    pub(crate) id_column: String,
    /// Ids inserted since the last `write`, in `id_type`, nulls removed.
    pub(crate) pending: Vec<ArrayRef>,
    pub(crate) threads: usize,
}

impl std::fmt::Debug for CheckpointIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointIndex")
            .field("num_shards", &self.num_shards())
            .field("ids", &self.len())
            .field("id_type", &self.id_type)
            .field("id_column", &self.id_column)
            .finish()
    }
}

pub(crate) fn shard_bits_for(num_shards: usize) -> Result<u32> {
    if num_shards == 0 || !num_shards.is_power_of_two() || num_shards > MAX_NUM_SHARDS {
        return Err(CheckpointError::InvalidArgument(format!(
            "num_shards must be a power of two between 1 and {MAX_NUM_SHARDS}, got {num_shards}"
        )));
    }
    Ok(num_shards.trailing_zeros())
}

/// The value type of an id column (dictionaries resolved), checked to be a valid id type.
pub(crate) fn id_value_type(data_type: &DataType, what: &str, column: &str) -> Result<DataType> {
    let value = match data_type {
        DataType::Dictionary(_, value) => value.as_ref().clone(),
        other => other.clone(),
    };
    if IdFamily::of(&value).is_none() {
        return Err(CheckpointError::UnsupportedIdType {
            path: what.to_string(),
            column: column.to_string(),
            data_type: data_type.to_string(),
        });
    }
    Ok(value)
}

impl CheckpointIndex {
    /// An empty index for ids of `id_type`, written under column `id_column`.
    pub fn new(id_type: DataType, id_column: impl Into<String>, num_shards: usize) -> Result<Self> {
        let id_column = id_column.into();
        let id_type = id_value_type(&id_type, "new checkpoint", &id_column)?;
        let shard_bits = shard_bits_for(num_shards)?;
        Ok(CheckpointIndex {
            shard_bits,
            shards: (0..num_shards)
                .map(|_| Some(ShardTable::empty(shard_bits)))
                .collect(),
            family: IdFamily::of(&id_type).expect("checked by id_value_type"),
            id_type,
            id_column,
            pending: Vec::new(),
            threads: default_threads(),
        })
    }

    /// Set the number of worker threads for large probes (default: the machine's cores).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Worker threads used for large probes and parallel filters.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Number of shards (a power of two).
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// Shards this index holds (all, unless it was loaded for a subset).
    pub fn loaded_shards(&self) -> Vec<usize> {
        (0..self.shards.len())
            .filter(|k| self.shards[*k].is_some())
            .collect()
    }

    /// The id family (strings/binary or integers).
    pub fn id_family(&self) -> IdFamily {
        self.family
    }

    /// The Arrow type ids are written as.
    pub fn id_type(&self) -> &DataType {
        &self.id_type
    }

    /// The id column name used by [`CheckpointIndex::filter`] and when writing.
    pub fn id_column(&self) -> &str {
        &self.id_column
    }

    /// Number of distinct ids held.
    pub fn len(&self) -> usize {
        self.shards.iter().flatten().map(ShardTable::len).sum()
    }

    /// Whether no id is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes of the index: shard tables plus ids inserted and not yet written.
    pub fn memory_bytes(&self) -> usize {
        let tables: usize = self
            .shards
            .iter()
            .flatten()
            .map(ShardTable::memory_bytes)
            .sum();
        let pending: usize = self.pending.iter().map(|a| a.get_array_memory_size()).sum();
        tables + pending + self.shards.capacity() * std::mem::size_of::<Option<ShardTable>>()
    }

    /// Shard of each row of `ids` (nulls get shard 0; check validity yourself).
    pub fn shard_ids(&self, ids: &dyn Array) -> Result<Vec<u32>> {
        let fps = self.fingerprints(ids, "shard_ids")?;
        Ok(fps
            .iter()
            .map(|f| shard_of(*f, self.shard_bits) as u32)
            .collect())
    }

    pub(crate) fn check_family(&self, data_type: &DataType, what: &str) -> Result<()> {
        match IdFamily::of(data_type) {
            Some(f) if f == self.family => Ok(()),
            Some(f) => Err(CheckpointError::IdTypeMismatch {
                what: what.to_string(),
                expected: self.family.name().to_string(),
                found: format!("{data_type} ({})", f.name()),
            }),
            None => Err(CheckpointError::UnsupportedIdType {
                path: what.to_string(),
                column: self.id_column.clone(),
                data_type: data_type.to_string(),
            }),
        }
    }

    fn fingerprints(&self, ids: &dyn Array, what: &str) -> Result<Vec<u128>> {
        self.check_family(ids.data_type(), what)?;
        let mut out = Vec::new();
        if ids.len() >= PARALLEL_MIN_ROWS && self.threads > 1 {
            let chunk = ids.len().div_ceil(self.threads);
            out = vec![0u128; ids.len()];
            std::thread::scope(|scope| {
                for (i, part) in out.chunks_mut(chunk).enumerate() {
                    let slice = ids.slice(i * chunk, part.len());
                    scope.spawn(move || fingerprints_into_slice(slice.as_ref(), part));
                }
            });
        } else {
            fingerprints_into(ids, &mut out);
        }
        Ok(out)
    }

    #[inline]
    fn local(&self, fp: u128) -> u128 {
        fp & ((1u128 << (FINGERPRINT_BITS - self.shard_bits)) - 1)
    }

    fn not_loaded(&self, shard: usize) -> CheckpointError {
        CheckpointError::ShardNotLoaded {
            shard,
            loaded: format!("{:?}", self.loaded_shards()),
        }
    }

    /// For each row of `ids`: true if the id is in the index. Null ids give false. The result
    /// has no nulls. Large arrays are probed in parallel, grouped by shard.
    pub fn contains(&self, ids: &dyn Array) -> Result<BooleanArray> {
        let fps = self.fingerprints(ids, "contains")?;
        let nulls = ids.logical_nulls();
        let valid = |row: usize| nulls.as_ref().is_none_or(|n| n.is_valid(row));
        let bits = if fps.len() < PARALLEL_MIN_ROWS || self.threads <= 1 {
            let mut bits = MutableBuffer::from_len_zeroed(fps.len().div_ceil(8));
            let slice = bits.as_slice_mut();
            self.probe(
                &fps,
                fps.len(),
                |j| j,
                &valid,
                &mut Vec::with_capacity(fps.len()),
                |row| arrow_buffer::bit_util::set_bit(slice, row),
            )?;
            BooleanBuffer::new(bits.into(), 0, fps.len())
        } else {
            self.contains_grouped(&fps, &valid)?
        };
        Ok(BooleanArray::new(bits, None))
    }

    /// Probe `count` rows (`row_at(j)` is the j-th row to probe) and call `on_hit(row)` for
    /// each id present, through the loop for the tables' kind of bucket ranges (see
    /// [`probe_pipelined`](Self::probe_pipelined)).
    #[inline]
    fn probe<'a>(
        &'a self,
        fps: &[u128],
        count: usize,
        row_at: impl Fn(usize) -> usize,
        valid: &(dyn Fn(usize) -> bool + Sync),
        keys: &mut Vec<RowProbe<'a>>,
        on_hit: impl FnMut(usize),
    ) -> Result<()> {
        let compact = self
            .shards
            .iter()
            .flatten()
            .all(ShardTable::has_compact_offsets);
        if compact {
            self.probe_pipelined::<true>(fps, count, row_at, valid, keys, on_hit)
        } else {
            self.probe_pipelined::<false>(fps, count, row_at, valid, keys, on_hit)
        }
    }

    /// Probe `count` rows (`row_at(j)` is the j-th row to probe) and call `on_hit(row)` for
    /// each id present; `COMPACT`: every table's bucket ranges are in blocks. Two passes:
    /// first each row's [`ProbeKey`] (shard, bucket, remainder) into `keys`, then the
    /// probes, software-pipelined: while probing key j, the bucket range of key j + 32 and
    /// the bucket of key j + 16 are prefetched, so the two dependent
    /// cache misses of each probe overlap with other probes instead of stalling one after
    /// another. Computing the keys up front keeps the second loop short: the work between
    /// prefetches decides how many probes a core keeps in flight.
    #[inline]
    fn probe_pipelined<'a, const COMPACT: bool>(
        &'a self,
        fps: &[u128],
        count: usize,
        row_at: impl Fn(usize) -> usize,
        valid: &(dyn Fn(usize) -> bool + Sync),
        keys: &mut Vec<RowProbe<'a>>,
        mut on_hit: impl FnMut(usize),
    ) -> Result<()> {
        // Measured (`cargo bench --bench checkpoint -- contains_1M_threads_1`, 1 M probes of
        // an 8 M-id index, alternated): 16/8 33.3-34.1 ms, 24/12 29.2, 32/16 29.2-29.6,
        // 48/24 and 64/32 ~44 (lines evicted before their probe).
        const DIRECTORY_AHEAD: usize = 32;
        const BUCKET_AHEAD: usize = 16;
        keys.clear();
        for j in 0..count {
            let row = row_at(j);
            if !valid(row) {
                continue;
            }
            let fp = fps[row];
            let shard = shard_of(fp, self.shard_bits);
            let table = self.shards[shard]
                .as_ref()
                .ok_or_else(|| self.not_loaded(shard))?;
            keys.push(RowProbe {
                row,
                table,
                key: table.probe_key(self.local(fp)),
            });
        }
        for (j, probe) in keys.iter().enumerate() {
            if let Some(ahead) = keys.get(j + DIRECTORY_AHEAD) {
                ahead.table.prefetch_directory::<COMPACT>(ahead.key);
            }
            if let Some(ahead) = keys.get(j + BUCKET_AHEAD) {
                ahead.table.prefetch_bucket::<COMPACT>(ahead.key);
            }
            let row = probe.row;
            if probe
                .table
                .contains_key::<COMPACT>(probe.key, || self.local(fps[row]))
            {
                on_hit(row);
            }
        }
        Ok(())
    }

    /// Parallel probe, grouped by shard: worker `w` of `t` probes exactly the rows whose
    /// shard is `w mod t`, so each worker touches only its own shards' memory. Each worker
    /// sets bits in its own bitmap; the bitmaps are OR-ed at the end.
    fn contains_grouped(
        &self,
        fps: &[u128],
        valid: &(dyn Fn(usize) -> bool + Sync),
    ) -> Result<BooleanBuffer> {
        const BLOCK: usize = 4096;
        let workers = self.threads.min(self.shards.len()).max(1);
        let bitmap_len = fps.len().div_ceil(8);
        let bitmaps: Vec<Result<Vec<u8>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|worker| {
                    scope.spawn(move || -> Result<Vec<u8>> {
                        let mut bits = vec![0u8; bitmap_len];
                        let mut rows = Vec::with_capacity(BLOCK);
                        let mut keys = Vec::with_capacity(BLOCK);
                        for block in (0..fps.len()).step_by(BLOCK) {
                            rows.clear();
                            rows.extend((block..(block + BLOCK).min(fps.len())).filter(|&row| {
                                shard_of(fps[row], self.shard_bits) % workers == worker
                                    && valid(row)
                            }));
                            self.probe(
                                fps,
                                rows.len(),
                                |j| rows[j],
                                &|_| true,
                                &mut keys,
                                |row| arrow_buffer::bit_util::set_bit(&mut bits, row),
                            )?;
                        }
                        Ok(bits)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("probe worker panicked"))
                .collect()
        });
        let mut merged = MutableBuffer::from_len_zeroed(bitmap_len);
        for bits in bitmaps {
            for (m, b) in merged.as_slice_mut().iter_mut().zip(bits?) {
                *m |= b;
            }
        }
        Ok(BooleanBuffer::new(merged.into(), 0, fps.len()))
    }

    fn id_column_of(&self, batch: &RecordBatch) -> Result<ArrayRef> {
        batch
            .column_by_name(&self.id_column)
            .cloned()
            .ok_or_else(|| CheckpointError::ColumnNotFound {
                path: "batch to filter".into(),
                column: self.id_column.clone(),
                available: batch
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The rows of `batch` whose id (column [`CheckpointIndex::id_column`]) is not in the
    /// index, schema unchanged. Rows with a null id are kept. `None` when no row is removed,
    /// so callers can keep the input as is (no copy).
    pub fn filter_or_unchanged(&self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        let done = self.contains(self.id_column_of(batch)?.as_ref())?;
        if done.true_count() == 0 {
            return Ok(None);
        }
        let keep = not(&done).map_err(|e| CheckpointError::Encode {
            what: "filter".into(),
            reason: e.to_string(),
        })?;
        filter_record_batch(batch, &keep)
            .map(Some)
            .map_err(|e| CheckpointError::Encode {
                what: "filter".into(),
                reason: e.to_string(),
            })
    }

    /// [`CheckpointIndex::filter_or_unchanged`], returning the input (zero-copy clone) when
    /// nothing is removed.
    pub fn filter(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        Ok(self
            .filter_or_unchanged(batch)?
            .unwrap_or_else(|| batch.clone()))
    }

    /// Filter many batches (e.g. a table's chunks), in parallel across batches; output in
    /// input order, `None` for a batch left unchanged.
    pub fn filter_many(&self, batches: &[RecordBatch]) -> Result<Vec<Option<RecordBatch>>> {
        if batches.len() <= 1 || self.threads <= 1 {
            return batches
                .iter()
                .map(|b| self.filter_or_unchanged(b))
                .collect();
        }
        let next = AtomicUsize::new(0);
        let mut results: Vec<(usize, Result<Option<RecordBatch>>)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..self.threads.min(batches.len()))
                .map(|_| {
                    scope.spawn(|| {
                        let mut out = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= batches.len() {
                                break out;
                            }
                            out.push((i, self.filter_or_unchanged(&batches[i])));
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("filter worker panicked"))
                .collect()
        });
        results.sort_by_key(|(i, _)| *i);
        results.into_iter().map(|(_, r)| r).collect()
    }

    /// Add ids (rows completed in this run). Nulls are skipped. Returns how many were new.
    /// The ids are also kept until the next [`CheckpointIndex::write`], which persists them.
    pub fn insert(&mut self, ids: &dyn Array) -> Result<usize> {
        let fps = self.fingerprints(ids, "insert")?;
        let nulls = ids.logical_nulls();
        for (row, fp) in fps.iter().enumerate() {
            if nulls.as_ref().is_some_and(|n| n.is_null(row)) {
                continue;
            }
            let k = shard_of(*fp, self.shard_bits);
            if self.shards[k].is_none() {
                return Err(self.not_loaded(k));
            }
        }
        let mut added = 0;
        for (row, fp) in fps.iter().enumerate() {
            if nulls.as_ref().is_some_and(|n| n.is_null(row)) {
                continue;
            }
            let k = shard_of(*fp, self.shard_bits);
            let local = self.local(*fp);
            let shard = self.shards[k].as_mut().expect("checked above");
            added += shard.insert(local, k)? as usize;
        }
        self.pending.push(self.to_pending(ids)?);
        Ok(added)
    }

    /// `ids` as the index's id type with nulls removed, for writing later.
    fn to_pending(&self, ids: &dyn Array) -> Result<ArrayRef> {
        let encode = |e: arrow_schema::ArrowError| CheckpointError::Encode {
            what: format!("keeping inserted ids of type {}", ids.data_type()),
            reason: e.to_string(),
        };
        let array: ArrayRef = arrow_array::make_array(ids.to_data());
        let array = if array.data_type() == &self.id_type {
            array
        } else {
            cast(&array, &self.id_type).map_err(encode)?
        };
        Ok(match array.logical_nulls() {
            Some(nulls) if nulls.null_count() > 0 => {
                let keep = BooleanArray::new(nulls.into_inner(), None);
                arrow_select::filter::filter(&array, &keep).map_err(encode)?
            }
            _ => array,
        })
    }

    /// Add every id of `other` (same shard count and id family). Ids `other` has not yet
    /// written are carried over to be written by this index.
    pub fn merge(&mut self, other: &CheckpointIndex) -> Result<()> {
        if other.family != self.family {
            return Err(CheckpointError::IdTypeMismatch {
                what: "merge".into(),
                expected: self.family.name().into(),
                found: other.family.name().into(),
            });
        }
        if other.shard_bits != self.shard_bits {
            return Err(CheckpointError::InvalidArgument(format!(
                "merge: indexes have {} and {} shards; merge needs equal shard counts",
                self.num_shards(),
                other.num_shards()
            )));
        }
        for (k, theirs) in other.shards.iter().enumerate() {
            let Some(theirs) = theirs else { continue };
            let Some(ours) = self.shards[k].as_mut() else {
                if theirs.len() > 0 {
                    return Err(self.not_loaded(k));
                }
                continue;
            };
            for fp in theirs.fingerprints() {
                ours.insert(fp, k)?;
            }
        }
        for p in &other.pending {
            let p = self.to_pending(p.as_ref())?;
            self.pending.push(p);
        }
        Ok(())
    }

    /// Ids inserted since the last write (what `write` will persist).
    pub fn pending_ids(&self) -> usize {
        self.pending.iter().map(|a| a.len()).sum()
    }

    pub(crate) fn take_pending(&mut self) -> Vec<ArrayRef> {
        std::mem::take(&mut self.pending)
    }

    pub(crate) fn restore_pending(&mut self, mut pending: Vec<ArrayRef>) {
        pending.append(&mut self.pending);
        self.pending = pending;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;

    /// A table whose bucket ranges cannot be in blocks (300 fingerprints made to share one
    /// bucket) is probed through the loop that checks each table's kind, beside a table
    /// whose ranges are in blocks, both directly and in the parallel probe: every id it
    /// holds is found, no other.
    #[test]
    fn a_table_of_ids_made_to_share_a_bucket_is_probed_right() {
        let mut index = CheckpointIndex::new(DataType::Int64, "id", 2).unwrap();
        let held = Int64Array::from_iter_values(0..100_000);
        let mut fps = Vec::new();
        fingerprints_into(&held, &mut fps).unwrap();
        let shard_bits = index.shard_bits;
        let locals_of = |shard: usize| -> Vec<u128> {
            fps.iter()
                .filter(|fp| shard_of(**fp, shard_bits) == shard)
                .map(|fp| index.local(*fp))
                .collect()
        };
        let (mut wide_locals, compact_locals) = (locals_of(0), locals_of(1));
        let top = 0xABCDEu128 << (FINGERPRINT_BITS - shard_bits - 20);
        wide_locals.extend((0..300u128).map(|i| top | (i * 7919)));
        let wide = ShardTable::build(wide_locals, shard_bits, 0).unwrap();
        let compact = ShardTable::build(compact_locals, shard_bits, 1).unwrap();
        assert!(!wide.has_compact_offsets());
        assert!(compact.has_compact_offsets());
        index.shards = vec![Some(wide), Some(compact)];

        let absent = Int64Array::from_iter_values(100_000..200_000);
        for threads in [1, 2] {
            index = index.with_threads(threads);
            assert_eq!(index.contains(&held).unwrap().true_count(), 100_000);
            assert_eq!(index.contains(&absent).unwrap().true_count(), 0);
        }
    }
}
