//! Checkpoint files: loading an index from Parquet, writing ids back, and the commit protocol.
//!
//! # Layout written by forebay
//!
//! ```text
//! <path>/_forebay_checkpoint          manifest: format, hash, num_shards, id family/column/type
//! <path>/shard=<k>/part-<id>.parquet  one column (the id column), ids of shard k only
//! <path>/<dir>/<name>.parquet         IdPartsWriter::one_file (the engine's commits: ids/):
//!                                     every shard's ids, one row group per shard, the
//!                                     key-value metadata forebay.shards listing them
//! ```
//!
//! A loader with the manifest's shard count that owns only some shards (one worker of a
//! cluster) reads only those shards' directories, and of one-file parts only those shards'
//! row groups (the footer says which is which). Any other Parquet dataset with an id
//! column — a flat directory as Ray Data writes, a glob, a file, a URI — loads too: ids are
//! re-hashed into shards on load. Names starting with `_` or `.` are never read as data.
//!
//! # Commit protocol (local file systems)
//!
//! A part file is written to `.<name>.<pid>.tmp` in its shard directory, `fsync`ed, renamed
//! to its final name, and the directory is `fsync`ed (as is the parent of any directory we
//! created). The parts written together (one per shard, by `IdPartsWriter::finish`) are
//! written and `fsync`ed on several threads at once, then renamed, then their directories
//! are `fsync`ed, again at once: every sync waits on the device, and waiting for them one
//! after another was most of a commit's time. Readers skip dot-files, so they see either
//! the whole file or nothing. A temp file whose writer process no longer exists (checked
//! through `/proc` on Linux) is removed by the next load or write of that checkpoint;
//! elsewhere stale temp files are only ignored. On object stores (`s3://`, `gs://`, ...) a
//! PUT is already atomic, so parts are uploaded directly under their final names, several
//! at once.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path as FsPath, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::DataType;
use forebay_parquet::{
    DatasetSource, FileEntry, ParquetDataset, ParquetError, ScanSkip, StorageOptions,
};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::file::metadata::ParquetMetaData;

use crate::durable::{create_dir_all_noting_parents, in_parallel};
use crate::error::{CheckpointError, Result};
use crate::fingerprint::{fingerprints_into, shard_of, IdFamily, FINGERPRINT_BITS};
use crate::huge_pages::advise_huge_pages;
use crate::id_parts::{IdPartsWriter, NUM_SHARDS_KEY, SHARDS_KEY};
use crate::index::{
    default_threads, id_value_type, shard_bits_for, CheckpointIndex, DEFAULT_NUM_SHARDS,
};
use crate::shard::{Packed96, ShardTable};

/// Name of the manifest file at the root of a checkpoint written by forebay.
pub const MANIFEST_FILE: &str = "_forebay_checkpoint";
const FORMAT_VERSION: u32 = 1;
const HASH_NAME: &str = "xxh3-128-top100";

/// What a checkpoint directory says about itself.
#[derive(Debug, Clone, PartialEq)]
struct Manifest {
    num_shards: usize,
    family: IdFamily,
    id_column: String,
    id_type: DataType,
}

impl Manifest {
    fn to_text(&self) -> String {
        format!(
            "# forebay checkpoint: ids of finished rows, hash-partitioned into shard=<k>/\n\
             format {FORMAT_VERSION}\nhash {HASH_NAME}\nnum_shards {}\nid_family {}\n\
             id_column {}\nid_type {}\n",
            self.num_shards,
            self.family.name(),
            self.id_column,
            self.id_type
        )
    }

    fn parse(text: &str, shown: &str) -> Result<Manifest> {
        let bad = |reason: String| CheckpointError::Manifest {
            path: shown.to_string(),
            reason,
        };
        let mut fields = std::collections::HashMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line
                .split_once(' ')
                .ok_or_else(|| bad(format!("malformed line {line:?}")))?;
            fields.insert(key, value.trim());
        }
        let get = |key: &str| {
            fields
                .get(key)
                .copied()
                .ok_or_else(|| bad(format!("missing '{key}'")))
        };
        let format: u32 = get("format")?
            .parse()
            .map_err(|_| bad("bad 'format'".into()))?;
        if format != FORMAT_VERSION {
            return Err(bad(format!(
                "format {format} is not supported (this forebay reads format {FORMAT_VERSION})"
            )));
        }
        if get("hash")? != HASH_NAME {
            return Err(bad(format!("unknown hash {:?}", get("hash")?)));
        }
        let num_shards = get("num_shards")?
            .parse()
            .map_err(|_| bad("bad 'num_shards'".into()))?;
        shard_bits_for(num_shards).map_err(|e| bad(e.to_string()))?;
        let family_name = get("id_family")?;
        let family = IdFamily::from_name(family_name)
            .ok_or_else(|| bad(format!("unknown id_family {family_name:?}")))?;
        let id_type =
            DataType::from_str(get("id_type")?).map_err(|e| bad(format!("bad id_type: {e}")))?;
        Ok(Manifest {
            num_shards,
            family,
            id_column: get("id_column")?.to_string(),
            id_type,
        })
    }
}

/// Where a checkpoint lives: a local directory or a prefix in an object store.
pub(crate) enum Target {
    Local(PathBuf),
    Remote {
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        shown: String,
    },
}

impl Target {
    pub(crate) fn parse(path: &str, options: &StorageOptions) -> Result<Target> {
        if !path.contains("://") || path.starts_with("file://") {
            // Absolute, so that every directory written has a parent to sync (a relative
            // "dir" has the empty path as its parent).
            let local = path.strip_prefix("file://").unwrap_or(path);
            let absolute = std::path::absolute(local).map_err(|e| CheckpointError::Io {
                path: local.to_string(),
                source: e,
            })?;
            return Ok(Target::Local(absolute));
        }
        let (store, prefix, shown) =
            forebay_parquet::open_location(path, options).map_err(|source| {
                CheckpointError::Read {
                    path: path.to_string(),
                    column: String::new(),
                    source: Box::new(source),
                }
            })?;
        Ok(Target::Remote {
            store,
            prefix,
            shown,
        })
    }

    pub(crate) fn shown(&self, relative: &str) -> String {
        match self {
            Target::Local(dir) => dir.join(relative).display().to_string(),
            Target::Remote { shown, .. } => format!("{}/{relative}", shown.trim_end_matches('/')),
        }
    }

    fn remote_path(prefix: &ObjectPath, relative: &str) -> ObjectPath {
        relative
            .split('/')
            .fold(prefix.clone(), |p, part| p.clone().join(part))
    }

    fn read_manifest(&self) -> Result<Option<Manifest>> {
        let shown = self.shown(MANIFEST_FILE);
        let text = match self {
            // A file or a glob has no manifest; only a directory can.
            Target::Local(dir) if !dir.is_dir() => return Ok(None),
            Target::Local(dir) => match fs::read_to_string(dir.join(MANIFEST_FILE)) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(source) => {
                    return Err(CheckpointError::Io {
                        path: shown,
                        source,
                    })
                }
            },
            Target::Remote { store, prefix, .. } => {
                let store = store.clone();
                let location = Self::remote_path(prefix, MANIFEST_FILE);
                let got = forebay_parquet::block_on(async move {
                    match store.get(&location).await {
                        Ok(r) => r.bytes().await.map(Some),
                        Err(object_store::Error::NotFound { .. }) => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .map_err(|source| CheckpointError::Store {
                    path: shown.clone(),
                    source: Box::new(source),
                })?;
                match got {
                    None => return Ok(None),
                    Some(bytes) => String::from_utf8(bytes.to_vec()).map_err(|_| {
                        CheckpointError::Manifest {
                            path: shown.clone(),
                            reason: "not UTF-8 text".into(),
                        }
                    })?,
                }
            }
        };
        Manifest::parse(&text, &shown).map(Some)
    }

    /// Shard numbers that have a `shard=<k>` directory (prefix).
    /// The top level of a checkpoint directory: its `shard=<k>` directories, and the names
    /// of other entries that may hold ids (Parquet files and directories not hidden with
    /// `_` or `.`: files another writer, such as Ray Data, left beside forebay's shards).
    fn top_level(&self) -> Result<(Vec<usize>, Vec<String>)> {
        // (name, is a directory)
        let entries: Vec<(String, bool)> = match self {
            Target::Local(dir) => match fs::read_dir(dir) {
                Ok(entries) => entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
                        e.file_name().into_string().ok().map(|n| (n, is_dir))
                    })
                    .collect(),
                Err(source) => {
                    return Err(CheckpointError::Io {
                        path: dir.display().to_string(),
                        source,
                    })
                }
            },
            Target::Remote {
                store,
                prefix,
                shown,
            } => {
                let (store, prefix) = (store.clone(), prefix.clone());
                let listing = forebay_parquet::block_on(async move {
                    store.list_with_delimiter(Some(&prefix)).await
                })
                .map_err(|source| CheckpointError::Store {
                    path: shown.clone(),
                    source: Box::new(source),
                })?;
                let dirs = listing
                    .common_prefixes
                    .iter()
                    .filter_map(|p| p.filename().map(|n| (n.to_string(), true)));
                let files = listing
                    .objects
                    .iter()
                    .filter_map(|o| o.location.filename().map(|n| (n.to_string(), false)));
                dirs.chain(files).collect()
            }
        };
        let mut shards = Vec::new();
        let mut others = Vec::new();
        for (name, is_dir) in entries {
            if let Some(k) = parse_shard_dir(&name) {
                shards.push(k);
            } else if !name.starts_with('_')
                && !name.starts_with('.')
                && (is_dir || name.ends_with(".parquet"))
            {
                others.push(name);
            }
        }
        Ok((shards, others))
    }

    /// Store `bytes` under `relative` so that readers see all of it or nothing.
    pub(crate) fn put_atomic(&self, relative: &str, bytes: Vec<u8>) -> Result<String> {
        let shown = self.shown(relative);
        match self {
            Target::Local(dir) => {
                commit_local_file(&dir.join(relative), &bytes)?;
            }
            Target::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), Self::remote_path(prefix, relative));
                forebay_parquet::block_on(async move {
                    store.put(&location, PutPayload::from(bytes)).await
                })
                .map_err(|source| CheckpointError::Store {
                    path: shown.clone(),
                    source: Box::new(source),
                })?;
            }
        }
        Ok(shown)
    }

    /// [`Target::put_atomic`] of what `write` writes: locally straight into the file (no
    /// copy of it is held in memory), on an object store collected for one PUT.
    pub(crate) fn put_atomic_written(
        &self,
        relative: &str,
        write: impl FnOnce(&mut (dyn Write + Send)) -> Result<()>,
    ) -> Result<String> {
        match self {
            Target::Local(dir) => {
                let path = dir.join(relative);
                commit_local_file_with(&path, |file| {
                    let mut out = std::io::BufWriter::new(file);
                    write(&mut out)?;
                    out.flush().map_err(io_err(&path))
                })?;
                Ok(self.shown(relative))
            }
            Target::Remote { .. } => {
                let mut bytes = Vec::new();
                write(&mut bytes)?;
                self.put_atomic(relative, bytes)
            }
        }
    }

    /// Store several files, each so that readers see all of it or nothing, and return their
    /// shown paths in order. `files` may produce each file's bytes on demand; locally each
    /// is written to its temp name and let go at once, so only one file's bytes are held at a
    /// time. The slow part of a durable write is waiting on the device (every `fsync` is a
    /// cache flush), so the waits overlap: once all are written, the files are `fsync`ed on a
    /// few threads at once, then renamed, then each directory involved is `fsync`ed once, in
    /// parallel again. New directories' parents are synced once each, not once per file.
    /// On an object store a PUT is atomic already; up to [`PUTS_IN_FLIGHT`] go at once.
    pub(crate) fn put_all_atomic(
        &self,
        files: impl IntoIterator<Item = Result<(String, Vec<u8>)>>,
    ) -> Result<Vec<String>> {
        let root = match self {
            Target::Local(root) => root,
            Target::Remote { store, prefix, .. } => {
                return self.put_all_remote(store, prefix, files.into_iter())
            }
        };
        let mut written: Vec<UnsyncedTemp> = Vec::new();
        let mut new_dir_parents = BTreeSet::new();
        let mut dirs = BTreeSet::new();
        let result = (|| -> Result<()> {
            for file in files {
                let (relative, bytes) = file?;
                let path = root.join(&relative);
                let dir = path.parent().ok_or_else(|| {
                    CheckpointError::InvalidArgument(format!("{}: no parent", path.display()))
                })?;
                create_dir_all_noting_parents(dir, &mut new_dir_parents).map_err(io_err(dir))?;
                dirs.insert(dir.to_path_buf());
                let temp = path.with_file_name(temp_name(
                    &path.file_name().unwrap_or_default().to_string_lossy(),
                ));
                let file = create_with(&temp, &bytes)?;
                written.push(UnsyncedTemp {
                    relative,
                    path,
                    temp,
                    file,
                });
            }
            in_parallel(&written, |w| w.file.sync_all().map_err(io_err(&w.temp)))?;
            let parents: Vec<&PathBuf> = new_dir_parents.iter().collect();
            in_parallel(&parents, |dir| fsync_dir(dir))?;
            for w in &written {
                fs::rename(&w.temp, &w.path).map_err(io_err(&w.path))?;
            }
            Ok(())
        })();
        if result.is_err() {
            for w in &written {
                let _ = fs::remove_file(&w.temp);
            }
        }
        result?;
        let dirs: Vec<&PathBuf> = dirs.iter().collect();
        in_parallel(&dirs, |dir| fsync_dir(dir))?;
        Ok(written.iter().map(|w| self.shown(&w.relative)).collect())
    }

    /// [`Target::put_all_atomic`] on an object store: each PUT is atomic and waits a round
    /// trip, so up to [`PUTS_IN_FLIGHT`] go at once; the files are taken from `files` that
    /// many at a time, so no more are held.
    fn put_all_remote(
        &self,
        store: &Arc<dyn ObjectStore>,
        prefix: &ObjectPath,
        mut files: impl Iterator<Item = Result<(String, Vec<u8>)>>,
    ) -> Result<Vec<String>> {
        let mut shown = Vec::new();
        loop {
            let batch = files
                .by_ref()
                .take(PUTS_IN_FLIGHT)
                .collect::<Result<Vec<(String, Vec<u8>)>>>()?;
            if batch.is_empty() {
                return Ok(shown);
            }
            shown.extend(batch.iter().map(|(relative, _)| self.shown(relative)));
            let puts: Vec<_> = batch
                .into_iter()
                .map(|(relative, bytes)| {
                    let (store, location) = (store.clone(), Self::remote_path(prefix, &relative));
                    async move {
                        store
                            .put(&location, PutPayload::from(bytes))
                            .await
                            .map_err(|e| (relative, e))
                    }
                })
                .collect();
            forebay_parquet::block_on(async move { futures::future::try_join_all(puts).await })
                .map_err(|(relative, source)| CheckpointError::Store {
                    path: self.shown(&relative),
                    source: Box::new(source),
                })?;
        }
    }
}

/// Object-store PUTs of one [`Target::put_all_atomic`] in flight at once.
const PUTS_IN_FLIGHT: usize = 8;

/// A file of [`Target::put_all_atomic`] written to its temp name, not yet synced.
struct UnsyncedTemp {
    relative: String,
    path: PathBuf,
    temp: PathBuf,
    file: fs::File,
}

/// Create `path` (it must not exist) holding `bytes`, not synced yet; removed again if the
/// write fails.
fn create_with(path: &FsPath, bytes: &[u8]) -> Result<fs::File> {
    create_written(path, |file| file.write_all(bytes).map_err(io_err(path)))
}

/// Create `path` (it must not exist) holding what `write` writes, not synced yet; removed
/// again if writing fails.
fn create_written(
    path: &FsPath,
    write: impl FnOnce(&mut fs::File) -> Result<()>,
) -> Result<fs::File> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(io_err(path))?;
    if let Err(e) = write(&mut file) {
        let _ = fs::remove_file(path);
        return Err(e);
    }
    Ok(file)
}

fn parse_shard_dir(name: &str) -> Option<usize> {
    name.strip_prefix("shard=")?.parse().ok()
}

/// The shard a data file declares by its `shard=<k>` directory, if any.
fn declared_shard(file: &str) -> Option<usize> {
    file.rsplit('/').skip(1).find_map(parse_shard_dir)
}

fn io_err(path: &FsPath) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn fsync_dir(dir: &FsPath) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// `mkdir -p` that also makes each new directory's entry durable.
fn create_dir_all_durable(dir: &FsPath) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_all_durable(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    }
    if let Some(parent) = dir.parent() {
        fsync_dir(parent)?;
    }
    Ok(())
}

/// Temp file name for `final_name` written by this process.
fn temp_name(final_name: &str) -> String {
    format!(".{final_name}.{}.tmp", std::process::id())
}

/// The writer pid encoded in a temp file name, if the name is one of ours.
fn temp_writer_pid(name: &str) -> Option<u32> {
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    inner.rsplit_once('.')?.1.parse().ok()
}

/// Write `bytes` to `path` with the commit protocol (temp file, fsync, rename, fsync dir).
fn commit_local_file(path: &FsPath, bytes: &[u8]) -> Result<()> {
    commit_local_file_with(path, |file| file.write_all(bytes).map_err(io_err(path)))
}

/// [`commit_local_file`] of what `write` writes into the (temporary) file.
fn commit_local_file_with(
    path: &FsPath,
    write: impl FnOnce(&mut fs::File) -> Result<()>,
) -> Result<()> {
    let dir = path.parent().ok_or_else(|| {
        CheckpointError::InvalidArgument(format!("{}: no parent", path.display()))
    })?;
    create_dir_all_durable(dir)?;
    let final_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| CheckpointError::InvalidArgument(format!("{}: bad name", path.display())))?;
    let temp = dir.join(temp_name(final_name));
    let result = (|| {
        let file = create_written(&temp, write)?;
        file.sync_all().map_err(io_err(&temp))?;
        fs::rename(&temp, path).map_err(io_err(path))?;
        fsync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Remove temp files of dead writers under a local checkpoint (root and shard directories).
/// Best effort: a file that cannot be removed is left (readers ignore it anyway).
pub fn clean_stale_temp_files(root: &FsPath) -> usize {
    let mut removed = 0;
    let mut dirs = vec![root.to_path_buf()];
    if let Ok(entries) = fs::read_dir(root) {
        for e in entries.flatten() {
            if let Some(name) = e.file_name().to_str() {
                if parse_shard_dir(name).is_some() && e.path().is_dir() {
                    dirs.push(e.path());
                }
            }
        }
    }
    let me = std::process::id();
    for dir in dirs {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(temp_writer_pid) else {
                continue;
            };
            if pid != me && !crate::durable::process_alive(pid) && fs::remove_file(e.path()).is_ok()
            {
                removed += 1;
            }
        }
    }
    removed
}

/// Loads a [`CheckpointIndex`] from Parquet files. Build with [`CheckpointIndex::loader`].
#[derive(Debug, Clone)]
pub struct CheckpointLoader {
    path: String,
    id_column: String,
    num_shards: Option<usize>,
    shards: Option<Vec<usize>>,
    storage_options: StorageOptions,
    threads: usize,
}

impl CheckpointIndex {
    /// Load the ids in column `id_column` of the Parquet files at `path` (a checkpoint written
    /// by forebay, a directory, a glob, a file or a URI).
    pub fn loader(path: impl Into<String>, id_column: impl Into<String>) -> CheckpointLoader {
        CheckpointLoader {
            path: path.into(),
            id_column: id_column.into(),
            num_shards: None,
            shards: None,
            storage_options: StorageOptions::new(),
            threads: default_threads(),
        }
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
        self.storage_options = options;
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
            } => CheckpointError::ColumnNotFound {
                path,
                column,
                available,
            },
            source => CheckpointError::Read {
                path: self.path.clone(),
                column: self.id_column.clone(),
                source: Box::new(source),
            },
        }
    }

    /// Read the files and build the index.
    pub fn load(self) -> Result<CheckpointIndex> {
        let target = Target::parse(&self.path, &self.storage_options)?;
        if let Target::Local(dir) = &target {
            if dir.is_dir() {
                clean_stale_temp_files(dir);
            }
        }
        let manifest = target.read_manifest()?;
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
        let uris = if layout_matches && owned.iter().any(|o| !o) {
            let base = self.path.trim_end_matches('/');
            let (shards, others) = target.top_level()?;
            shards
                .into_iter()
                .filter(|k| *k < num_shards && owned[*k])
                .map(|k| format!("{base}/shard={k}"))
                .chain(others.into_iter().map(|name| format!("{base}/{name}")))
                .collect()
        } else {
            vec![self.path.clone()]
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

        let dataset = if uris.is_empty() {
            None
        } else {
            let built = ParquetDataset::builder(DatasetSource::Uris {
                uris,
                storage_options: self.storage_options.clone(),
            })
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
            .unwrap_or_else(|| self.path.clone());
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
                scope.spawn(|| loop {
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
                    match ShardTable::build_from_packed(parts, part_bits, shard_bits, k) {
                        Ok(t) => *tables[k].lock().expect("lock") = Some(t),
                        Err(e) => {
                            build_error.lock().expect("lock").get_or_insert(e);
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

/// What [`CheckpointIndex::write`] wrote.
#[derive(Debug, Clone, Default)]
pub struct WriteSummary {
    /// Files committed (paths or URIs).
    pub files: Vec<String>,
    /// Ids written.
    pub ids: usize,
}

fn unique_part_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "part-{nanos:016x}-{:08x}-{:06x}.parquet",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

impl CheckpointIndex {
    /// Persist the ids inserted since the last write into the checkpoint at `path`, one new
    /// part file per shard that received ids (`<path>/shard=<k>/part-<id>.parquet`), each
    /// committed atomically. Creates the manifest on first write and refuses a checkpoint
    /// whose manifest disagrees (shard count, id family, id column). Ids already loaded from
    /// files are not rewritten: a checkpoint is an append-only set of parts. On error the ids
    /// stay pending, so the write can be retried (re-written ids are harmless duplicates).
    pub fn write(&mut self, path: &str, storage_options: &StorageOptions) -> Result<WriteSummary> {
        let target = self.prepare_target(path, storage_options)?;
        let pending = self.take_pending();
        let written = write_parts(
            target,
            &pending,
            &self.id_column,
            &self.id_type,
            self.shard_bits,
        );
        match written {
            Ok(summary) => Ok(summary),
            Err(e) => {
                self.restore_pending(pending);
                Err(e)
            }
        }
    }

    /// Make `path` a checkpoint of this index's layout: create its manifest, or check the
    /// one there (shard count, id family, id column) and remove dead writers' temp files.
    pub fn prepare(&self, path: &str, storage_options: &StorageOptions) -> Result<()> {
        self.prepare_target(path, storage_options).map(drop)
    }

    fn prepare_target(&self, path: &str, storage_options: &StorageOptions) -> Result<Target> {
        let target = Target::parse(path, storage_options)?;
        let wanted = Manifest {
            num_shards: self.num_shards(),
            family: self.family,
            id_column: self.id_column.clone(),
            id_type: self.id_type.clone(),
        };
        match target.read_manifest()? {
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
        if let Target::Local(dir) = &target {
            clean_stale_temp_files(dir);
        }
        Ok(target)
    }
}

/// The shard count the manifest at `path` declares, or `None` when `path` has no manifest
/// (no checkpoint yet, or ids written by another writer).
pub fn manifest_num_shards(path: &str, storage_options: &StorageOptions) -> Result<Option<usize>> {
    let target = Target::parse(path, storage_options)?;
    Ok(target.read_manifest()?.map(|m| m.num_shards))
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
    target: Target,
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
    use super::*;

    #[test]
    fn a_load_of_some_shards_reads_only_their_row_groups_of_a_one_file_commit() {
        use arrow::array::StringArray;
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

    #[test]
    fn put_all_atomic_writes_every_file_under_its_name_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ckpt");
        let target = Target::Local(root.clone());
        let files: Vec<(String, Vec<u8>)> = (0..11)
            .map(|k| (format!("shard={k}/part-a.parquet"), vec![k as u8; 100 + k]))
            .chain([("flat.bin".to_string(), b"flat".to_vec())])
            .collect();
        let shown = target
            .put_all_atomic(files.iter().cloned().map(Ok))
            .unwrap();
        assert_eq!(shown.len(), files.len());
        for ((relative, bytes), shown) in files.iter().zip(&shown) {
            assert_eq!(&fs::read(root.join(relative)).unwrap(), bytes, "{relative}");
            assert_eq!(shown, &root.join(relative).display().to_string());
        }
        let leftovers: Vec<_> = walk(&root)
            .into_iter()
            .filter(|p| p.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");

        // A file that cannot be written (its directory's name is taken by a file) fails the
        // whole put, naming it, and leaves no temp file of the others behind.
        fs::write(root.join("blocked"), b"a file").unwrap();
        let err = target
            .put_all_atomic([
                Ok(("shard=0/part-b.parquet".into(), b"b".to_vec())),
                Ok(("blocked/part-b.parquet".into(), b"b".to_vec())),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("blocked"), "{err}");
        assert!(!walk(&root)
            .iter()
            .any(|p| p.ends_with(".tmp") || p.contains("part-b")));

        // A file whose bytes cannot be produced fails the put the same way.
        let err = target
            .put_all_atomic([
                Ok(("shard=1/part-c.parquet".into(), b"c".to_vec())),
                Err(CheckpointError::InvalidArgument(
                    "cannot encode part d".into(),
                )),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("part d"), "{err}");
        assert!(!walk(&root)
            .iter()
            .any(|p| p.ends_with(".tmp") || p.contains("part-c")));
    }

    #[test]
    fn put_all_atomic_on_an_object_store_puts_every_file_and_stops_at_the_first_error() {
        let target = Target::parse("memory://put-all/ckpt", &StorageOptions::new()).unwrap();
        let files: Vec<(String, Vec<u8>)> = (0..19)
            .map(|k| (format!("shard={k}/part-a.parquet"), vec![k as u8; 10 + k]))
            .collect();
        let shown = target
            .put_all_atomic(files.iter().cloned().map(Ok))
            .unwrap();
        assert_eq!(
            shown.len(),
            19,
            "more files than PUTs in flight: every batch is put"
        );
        let store = forebay_parquet::global_memory_store();
        for (relative, bytes) in &files {
            let location = ObjectPath::from(format!("put-all/ckpt/{relative}"));
            let store = store.clone();
            let got = forebay_parquet::block_on(async move {
                store.get(&location).await.unwrap().bytes().await.unwrap()
            });
            assert_eq!(&got[..], &bytes[..], "{relative}");
        }

        let err = target
            .put_all_atomic([
                Ok(("shard=0/part-b.parquet".to_string(), b"b".to_vec())),
                Err(CheckpointError::InvalidArgument(
                    "cannot encode part c".into(),
                )),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("part c"), "{err}");
    }

    fn walk(dir: &FsPath) -> Vec<String> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path.display().to_string());
            }
        }
        out
    }

    use arrow::array::RecordBatch;
    use parquet::arrow::ArrowWriter;

    /// `batch` as a Parquet file in memory, encoded as checkpoint parts are.
    fn encode_parquet(batch: &RecordBatch) -> Vec<u8> {
        let mut out = Vec::new();
        let props = crate::id_parts::part_properties();
        let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        out
    }

    #[test]
    fn manifest_round_trips() {
        let m = Manifest {
            num_shards: 64,
            family: IdFamily::Bytes,
            id_column: "request id".into(),
            id_type: DataType::LargeUtf8,
        };
        assert_eq!(Manifest::parse(&m.to_text(), "x").unwrap(), m);
        assert!(Manifest::parse("format 2\n", "x").is_err());
    }

    #[test]
    fn temp_names_parse() {
        let t = temp_name("part-1.parquet");
        assert_eq!(temp_writer_pid(&t), Some(std::process::id()));
        assert_eq!(temp_writer_pid("part-1.parquet"), None);
        assert_eq!(
            declared_shard("s3://b/ck/shard=12/part-1.parquet"),
            Some(12)
        );
        assert_eq!(declared_shard("/ck/part-1.parquet"), None);
    }

    #[test]
    fn each_hashing_worker_reads_its_own_row_groups_and_together_they_read_all() {
        use parquet::arrow::ArrowWriter;
        use parquet::file::properties::WriterProperties;
        let dir = tempfile::tempdir().unwrap();
        // Two files of 7 and 1 row groups: shares alternate within a file and across files.
        for (name, ids) in [("a.parquet", 0..7000i64), ("b.parquet", 7000..8000)] {
            let batch = RecordBatch::try_from_iter([(
                "id",
                Arc::new(arrow::array::Int64Array::from_iter_values(ids)) as ArrayRef,
            )])
            .unwrap();
            let props = WriterProperties::builder()
                .set_max_row_group_row_count(Some(1000))
                .build();
            let file = fs::File::create(dir.path().join(name)).unwrap();
            let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
            writer.write(&batch).unwrap();
            writer.close().unwrap();
        }
        let all = arrow::array::Int64Array::from_iter_values(0..8000);
        for threads in [1, 2, 3, 8] {
            let index = CheckpointIndex::loader(dir.path().to_str().unwrap(), "id")
                .with_threads(threads)
                .load()
                .unwrap();
            assert_eq!(index.len(), 8000, "{threads} workers");
            assert_eq!(index.contains(&all).unwrap().true_count(), 8000);
        }
    }

    #[test]
    fn owned_shards_also_read_ids_written_beside_the_shard_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let mut index = CheckpointIndex::new(DataType::Int64, "id", 4).unwrap();
        index
            .insert(&arrow::array::Int64Array::from_iter_values(0..1000))
            .unwrap();
        index.write(root, &StorageOptions::new()).unwrap();
        // Ids another writer (Ray Data's checkpoint) left at the top level.
        let flat = RecordBatch::try_from_iter([(
            "id",
            Arc::new(arrow::array::Int64Array::from_iter_values(1000..2000)) as ArrayRef,
        )])
        .unwrap();
        fs::write(dir.path().join("ray-0.parquet"), encode_parquet(&flat)).unwrap();
        let all = arrow::array::Int64Array::from_iter_values(0..2000);
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
    fn id_parts_gather_every_chunk_by_shard_in_input_order() {
        use arrow::array::{AsArray, DictionaryArray, StringArray};
        use arrow::datatypes::Int32Type;
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
