//! Loading a [`CheckpointIndex`] from Parquet files: the manifest's shards, or any id column
//! re-hashed; on several threads, or only the shards one worker owns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow_array::Array;
use arrow_schema::DataType;
use forebay_parquet::{
    DatasetSource, FileEntry, ParquetDataset, ParquetError, ScanSkip, StorageOptions,
};
use parquet::file::metadata::ParquetMetaData;

use crate::directory::{clean_stale_temp_files, read_manifest, top_level};
use crate::error::{CheckpointError, Result};
use crate::fingerprint::{fingerprints_into, shard_of, FINGERPRINT_BITS};
use crate::huge_pages::advise_huge_pages;
use crate::index::{
    default_threads, id_value_type, shard_bits_for, CheckpointIndex, DEFAULT_NUM_SHARDS,
};
use crate::layout::{declared_shard, MANIFEST_FILE, NUM_SHARDS_KEY, SHARDS_KEY};
use crate::shard::{Packed96, ShardTable};
use forebay_io::{Dir, DirLocation};

/// Loads a [`CheckpointIndex`] from Parquet files. Build with [`CheckpointIndex::loader`].
#[derive(Debug, Clone)]
pub struct CheckpointLoader {
    /// The path, glob or URI (with its store's options), or a directory the caller
    /// opened (`loader_in`). Its Debug shows option keys, never their values.
    location: DirLocation,
    id_column: String,
    num_shards: Option<usize>,
    shards: Option<Vec<usize>>,
    threads: usize,
}

impl CheckpointIndex {
    /// Load the ids in column `id_column` of the Parquet files at `path` (a checkpoint written
    /// by forebay, a directory, a glob, a file or a URI).
    pub fn loader(path: impl Into<String>, id_column: impl Into<String>) -> CheckpointLoader {
        CheckpointLoader {
            location: DirLocation::uri(path),
            id_column: id_column.into(),
            num_shards: None,
            shards: None,
            threads: default_threads(),
        }
    }

    /// Load the ids in column `id_column` of the checkpoint in `dir`, a directory the caller
    /// opened: a local one, or a prefix of a store it built ([`Dir::remote`]). Unlike
    /// [`loader`](Self::loader), `dir` must be a directory (or prefix), not a file or glob.
    pub fn loader_in(dir: Dir, id_column: impl Into<String>) -> CheckpointLoader {
        let mut loader = Self::loader(String::new(), id_column);
        loader.location = DirLocation::opened(dir);
        loader
    }
}

impl CheckpointLoader {
    /// Shard count (a power of two). Default: the manifest's, else
    /// [`DEFAULT_NUM_SHARDS`]. A count different from the manifest's re-hashes every file.
    pub fn with_num_shards(mut self, num_shards: usize) -> Self {
        self.num_shards = Some(num_shards);
        self
    }

    /// Load only these shards (a worker owning part of the id space). Probing an id of
    /// another shard is then an error.
    pub fn with_shards(mut self, shards: impl IntoIterator<Item = usize>) -> Self {
        self.shards = Some(shards.into_iter().collect());
        self
    }

    /// Options for the object store (`aws_endpoint`, credentials, ...).
    pub fn with_storage_options(mut self, options: StorageOptions) -> Self {
        self.location = self.location.with_options(options);
        self
    }

    /// Worker threads for hashing and building (default: the machine's cores).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    fn read_error(&self, source: ParquetError) -> CheckpointError {
        match source {
            ParquetError::ColumnNotFound {
                path,
                column,
                available,
                hint: _,
            } => CheckpointError::ColumnNotFound {
                path,
                column,
                available,
            },
            source => CheckpointError::Read {
                path: self.location.shown().to_string(),
                column: self.id_column.clone(),
                source: Box::new(source),
            },
        }
    }

    /// [`load`](Self::load) for async callers: the requests, decoding and hashing run on
    /// the runtime's blocking threads (and the scan on forebay's runtime: a host's, given to
    /// `forebay_io::use_host_runtime`), never on the caller's task.
    ///
    /// ```no_run
    /// # async fn run(store: std::sync::Arc<dyn object_store::ObjectStore>)
    /// #              -> forebay_checkpoint::Result<()> {
    /// use forebay_checkpoint::CheckpointIndex;
    /// let dir = forebay_io::Dir::remote(store, "job/checkpoint", "s3://bucket/job/checkpoint")?;
    /// let done = CheckpointIndex::loader_in(dir, "id").load_async().await?;
    /// println!("{} ids done", done.len());
    /// # Ok(()) }
    /// ```
    pub async fn load_async(self) -> Result<CheckpointIndex> {
        let what = format!("loading checkpoint ids from {}", self.location.shown());
        tokio::task::spawn_blocking(move || self.load())
            .await
            .unwrap_or_else(|e| Err(CheckpointError::task(what, e)))
    }

    /// Where the files of `relatives` (inside the checkpoint directory) are read from.
    fn source_of(&self, target: &Dir, relatives: Vec<String>) -> DatasetSource {
        match target {
            Dir::Remote {
                store,
                prefix,
                shown,
            } if self.location.is_opened() => {
                // A store the caller built is read as given (DatasetSource::Store), its
                // objects shown as `shown` names them.
                let prefix = prefix.as_ref();
                let display_prefix = match shown.strip_suffix(prefix) {
                    Some(root) if !prefix.is_empty() => root.to_string(),
                    _ => format!("{shown}/"),
                };
                let display_prefix = if display_prefix.ends_with('/') {
                    display_prefix
                } else {
                    format!("{display_prefix}/")
                };
                let paths = relatives
                    .into_iter()
                    .map(|r| match (prefix.is_empty(), r.is_empty()) {
                        (true, _) => r,
                        (false, true) => format!("{prefix}/"),
                        (false, false) => format!("{prefix}/{r}"),
                    })
                    .collect();
                DatasetSource::Store {
                    store: store.clone(),
                    display_prefix,
                    paths,
                }
            }
            _ => {
                let base = self.location.shown().trim_end_matches('/');
                DatasetSource::Uris {
                    uris: relatives
                        .into_iter()
                        .map(|r| {
                            if r.is_empty() {
                                self.location.shown().to_string()
                            } else {
                                format!("{base}/{r}")
                            }
                        })
                        .collect(),
                    storage_options: self.location.options().clone(),
                }
            }
        }
    }

    /// Read the files and build the index.
    pub fn load(self) -> Result<CheckpointIndex> {
        let target = self.location.open()?;
        if let Dir::Local(dir) = &target {
            if dir.is_dir() {
                clean_stale_temp_files(dir);
            }
        }
        let manifest = read_manifest(&target)?;
        if let Some(m) = &manifest {
            if m.id_column != self.id_column {
                return Err(CheckpointError::ColumnNotFound {
                    path: target.shown(MANIFEST_FILE),
                    column: self.id_column.clone(),
                    available: m.id_column.clone(),
                });
            }
        }
        let num_shards = self
            .num_shards
            .or(manifest.as_ref().map(|m| m.num_shards))
            .unwrap_or(DEFAULT_NUM_SHARDS);
        let shard_bits = shard_bits_for(num_shards)?;
        let mut owned = vec![self.shards.is_none(); num_shards];
        for &k in self.shards.iter().flatten() {
            if k >= num_shards {
                return Err(CheckpointError::InvalidArgument(format!(
                    "shard {k} does not exist in a checkpoint of {num_shards} shards"
                )));
            }
            owned[k] = true;
        }
        let layout_matches = manifest
            .as_ref()
            .is_some_and(|m| m.num_shards == num_shards);

        // Which locations to read: only the owned shards' directories when the layout lets
        // us, and whatever else the directory holds (ids written there by another writer,
        // hashed here and kept for the owned shards only).
        let relatives: Vec<String> = if layout_matches && owned.iter().any(|o| !o) {
            let (shards, others) = top_level(&target)?;
            shards
                .into_iter()
                .filter(|k| *k < num_shards && owned[*k])
                .map(|k| format!("shard={k}"))
                .chain(others)
                .collect()
        } else {
            vec![String::new()] // the whole path
        };

        let empty_index = |id_type: DataType| -> Result<CheckpointIndex> {
            let mut index = CheckpointIndex::new(id_type, self.id_column.clone(), num_shards)?
                .with_threads(self.threads);
            for (k, o) in owned.iter().enumerate() {
                if !o {
                    index.shards[k] = None;
                }
            }
            Ok(index)
        };

        let dataset = if relatives.is_empty() {
            None
        } else {
            let built = ParquetDataset::builder(self.source_of(&target, relatives))
                .with_columns([self.id_column.clone()])
                .with_batch_size(64 * 1024)
                // Each hashing worker scans its own share with one row group in flight: long ids
                // (UUIDs) make a row group of 1 M ids ~40 MB, and more in flight would push the
                // load's peak memory past twice the finished index.
                .with_prefetch(1)
                .build();
            match built {
                Ok(d) => Some(d),
                // A manifest with no data files yet is an empty checkpoint, not an error.
                Err(ParquetError::NotFound { .. }) if manifest.is_some() => None,
                Err(e) => return Err(self.read_error(e)),
            }
        };
        let Some(dataset) = dataset else {
            let m = manifest.expect("no files only accepted with a manifest");
            return empty_index(m.id_type);
        };

        let field = dataset.schema().field(0).clone();
        let shown_files = dataset
            .files()
            .first()
            .map(|f| f.uri().to_string())
            .unwrap_or_else(|| self.location.shown().to_string());
        let id_type = id_value_type(field.data_type(), &shown_files, &self.id_column)?;
        let mut index = empty_index(id_type.clone())?;
        if let Some(m) = &manifest {
            index.check_family(&id_type, &target.shown(MANIFEST_FILE))?;
            if m.family != index.family {
                return Err(CheckpointError::Manifest {
                    path: target.shown(MANIFEST_FILE),
                    reason: format!("says {} ids, files hold {id_type}", m.family.name()),
                });
            }
        }

        // Hash in parallel: workers pull decoded batches from one scan and append each id's
        // local fingerprint, packed in 12 bytes, to its collection: one per shard, or
        // `2^part_bits` per shard when shards are so few that a local fingerprint has more
        // than 96 bits (the top `part_bits` bits then pick the collection and are not stored).
        let part_bits = (FINGERPRINT_BITS - shard_bits).saturating_sub(Packed96::BITS);
        let num_parts = num_shards << part_bits;
        let packed_bits = FINGERPRINT_BITS - shard_bits - part_bits;
        let packed_mask = (1u128 << packed_bits) - 1;
        let expected = dataset.count_rows().map_err(|e| self.read_error(e))?;
        let per_part_guess = (expected / num_parts as u64) * 21 / 20 + 1024;
        let reserve = per_part_guess.min(expected) as usize;
        let collected: Vec<Mutex<Vec<Packed96>>> = (0..num_parts)
            .map(|part| {
                Mutex::new(if owned[part >> part_bits] {
                    let packed = Vec::with_capacity(reserve);
                    advise_huge_pages(&packed);
                    packed
                } else {
                    Vec::new()
                })
            })
            .collect();
        // Each worker decodes and hashes its own share of the row groups: one ordered scan
        // shared by all would decode one row group at a time (the others wait their turn).
        let file_index: Arc<HashMap<String, usize>> = Arc::new(
            dataset
                .files()
                .iter()
                .enumerate()
                .map(|(i, f)| (f.uri().to_string(), i))
                .collect(),
        );
        let shares: Vec<ParquetDataset> = (0..self.threads)
            .map(|worker| {
                dataset.with_skip(Arc::new(WorkerShare {
                    owned: owned.iter().any(|o| !o).then(|| Arc::new(owned.clone())),
                    worker,
                    workers: self.threads,
                    file_index: file_index.clone(),
                }))
            })
            .collect();
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<CheckpointError>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for share in &shares {
                scope.spawn(|| {
                    let run = || -> Result<()> {
                        let mut fps = Vec::new();
                        let mut by_part: Vec<Vec<Packed96>> = vec![Vec::new(); num_parts];
                        let mut stream = share.scan();
                        while !failed.load(Ordering::Relaxed) {
                            let Some(item) = stream.next_blocking() else {
                                break;
                            };
                            let item = item.map_err(|e| self.read_error(e))?;
                            let ids = item.batch.column(0);
                            fingerprints_into(ids.as_ref(), &mut fps);
                            let nulls = ids.logical_nulls();
                            let declared = if layout_matches {
                                declared_shard(&item.provenance.file)
                            } else {
                                None
                            };
                            for (row, fp) in fps.iter().enumerate() {
                                if nulls.as_ref().is_some_and(|n| n.is_null(row)) {
                                    continue;
                                }
                                let k = shard_of(*fp, shard_bits);
                                if declared.is_some_and(|d| d != k) {
                                    return Err(CheckpointError::ShardMismatch {
                                        path: item.provenance.file.to_string(),
                                        declared: declared.expect("some"),
                                        actual: k,
                                        num_shards,
                                    });
                                }
                                if owned[k] {
                                    by_part[(*fp >> packed_bits) as usize]
                                        .push(Packed96::new(fp & packed_mask));
                                }
                            }
                            for (part, local) in by_part.iter_mut().enumerate() {
                                if !local.is_empty() {
                                    collected[part]
                                        .lock()
                                        .expect("shard lock")
                                        .extend_from_slice(local);
                                    local.clear();
                                }
                            }
                        }
                        Ok(())
                    };
                    if let Err(e) = run() {
                        failed.store(true, Ordering::Relaxed);
                        first_error.lock().expect("error lock").get_or_insert(e);
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner().expect("error lock") {
            return Err(e);
        }
        drop(shares);
        // The decoded batches are gone; return their memory before the tables are built, so
        // it does not add to the load's peak (an allocator told to keep freed memory, as the
        // Python extension tells glibc, would otherwise hold it through the build).
        release_freed_memory();

        // Build the shard tables in parallel; each frees its input as it finishes.
        let next = AtomicUsize::new(0);
        let tables: Vec<Mutex<Option<ShardTable>>> =
            (0..num_shards).map(|_| Mutex::new(None)).collect();
        let build_error: Mutex<Option<CheckpointError>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..self.threads.min(num_shards) {
                // One scratch buffer a thread, reused for each of its shards.
                scope.spawn(|| {
                    let mut scratch = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= num_shards {
                            break;
                        }
                        if !owned[k] {
                            continue;
                        }
                        let parts = collected[k << part_bits..(k + 1) << part_bits]
                            .iter()
                            .map(|part| std::mem::take(&mut *part.lock().expect("shard lock")))
                            .collect();
                        // The build refuses shards over its capacity (ShardTooLarge).
                        match ShardTable::build_from_packed(
                            parts,
                            part_bits,
                            shard_bits,
                            k,
                            &mut scratch,
                        ) {
                            Ok(t) => *tables[k].lock().expect("lock") = Some(t),
                            Err(e) => {
                                build_error.lock().expect("lock").get_or_insert(e);
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = build_error.into_inner().expect("lock") {
            return Err(e);
        }
        for (k, table) in tables.into_iter().enumerate() {
            if owned[k] {
                index.shards[k] = table.into_inner().expect("lock");
            }
        }
        release_freed_memory();
        Ok(index)
    }
}

/// One hashing worker's share of a bulk load: the row groups whose position (file index plus
/// row group) is `worker` modulo `workers`, so shares alternate over a file's row groups and
/// over files of one row group alike. A load of some shards only also skips the row groups
/// a file of [`IdPartsWriter::one_file`] declares (key-value metadata) as other shards'.
struct WorkerShare {
    worker: usize,
    workers: usize,
    file_index: Arc<HashMap<String, usize>>,
    /// Set when only some shards are loaded: `owned[k]`.
    owned: Option<Arc<Vec<bool>>>,
}

impl ScanSkip for WorkerShare {
    fn skip_file(&self, _: &FileEntry) -> bool {
        false
    }

    fn skip_row_group(&self, file: &FileEntry, row_group: usize) -> bool {
        let file = self.file_index.get(file.uri()).copied().unwrap_or(0);
        (file + row_group) % self.workers != self.worker
    }

    fn skip_row_group_in(&self, file: &FileEntry, footer: &ParquetMetaData, rg: usize) -> bool {
        self.skip_row_group(file, rg)
            || self.owned.as_ref().is_some_and(|owned| {
                declared_row_group_shard(footer, rg, owned.len())
                    .is_some_and(|k| !owned.get(k).unwrap_or(&true))
            })
    }
}

/// The shard a row group of a file of [`IdPartsWriter::one_file`] declares, if the file
/// declares one of `num_shards` shards (a file sharded otherwise is read whole and its ids
/// hashed again, as any other file).
fn declared_row_group_shard(
    footer: &ParquetMetaData,
    row_group: usize,
    num_shards: usize,
) -> Option<usize> {
    let value = |key: &str| {
        footer
            .file_metadata()
            .key_value_metadata()?
            .iter()
            .find(|kv| kv.key == key)?
            .value
            .as_deref()
    };
    if value(NUM_SHARDS_KEY)?.parse::<usize>().ok()? != num_shards {
        return None;
    }
    value(SHARDS_KEY)?
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .nth(row_group)?
        .trim()
        .parse()
        .ok()
}

/// Hand memory freed by a bulk load back to the OS. Loading frees about as much as the index
/// keeps (per-shard fingerprint vectors, decoded batches); glibc keeps freed blocks below its
/// (adaptive) mmap threshold in its arenas, where they would stay resident for the life of
/// the process. One `malloc_trim` after the load returns them.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas and releases free pages; it takes no
    // pointers from us and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    #[test]
    fn a_loader_never_shows_its_storage_option_values() {
        let loader = CheckpointIndex::loader("s3://bucket/ckpt", "id").with_storage_options(
            [("aws_secret_access_key".to_string(), "s3cr3t".to_string())].into(),
        );
        let shown = format!("{loader:?}");
        assert!(
            shown.contains("aws_secret_access_key") && !shown.contains("s3cr3t"),
            "{shown}"
        );
    }

    use arrow_array::ArrayRef;

    use crate::id_parts::IdPartsWriter;

    use super::*;

    #[test]
    fn a_load_of_some_shards_reads_only_their_row_groups_of_a_one_file_commit() {
        use arrow_array::StringArray;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let options = StorageOptions::new();
        CheckpointIndex::new(DataType::Utf8, "id", 16)
            .unwrap()
            .prepare(root, &options)
            .unwrap();
        let ids: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..50_000).map(|i| format!("id-{i}")),
        ));
        let mut writer =
            IdPartsWriter::one_file(root, &options, "id", 16, "ids/c.parquet").unwrap();
        writer.push(&ids).unwrap();
        writer.finish().unwrap();

        // Damage every row group but shard 3's: a load of shard 3 must not read them.
        let path = dir.path().join("ids/c.parquet");
        let mut bytes = fs::read(&path).unwrap();
        let footer = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&bytes::Bytes::from(bytes.clone()))
            .unwrap();
        for (rg, group) in footer.row_groups().iter().enumerate() {
            if declared_row_group_shard(&footer, rg, 16) != Some(3) {
                let (start, len) = group.column(0).byte_range();
                bytes[start as usize..(start + len) as usize].fill(0xAB);
            }
        }
        fs::write(&path, bytes).unwrap();

        let three = CheckpointIndex::loader(root, "id")
            .with_shards([3])
            .load()
            .unwrap();
        let in_three = three
            .shard_ids(ids.as_ref())
            .unwrap()
            .iter()
            .filter(|&&k| k == 3)
            .count();
        assert!(in_three > 2_000, "{in_three}");
        assert_eq!(three.len(), in_three);
        let err = CheckpointIndex::loader(root, "id")
            .with_shards([5])
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("c.parquet"), "{err}");
        // Loaded with another shard count, the file's row groups say nothing: all are read.
        assert!(declared_row_group_shard(&footer, 0, 8).is_none());
        let err = CheckpointIndex::loader(root, "id")
            .with_num_shards(8)
            .with_shards([3])
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("c.parquet"), "{err}");
    }

    use arrow_array::RecordBatch;
    use parquet::arrow::ArrowWriter;

    /// `batch` as a Parquet file in memory, encoded as checkpoint parts are.
    fn encode_parquet(batch: &RecordBatch) -> Vec<u8> {
        encode_parquet_with(batch, crate::id_parts::part_properties())
    }

    /// `batch` as a Parquet file in memory, encoded with `props`.
    fn encode_parquet_with(
        batch: &RecordBatch,
        props: parquet::file::properties::WriterProperties,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        out
    }

    #[test]
    fn each_hashing_worker_reads_its_own_row_groups_and_together_they_read_all() {
        use parquet::file::properties::WriterProperties;
        let dir = tempfile::tempdir().unwrap();
        // Two files of 7 and 1 row groups: shares alternate within a file and across files.
        for (name, ids) in [("a.parquet", 0..7000i64), ("b.parquet", 7000..8000)] {
            let batch = RecordBatch::try_from_iter([(
                "id",
                Arc::new(arrow_array::Int64Array::from_iter_values(ids)) as ArrayRef,
            )])
            .unwrap();
            let props = WriterProperties::builder()
                .set_max_row_group_row_count(Some(1000))
                .build();
            fs::write(dir.path().join(name), encode_parquet_with(&batch, props)).unwrap();
        }
        let all = arrow_array::Int64Array::from_iter_values(0..8000);
        for threads in [1, 2, 3, 8] {
            let index = CheckpointIndex::loader(dir.path().to_str().unwrap(), "id")
                .with_threads(threads)
                .load()
                .unwrap();
            assert_eq!(index.len(), 8000, "{threads} workers");
            assert_eq!(index.contains(&all).unwrap().true_count(), 8000);
        }
    }

    /// A checkpoint of the int64 ids 0..1000 in 4 shards, written at `root` as forebay
    /// writes one.
    fn write_ids_0_to_1000_in_4_shards(root: &str) -> crate::directory::WriteSummary {
        let mut index = CheckpointIndex::new(DataType::Int64, "id", 4).unwrap();
        index
            .insert(&arrow_array::Int64Array::from_iter_values(0..1000))
            .unwrap();
        index.write(root, &StorageOptions::new()).unwrap()
    }

    #[test]
    fn owned_shards_also_read_ids_written_beside_the_shard_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        write_ids_0_to_1000_in_4_shards(root);
        // Ids another writer (Ray Data's checkpoint) left at the top level.
        let flat = RecordBatch::try_from_iter([(
            "id",
            Arc::new(arrow_array::Int64Array::from_iter_values(1000..2000)) as ArrayRef,
        )])
        .unwrap();
        fs::write(dir.path().join("ray-0.parquet"), encode_parquet(&flat)).unwrap();
        let all = arrow_array::Int64Array::from_iter_values(0..2000);
        let mut held = 0;
        for k in 0..4 {
            let part = CheckpointIndex::loader(root, "id")
                .with_shards([k])
                .load()
                .unwrap();
            assert_eq!(part.loaded_shards(), vec![k]);
            held += part.len();
        }
        assert_eq!(held, 2000, "every id in exactly one owner");
        let whole = CheckpointIndex::loader(root, "id").load().unwrap();
        assert_eq!(whole.contains(&all).unwrap().true_count(), 2000);
    }

    #[test]
    fn parts_in_lz4_and_parts_in_snappy_as_written_before_load_together() {
        use crate::fingerprint::{fingerprints_into, shard_of};
        use parquet::basic::Compression;
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let written = write_ids_0_to_1000_in_4_shards(root);
        let part = fs::File::open(&written.files[0]).unwrap();
        let meta = SerializedFileReader::new(part).unwrap().metadata().clone();
        assert_eq!(
            meta.row_group(0).column(0).compression(),
            Compression::LZ4_RAW
        );

        // Ids 1000..2000 as a part of each shard, in Snappy (as parts written before LZ4_RAW were).
        let ids = arrow_array::Int64Array::from_iter_values(1000..2000);
        let mut fps = Vec::new();
        fingerprints_into(&ids, &mut fps).unwrap();
        let snappy = parquet::file::properties::WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build();
        for k in 0..4 {
            let of_k = arrow_array::Int64Array::from_iter_values(
                (0..ids.len())
                    .filter(|&i| shard_of(fps[i], 2) == k)
                    .map(|i| ids.value(i)),
            );
            let batch = RecordBatch::try_from_iter([("id", Arc::new(of_k) as ArrayRef)]).unwrap();
            let shard_dir = dir.path().join(format!("shard={k}"));
            fs::create_dir_all(&shard_dir).unwrap();
            fs::write(
                shard_dir.join("part-old.parquet"),
                encode_parquet_with(&batch, snappy.clone()),
            )
            .unwrap();
        }
        let all = arrow_array::Int64Array::from_iter_values(0..2000);
        let loaded = CheckpointIndex::loader(root, "id").load().unwrap();
        assert_eq!(loaded.len(), 2000);
        assert_eq!(loaded.contains(&all).unwrap().true_count(), 2000);
    }
}
