//! Where ids are written: a local directory (files made durable) or an object-store prefix,
//! and what a write wrote.
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

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use forebay_parquet::StorageOptions;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::durable::{self, create_dir_all_noting_parents, in_parallel};
use crate::error::{CheckpointError, Result};
use crate::layout::{parse_shard_dir, temp_name, temp_writer_pid, Manifest, MANIFEST_FILE};

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

    pub(crate) fn read_manifest(&self) -> Result<Option<Manifest>> {
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
                let got = forebay_io::block_on(async move {
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
    pub(crate) fn top_level(&self) -> Result<(Vec<usize>, Vec<String>)> {
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
                let listing =
                    forebay_io::block_on(
                        async move { store.list_with_delimiter(Some(&prefix)).await },
                    )
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
                forebay_io::block_on(
                    async move { store.put(&location, PutPayload::from(bytes)).await },
                )
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
            forebay_io::block_on(async move { futures::future::try_join_all(puts).await })
                .map_err(|(relative, source)| CheckpointError::Store {
                    path: self.shown(&relative),
                    source: Box::new(source),
                })?;
        }
    }
}

/// Object-store PUTs of one [`Target::put_all_atomic`] in flight at once.
pub(crate) const PUTS_IN_FLIGHT: usize = 8;

/// A file of [`Target::put_all_atomic`] written to its temp name, not yet synced.
pub(crate) struct UnsyncedTemp {
    relative: String,
    path: PathBuf,
    temp: PathBuf,
    file: fs::File,
}

/// Create `path` (it must not exist) holding `bytes`, not synced yet; removed again if the
/// write fails.
pub(crate) fn create_with(path: &FsPath, bytes: &[u8]) -> Result<fs::File> {
    create_written(path, |file| file.write_all(bytes).map_err(io_err(path)))
}

/// Create `path` (it must not exist) holding what `write` writes, not synced yet; removed
/// again if writing fails.
pub(crate) fn create_written(
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

pub(crate) fn io_err(path: &FsPath) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

pub(crate) fn fsync_dir(dir: &FsPath) -> Result<()> {
    durable::sync_dir(dir).map_err(io_err(dir))
}

/// `mkdir -p` that also makes each new directory's entry durable.
pub(crate) fn create_dir_all_durable(dir: &FsPath) -> Result<()> {
    durable::create_dir_all_durable(dir).map_err(|e| io_err(&e.path)(e.source))
}

/// Write `bytes` to `path` with the commit protocol (temp file, fsync, rename, fsync dir).
pub(crate) fn commit_local_file(path: &FsPath, bytes: &[u8]) -> Result<()> {
    commit_local_file_with(path, |file| file.write_all(bytes).map_err(io_err(path)))
}

/// [`commit_local_file`] of what `write` writes into the (temporary) file.
pub(crate) fn commit_local_file_with(
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

/// What [`CheckpointIndex::write`](crate::CheckpointIndex::write) wrote.
#[derive(Debug, Clone, Default)]
pub struct WriteSummary {
    /// Files committed (paths or URIs).
    pub files: Vec<String>,
    /// Ids written.
    pub ids: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let got = forebay_io::block_on(async move {
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
}
