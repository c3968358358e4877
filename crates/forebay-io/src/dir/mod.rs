//! A directory forebay writes into: a local directory or a prefix in an object store, with
//! the operations the checkpoint's id parts, the engine's Parquet sink and its commit
//! protocol need. Readers see every file whole or not at all, on both kinds.
//!
//! | operation | local directory | object store (S3, GCS, ...) |
//! |---|---|---|
//! | [`put_atomic`](Dir::put_atomic), [`put_atomic_written`](Dir::put_atomic_written) | temp file, fsync, rename, fsync dir | one PUT (atomic) |
//! | [`put_all_atomic`](Dir::put_all_atomic) | temp files, their fsyncs in parallel, renames, each directory synced once | PUTs, 8 in flight |
//! | [`publish`](Dir::publish) (move a staged file to its final name) | rename + fsync dir (atomic) | server-side copy (the object appears whole), then delete the source |
//! | [`publish_all`](Dir::publish_all) | renames, then each directory synced once, in parallel | copies (8 at a time), then bulk deletes of the sources |
//! | [`get`](Dir::get), [`list`](Dir::list), [`entries`](Dir::entries), [`files_under`](Dir::files_under), [`exists`](Dir::exists), [`delete`](Dir::delete), [`delete_tree`](Dir::delete_tree) | std::fs | object_store |
//! | [`delete_trees`](Dir::delete_trees) | trees removed on several threads | `delete_tree` each (a listing, then bulk deletes) |
//! | [`delete_files`](Dir::delete_files) | unlinks, one after another | bulk deletes (S3: 1,000 objects a request) |
//!
//! Paths are relative to the directory and use `/`. Local temp files are named
//! `.<name>.<pid>.tmp` ([`temp_name`]): readers skip dot-files, and whoever finds one whose
//! writer is dead ([`temp_writer_pid`], [`process_alive`](crate::durable::process_alive))
//! may remove it. Every operation blocks the calling thread (object-store requests run on
//! [`crate::runtime`]); call them from a thread that may block, not from an async task.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::durable::{
    create_dir_all_durable, create_dir_all_noting_parents, in_parallel, sync_dir,
};
use crate::location::{open_location, LocationError, StorageOptions};
use crate::store_ops::{copy_object, delete_all, object_path};

mod error;
mod location;

pub use error::{DirError, DirResult};
pub use location::DirLocation;

/// A local directory or an object-store prefix.
#[derive(Clone)]
pub enum Dir {
    /// An absolute local path (so that every directory written has a parent to sync).
    Local(PathBuf),
    Remote {
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        /// The URI of the prefix, for messages (`s3://bucket/out`).
        shown: String,
    },
}

/// Shows where the directory is, never how its store was configured (credentials).
impl std::fmt::Debug for Dir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dir::Local(path) => f.debug_tuple("Dir::Local").field(path).finish(),
            Dir::Remote { shown, .. } => f.debug_tuple("Dir::Remote").field(shown).finish(),
        }
    }
}

/// One entry directly in a directory: a file (an object) or a directory (a common prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub is_dir: bool,
}

impl Dir {
    /// Open `root`: a local path, `file://...`, or a URI such as `s3://bucket/dir`.
    pub fn open(root: &str, options: &StorageOptions) -> DirResult<Dir> {
        if root.contains("://") && !root.starts_with("file://") {
            let (store, prefix, shown) =
                open_location(root, options).map_err(|source| DirError::Location {
                    path: root.to_string(),
                    source,
                })?;
            return Ok(Dir::Remote {
                store,
                prefix,
                shown: shown.trim_end_matches('/').to_string(),
            });
        }
        let local = root.strip_prefix("file://").unwrap_or(root);
        let absolute = std::path::absolute(local).map_err(|source| DirError::Io {
            path: local.to_string(),
            source,
        })?;
        Ok(Dir::Local(absolute))
    }

    /// The prefix `prefix` of a store the caller built (a host engine's, with its own
    /// credentials, retries and client): forebay uses the store as given and never sees
    /// how it was configured. `shown` is how messages name the prefix (`s3://bucket/job`).
    pub fn remote(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        shown: impl Into<String>,
    ) -> DirResult<Dir> {
        let shown: String = shown.into();
        let prefix =
            ObjectPath::parse(prefix.trim_matches('/')).map_err(|e| DirError::Location {
                path: shown.clone(),
                source: LocationError::Invalid(format!("{prefix}: not a valid object path: {e}")),
            })?;
        Ok(Dir::Remote {
            store,
            prefix,
            shown: shown.trim_end_matches('/').to_string(),
        })
    }

    /// The directory `relative` inside this one.
    pub fn child(&self, relative: &str) -> Dir {
        match self {
            Dir::Local(p) => Dir::Local(p.join(relative)),
            Dir::Remote {
                store,
                prefix,
                shown,
            } => Dir::Remote {
                store: store.clone(),
                prefix: object_path(prefix, relative),
                shown: format!("{shown}/{relative}"),
            },
        }
    }

    /// How to show `relative` in messages (a local path or a URI).
    pub fn shown(&self, relative: &str) -> String {
        match self {
            Dir::Local(p) if relative.is_empty() => p.display().to_string(),
            Dir::Local(p) => p.join(relative).display().to_string(),
            Dir::Remote { shown, .. } if relative.is_empty() => shown.clone(),
            Dir::Remote { shown, .. } => format!("{shown}/{relative}"),
        }
    }

    /// The directory's root as a location string forebay's readers accept.
    pub fn root_uri(&self) -> String {
        self.shown("")
    }

    /// The local file path of `relative` (None on object stores).
    pub fn local_path(&self, relative: &str) -> Option<PathBuf> {
        match self {
            Dir::Local(root) => Some(root.join(relative)),
            Dir::Remote { .. } => None,
        }
    }

    /// The store and object path of `relative` (None for local directories).
    pub fn object(&self, relative: &str) -> Option<(Arc<dyn ObjectStore>, ObjectPath)> {
        match self {
            Dir::Local(_) => None,
            Dir::Remote { store, prefix, .. } => {
                Some((store.clone(), object_path(prefix, relative)))
            }
        }
    }

    /// Maps an I/O error on `relative` to a [`DirError`]; the path is formatted only when
    /// an error happens (these wrap every operation).
    fn io_error<'a>(&'a self, relative: &'a str) -> impl Fn(std::io::Error) -> DirError + 'a {
        move |source| DirError::Io {
            path: self.shown(relative),
            source,
        }
    }

    /// [`Dir::io_error`] for object-store errors.
    fn store_error<'a>(
        &'a self,
        relative: &'a str,
    ) -> impl Fn(object_store::Error) -> DirError + 'a {
        move |source| DirError::Store {
            path: self.shown(relative),
            source,
        }
    }

    /// Make sure a local directory exists, durably (object stores need nothing).
    pub fn create(&self) -> DirResult<()> {
        if let Dir::Local(p) = self {
            create_dir_all_durable(p).map_err(path_error)?;
        }
        Ok(())
    }

    /// Store `bytes` at `relative` so that readers see all of them or nothing.
    pub fn put_atomic(&self, relative: &str, bytes: Vec<u8>) -> DirResult<()> {
        match self {
            Dir::Local(root) => {
                commit_local_file(&root.join(relative), |file| file.write_all(&bytes))
            }
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                crate::block_on(async move { store.put(&location, PutPayload::from(bytes)).await })
                    .map(drop)
                    .map_err(self.store_error(relative))
            }
        }
    }

    /// [`Dir::put_atomic`] of what `write` writes: locally straight into the file (no copy of
    /// it is held in memory), on an object store collected for one PUT.
    pub fn put_atomic_written<E: From<DirError>>(
        &self,
        relative: &str,
        write: impl FnOnce(&mut (dyn Write + Send)) -> Result<(), E>,
    ) -> Result<(), E> {
        match self {
            Dir::Local(root) => {
                let mut failed = None;
                let path = root.join(relative);
                let committed = commit_local_file(&path, |file| {
                    let mut out = std::io::BufWriter::new(file);
                    if let Err(e) = write(&mut out) {
                        failed = Some(e);
                        return Err(std::io::Error::other("the writer failed"));
                    }
                    out.flush()
                });
                match (failed, committed) {
                    (Some(e), _) => Err(e),
                    (None, result) => result.map_err(E::from),
                }
            }
            Dir::Remote { .. } => {
                let mut bytes = Vec::new();
                write(&mut bytes)?;
                Ok(self.put_atomic(relative, bytes)?)
            }
        }
    }

    /// Store several files, each so that readers see all of it or nothing. `files` may
    /// produce each file's bytes on demand; locally each is written to its temp name and let
    /// go at once, so only one file's bytes are held at a time. The slow part of a durable
    /// write is waiting on the device (every `fsync` is a cache flush), so the waits overlap:
    /// once all are written, the files are `fsync`ed on a few threads at once, then renamed,
    /// then each directory involved is `fsync`ed once, in parallel again. New directories'
    /// parents are synced once each, not once per file. On an object store a PUT is atomic
    /// already; up to [`REQUESTS_IN_FLIGHT`] go at once, taken from `files` that many at a
    /// time, so no more are held. The first error stops the put; locally no temp file is left.
    pub fn put_all_atomic<E: From<DirError>>(
        &self,
        files: impl IntoIterator<Item = Result<(String, Vec<u8>), E>>,
    ) -> Result<(), E> {
        let root = match self {
            Dir::Local(root) => root,
            Dir::Remote { store, prefix, .. } => {
                return self.put_all_remote(store, prefix, files.into_iter())
            }
        };
        let mut written: Vec<UnsyncedTemp> = Vec::new();
        let mut new_dir_parents = BTreeSet::new();
        let mut dirs = BTreeSet::new();
        let result = (|| -> Result<(), E> {
            for file in files {
                let (relative, bytes) = file?;
                let path = root.join(&relative);
                let dir = path.parent().unwrap_or(Path::new("/"));
                create_dir_all_noting_parents(dir, &mut new_dir_parents)
                    .map_err(local_error(dir))?;
                dirs.insert(dir.to_path_buf());
                let temp = temp_path(&path);
                let file = create_temp(&temp, |file| file.write_all(&bytes))
                    .map_err(local_error(&temp))?;
                written.push(UnsyncedTemp { path, temp, file });
            }
            in_parallel(&written, |w| {
                w.file.sync_all().map_err(local_error(&w.temp))
            })?;
            let parents: Vec<&PathBuf> = new_dir_parents.iter().collect();
            in_parallel(&parents, |dir| sync_dir(dir).map_err(local_error(dir)))?;
            for w in &written {
                fs::rename(&w.temp, &w.path).map_err(local_error(&w.path))?;
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
        Ok(in_parallel(&dirs, |dir| {
            sync_dir(dir).map_err(local_error(dir))
        })?)
    }

    fn put_all_remote<E: From<DirError>>(
        &self,
        store: &Arc<dyn ObjectStore>,
        prefix: &ObjectPath,
        mut files: impl Iterator<Item = Result<(String, Vec<u8>), E>>,
    ) -> Result<(), E> {
        loop {
            let batch = files
                .by_ref()
                .take(REQUESTS_IN_FLIGHT)
                .collect::<Result<Vec<(String, Vec<u8>)>, E>>()?;
            if batch.is_empty() {
                return Ok(());
            }
            let puts: Vec<_> = batch
                .into_iter()
                .map(|(relative, bytes)| {
                    let (store, location) = (store.clone(), object_path(prefix, &relative));
                    async move {
                        store
                            .put(&location, PutPayload::from(bytes))
                            .await
                            .map_err(|e| (relative, e))
                    }
                })
                .collect();
            crate::block_on(async move { futures::future::try_join_all(puts).await })
                .map_err(|(relative, source)| self.store_error(&relative)(source))?;
        }
    }

    /// The bytes at `relative`, or `None` if there is nothing there.
    pub fn get(&self, relative: &str) -> DirResult<Option<Bytes>> {
        match self {
            Dir::Local(root) => match fs::read(root.join(relative)) {
                Ok(b) => Ok(Some(Bytes::from(b))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(self.io_error(relative)(e)),
            },
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                crate::block_on(async move {
                    match store.get(&location).await {
                        Ok(r) => r.bytes().await.map(Some),
                        Err(object_store::Error::NotFound { .. }) => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .map_err(self.store_error(relative))
            }
        }
    }

    /// Whether there is a file (or, locally, a directory) at `relative`.
    pub fn exists(&self, relative: &str) -> DirResult<bool> {
        match self {
            Dir::Local(root) => Ok(root.join(relative).exists()),
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                crate::block_on(async move {
                    match store.head(&location).await {
                        Ok(_) => Ok(true),
                        Err(object_store::Error::NotFound { .. }) => Ok(false),
                        Err(e) => Err(e),
                    }
                })
                .map_err(self.store_error(relative))
            }
        }
    }

    /// Names of the files directly in the directory `relative` (empty: this directory); none
    /// if it does not exist.
    pub fn list(&self, relative: &str) -> DirResult<Vec<String>> {
        Ok(self
            .entries(relative)?
            .into_iter()
            .filter(|e| !e.is_dir)
            .map(|e| e.name)
            .collect())
    }

    /// Every file under the directory `relative`, at any depth, as paths relative to this
    /// directory (`relative/a/b`); none if it does not exist. One listing on object stores
    /// (a request per 1,000 objects), a walk locally.
    pub fn files_under(&self, relative: &str) -> DirResult<Vec<String>> {
        match self {
            Dir::Local(_) => {
                let mut files = Vec::new();
                let mut pending = vec![relative.trim_end_matches('/').to_string()];
                while let Some(dir) = pending.pop() {
                    for entry in self.entries(&dir)? {
                        let path = if dir.is_empty() {
                            entry.name
                        } else {
                            format!("{dir}/{}", entry.name)
                        };
                        if entry.is_dir {
                            pending.push(path);
                        } else {
                            files.push(path);
                        }
                    }
                }
                Ok(files)
            }
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                let listed: Vec<ObjectPath> = crate::block_on(async move {
                    store
                        .list(Some(&location))
                        .map_ok(|meta| meta.location)
                        .try_collect()
                        .await
                })
                .map_err(self.store_error(relative))?;
                Ok(listed
                    .iter()
                    .filter_map(|location| {
                        let parts: Vec<String> = location
                            .prefix_match(prefix)?
                            .map(|part| part.as_ref().to_string())
                            .collect();
                        Some(parts.join("/"))
                    })
                    .collect())
            }
        }
    }

    /// The files and directories directly in the directory `relative` (empty: this
    /// directory); none if it does not exist. On object stores a directory is a common prefix.
    pub fn entries(&self, relative: &str) -> DirResult<Vec<Entry>> {
        match self {
            Dir::Local(root) => match fs::read_dir(root.join(relative)) {
                Ok(entries) => Ok(entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
                        let name = e.file_name().into_string().ok()?;
                        Some(Entry { name, is_dir })
                    })
                    .collect()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(self.io_error(relative)(e)),
            },
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                let listing =
                    crate::block_on(
                        async move { store.list_with_delimiter(Some(&location)).await },
                    )
                    .map_err(self.store_error(relative))?;
                let dirs = listing.common_prefixes.iter().filter_map(|p| {
                    p.filename().map(|name| Entry {
                        name: name.to_string(),
                        is_dir: true,
                    })
                });
                let files = listing.objects.iter().filter_map(|o| {
                    o.location.filename().map(|name| Entry {
                        name: name.to_string(),
                        is_dir: false,
                    })
                });
                Ok(dirs.chain(files).collect())
            }
        }
    }

    /// Delete the file at `relative`; one already gone is fine.
    pub fn delete(&self, relative: &str) -> DirResult<()> {
        match self {
            Dir::Local(root) => match fs::remove_file(root.join(relative)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(self.io_error(relative)(e)),
            },
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                crate::block_on(async move {
                    match store.delete(&location).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                        Err(e) => Err(e),
                    }
                })
                .map_err(self.store_error(relative))
            }
        }
    }

    /// Delete the files at `relatives`, in as few requests as the store allows (S3's
    /// DeleteObjects removes up to 1,000 a request, where [`Dir::delete`] costs one request
    /// a file); ones already gone are fine. `deleted` is called once per file gone: locally
    /// after each unlink, remotely once the bulk requests returned.
    pub fn delete_files(&self, relatives: &[String], mut deleted: impl FnMut()) -> DirResult<()> {
        match self {
            Dir::Local(_) => relatives.iter().try_for_each(|relative| {
                self.delete(relative)?;
                deleted();
                Ok(())
            }),
            Dir::Remote { store, prefix, .. } => {
                let store = store.clone();
                let locations: Vec<ObjectPath> =
                    relatives.iter().map(|r| object_path(prefix, r)).collect();
                let first = relatives.first().cloned().unwrap_or_default();
                crate::block_on(async move { delete_all(&*store, locations).await })
                    .map_err(self.store_error(&first))?;
                relatives.iter().for_each(|_| deleted());
                Ok(())
            }
        }
    }

    /// Delete the directory `relative` and everything under it.
    ///
    /// A writer of an earlier run that is still going (a Ray task of a killed driver) can add
    /// files while the tree is removed, which fails it with "directory not empty"; the removal
    /// is retried for up to ~2 s, as such a writer stops soon after its run died.
    pub fn delete_tree(&self, relative: &str) -> DirResult<()> {
        match self {
            Dir::Local(root) => {
                remove_local_tree(&root.join(relative)).map_err(self.io_error(relative))
            }
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                crate::block_on(async move {
                    let listed: Vec<ObjectPath> = store
                        .list(Some(&location))
                        .map_ok(|meta| meta.location)
                        .try_collect()
                        .await?;
                    delete_all(&*store, listed).await
                })
                .map_err(self.store_error(relative))
            }
        }
    }

    /// Delete what is staged under `relative`: [`Dir::delete_tree`], except that files a
    /// writer of a dead run keeps adding after the retries (a Ray task of a killed driver
    /// that lives on) are left instead of failing. The engine's recovery relies on this:
    /// nothing can publish such files (no record names them), readers skip `_`-names, and
    /// the next recovery removes them.
    pub fn delete_staging(&self, relative: &str) -> DirResult<()> {
        match self {
            Dir::Local(root) => remove_local_tree_around_writers(&root.join(relative))
                .map_err(self.io_error(relative)),
            Dir::Remote { .. } => self.delete_tree(relative),
        }
    }

    /// Delete several trees (as [`Dir::delete_tree`]). Locally each unlink waits on the file
    /// system (on a mount with `discard`, on the device), so the trees go on several threads.
    pub fn delete_trees(&self, relatives: &[String]) -> DirResult<()> {
        match self {
            Dir::Local(_) => in_parallel(relatives, |relative| self.delete_tree(relative)),
            Dir::Remote { .. } => relatives.iter().try_for_each(|r| self.delete_tree(r)),
        }
    }

    /// [`Dir::publish`] for several files, each `(from, to)`. Locally the renames are made
    /// first, then every directory involved is synced once, the syncs overlapping on
    /// several threads: each is a device cache flush, and one per file in turn dominated a
    /// commit's time.
    pub fn publish_all(&self, moves: &[(String, String)]) -> DirResult<()> {
        let root = match self {
            Dir::Local(root) => root,
            Dir::Remote { store, prefix, .. } => {
                return self.publish_all_remote(store, prefix, moves)
            }
        };
        let mut to_sync = BTreeSet::new();
        for (from, to) in moves {
            let (src, dst) = (root.join(from), root.join(to));
            if !src.exists() && dst.exists() {
                continue;
            }
            let parent = dst.parent().unwrap_or(Path::new("/"));
            create_dir_all_noting_parents(parent, &mut to_sync).map_err(self.io_error(to))?;
            fs::rename(&src, &dst).map_err(|source| DirError::Io {
                path: format!("{} -> {}", src.display(), dst.display()),
                source,
            })?;
            to_sync.insert(parent.to_path_buf());
        }
        let to_sync: Vec<PathBuf> = to_sync.into_iter().collect();
        in_parallel(&to_sync, |dir| sync_dir(dir).map_err(local_error(dir)))
    }

    fn publish_all_remote(
        &self,
        store: &Arc<dyn ObjectStore>,
        prefix: &ObjectPath,
        moves: &[(String, String)],
    ) -> DirResult<()> {
        let store = store.clone();
        let objects: Vec<(String, ObjectPath, ObjectPath)> = moves
            .iter()
            .map(|(from, to)| {
                (
                    from.clone(),
                    object_path(prefix, from),
                    object_path(prefix, to),
                )
            })
            .collect();
        // Copies first (several at once), then the staged sources in bulk deletes: a crash in
        // between leaves sources that the next recovery copies again.
        let sources: Vec<ObjectPath> = objects.iter().map(|(_, src, _)| src.clone()).collect();
        let first_source = moves
            .first()
            .map(|(from, _)| from.clone())
            .unwrap_or_default();
        crate::block_on(async move {
            futures::stream::iter(objects)
                .map(|(from, src, dst)| {
                    let store = store.clone();
                    async move {
                        copy_object(&*store, &src, &dst)
                            .await
                            .map_err(|e| (from, e))
                    }
                })
                .buffer_unordered(REQUESTS_IN_FLIGHT)
                .try_collect::<Vec<()>>()
                .await?;
            delete_all(&*store, sources)
                .await
                .map_err(|e| (first_source, e))
        })
        .map_err(|(from, source)| self.store_error(&from)(source))
    }

    /// Move the file at `from` to `to` (both relative), so that `to` appears whole: a
    /// rename locally, a server-side copy then delete on object stores. Idempotent: if `to`
    /// exists and `from` does not, the move already happened.
    pub fn publish(&self, from: &str, to: &str) -> DirResult<()> {
        self.publish_all(&[(from.to_string(), to.to_string())])
    }
}

/// Requests an object-store operation on many files keeps in flight at once: each waits a
/// round trip, so one after another a commit of 16 id parts waited 16 of them.
pub const REQUESTS_IN_FLIGHT: usize = 8;

/// The name a local file is written under before it is renamed to `final_name`:
/// `.<final_name>.<pid>.tmp`, hidden from readers and traceable to its writer.
pub fn temp_name(final_name: &str) -> String {
    format!(".{final_name}.{}.tmp", std::process::id())
}

/// The writer pid encoded in a temp file name, if the name is one of ours.
pub fn temp_writer_pid(name: &str) -> Option<u32> {
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    inner.rsplit_once('.')?.1.parse().ok()
}

fn temp_path(path: &Path) -> PathBuf {
    path.with_file_name(temp_name(
        &path.file_name().unwrap_or_default().to_string_lossy(),
    ))
}

/// A file of [`Dir::put_all_atomic`] written to its temp name, not yet synced.
struct UnsyncedTemp {
    path: PathBuf,
    temp: PathBuf,
    file: fs::File,
}

/// Create the temp file `temp` holding what `write` writes, not synced yet; removed again if
/// writing fails. A leftover of the same name (a dead writer whose pid this process now has,
/// as happens with pid namespaces) is overwritten.
fn create_temp(
    temp: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<fs::File> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(temp)?;
    if let Err(e) = write(&mut file) {
        let _ = fs::remove_file(temp);
        return Err(e);
    }
    Ok(file)
}

/// Write `path` with the local commit protocol: its directory made (durably), a temp file
/// holding what `write` writes, fsync, rename, fsync of the directory. No temp file is left
/// if any step fails.
fn commit_local_file(
    path: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> DirResult<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    create_dir_all_durable(dir).map_err(path_error)?;
    let temp = temp_path(path);
    let result = (|| {
        let file = create_temp(&temp, write).map_err(local_error(&temp))?;
        file.sync_all().map_err(local_error(&temp))?;
        drop(file);
        fs::rename(&temp, path).map_err(local_error(path))?;
        sync_dir(dir).map_err(local_error(dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

fn local_error(path: &Path) -> impl Fn(std::io::Error) -> DirError + '_ {
    move |source| DirError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn path_error(e: crate::durable::PathError) -> DirError {
    DirError::Io {
        path: e.path.display().to_string(),
        source: e.source,
    }
}

/// `rm -r`, retried for up to 2 s while a writer still adds files ("directory not
/// empty"); a tree already gone is fine. The 2 s are of wall time, the attempts' own
/// deleting included: a writer adding files as fast as they are deleted makes each attempt
/// long, and a count of attempts then took up to 9 s on a loaded machine.
fn remove_local_tree(path: &Path) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match fs::remove_dir_all(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e)
                if e.kind() == std::io::ErrorKind::DirectoryNotEmpty
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}

/// [`remove_local_tree`], then, if a writer still adds files, every entry but the ones it
/// keeps filling (a dead run's writer stages into its own commit's directory).
fn remove_local_tree_around_writers(path: &Path) -> std::io::Result<()> {
    match remove_local_tree(path) {
        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
            for entry in fs::read_dir(path)? {
                let entry = entry?.path();
                let removed = if entry.is_dir() {
                    fs::remove_dir_all(&entry)
                } else {
                    fs::remove_file(&entry)
                };
                match removed {
                    Err(e)
                        if !matches!(
                            e.kind(),
                            std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty
                        ) =>
                    {
                        return Err(e)
                    }
                    _ => {}
                }
            }
            Ok(())
        }
        result => result,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// An error of the caller's own, for the callbacks and file producers.
    #[derive(Debug)]
    enum Failed {
        // Read through `Debug` in assertion messages only.
        Dir(#[allow(dead_code)] DirError),
        Mine(&'static str),
    }

    impl From<DirError> for Failed {
        fn from(e: DirError) -> Self {
            Failed::Dir(e)
        }
    }

    fn walk(dir: &Path) -> Vec<String> {
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

    #[test]
    fn put_all_atomic_writes_every_file_under_its_name_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ckpt");
        let dir = Dir::Local(root.clone());
        let files: Vec<(String, Vec<u8>)> = (0..11)
            .map(|k| (format!("shard={k}/part-a.parquet"), vec![k as u8; 100 + k]))
            .chain([("flat.bin".to_string(), b"flat".to_vec())])
            .collect();
        dir.put_all_atomic::<DirError>(files.iter().cloned().map(Ok))
            .unwrap();
        for (relative, bytes) in &files {
            assert_eq!(&fs::read(root.join(relative)).unwrap(), bytes, "{relative}");
        }
        let leftovers: Vec<_> = walk(&root)
            .into_iter()
            .filter(|p| p.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");

        // A file that cannot be written (its directory's name is taken by a file) fails the
        // whole put, naming it, and leaves no temp file of the others behind.
        fs::write(root.join("blocked"), b"a file").unwrap();
        let err = dir
            .put_all_atomic::<DirError>([
                Ok(("shard=0/part-b.parquet".into(), b"b".to_vec())),
                Ok(("blocked/part-b.parquet".into(), b"b".to_vec())),
            ])
            .unwrap_err();
        assert!(err.path().contains("blocked"), "{err}");
        assert!(!walk(&root)
            .iter()
            .any(|p| p.ends_with(".tmp") || p.contains("part-b")));

        // A file whose bytes cannot be produced fails the put the same way.
        let err = dir
            .put_all_atomic([
                Ok(("shard=1/part-c.parquet".into(), b"c".to_vec())),
                Err(Failed::Mine("cannot encode part d")),
            ])
            .unwrap_err();
        assert!(
            matches!(err, Failed::Mine("cannot encode part d")),
            "{err:?}"
        );
        assert!(!walk(&root)
            .iter()
            .any(|p| p.ends_with(".tmp") || p.contains("part-c")));
    }

    #[test]
    fn put_all_atomic_on_an_object_store_puts_every_file_and_stops_at_the_first_error() {
        let dir = Dir::open("memory://put-all/ckpt", &StorageOptions::new()).unwrap();
        let files: Vec<(String, Vec<u8>)> = (0..19)
            .map(|k| (format!("shard={k}/part-a.parquet"), vec![k as u8; 10 + k]))
            .collect();
        dir.put_all_atomic::<DirError>(files.iter().cloned().map(Ok))
            .unwrap();
        // More files than requests in flight: every batch is put.
        for (relative, bytes) in &files {
            assert_eq!(&dir.get(relative).unwrap().unwrap()[..], &bytes[..]);
        }
        let err = dir
            .put_all_atomic([
                Ok(("shard=0/part-b.parquet".to_string(), b"b".to_vec())),
                Err(Failed::Mine("cannot encode part c")),
            ])
            .unwrap_err();
        assert!(matches!(err, Failed::Mine(_)), "{err:?}");
    }

    #[test]
    fn a_failed_streamed_write_returns_the_writers_error_and_leaves_nothing() {
        for uri in ["local", "memory://streamed"] {
            let tmp = tempfile::tempdir().unwrap();
            let root = if uri == "local" {
                tmp.path().display().to_string()
            } else {
                uri.to_string()
            };
            let dir = Dir::open(&root, &StorageOptions::new()).unwrap();
            dir.put_atomic_written::<Failed>("a/ok.bin", |out| {
                out.write_all(b"whole")
                    .map_err(|e| Failed::Dir(dir.io_error("")(e)))
            })
            .unwrap();
            assert_eq!(&dir.get("a/ok.bin").unwrap().unwrap()[..], b"whole");
            let err = dir
                .put_atomic_written::<Failed>("a/bad.bin", |out| {
                    out.write_all(b"half").unwrap();
                    Err(Failed::Mine("encoder failed"))
                })
                .unwrap_err();
            assert!(matches!(err, Failed::Mine("encoder failed")), "{err:?}");
            assert_eq!(dir.get("a/bad.bin").unwrap(), None);
            assert_eq!(dir.list("a").unwrap(), vec!["ok.bin".to_string()], "{uri}");
        }
    }

    #[test]
    fn entries_tell_files_from_directories_on_both_kinds() {
        let tmp = tempfile::tempdir().unwrap();
        for root in [
            tmp.path().display().to_string(),
            "memory://entries".to_string(),
        ] {
            let dir = Dir::open(&root, &StorageOptions::new()).unwrap();
            dir.put_atomic("top.parquet", b"x".to_vec()).unwrap();
            dir.put_atomic("shard=1/part.parquet", b"y".to_vec())
                .unwrap();
            let mut entries = dir.entries("").unwrap();
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let want = vec![
                Entry {
                    name: "shard=1".into(),
                    is_dir: true,
                },
                Entry {
                    name: "top.parquet".into(),
                    is_dir: false,
                },
            ];
            assert_eq!(entries, want, "{root}");
            assert_eq!(dir.list("").unwrap(), vec!["top.parquet".to_string()]);
            assert!(dir.entries("missing").unwrap().is_empty());
            dir.publish("top.parquet", "moved/top.parquet").unwrap();
            dir.publish("top.parquet", "moved/top.parquet").unwrap(); // done already: fine
            assert_eq!(dir.list("moved").unwrap(), vec!["top.parquet".to_string()]);
            dir.delete_tree("moved").unwrap();
            assert!(!dir.exists("moved/top.parquet").unwrap());
        }
    }

    #[test]
    fn delete_files_removes_exactly_the_files_named_on_both_kinds() {
        let tmp = tempfile::tempdir().unwrap();
        for root in [
            tmp.path().display().to_string(),
            "memory://delete-files".to_string(),
        ] {
            let dir = Dir::open(&root, &StorageOptions::new()).unwrap();
            for k in 0..5 {
                dir.put_atomic(&format!("c/{k}.json"), vec![k]).unwrap();
            }
            // Gone already (a kill between two deletes): fine, and counted.
            let doomed: Vec<String> = ["c/0.json", "c/2.json", "c/gone.json", "c/4.json"]
                .map(String::from)
                .to_vec();
            let mut confirmed = 0;
            dir.delete_files(&doomed, || confirmed += 1).unwrap();
            assert_eq!(confirmed, 4, "{root}");
            let mut left = dir.list("c").unwrap();
            left.sort();
            assert_eq!(left, ["1.json", "3.json"], "{root}");
            dir.delete_files(&[], || unreachable!()).unwrap();
        }
    }

    #[test]
    fn files_under_lists_every_depth_relative_to_the_directory_on_both_kinds() {
        let tmp = tempfile::tempdir().unwrap();
        for root in [
            tmp.path().display().to_string(),
            "memory://files-under/ckpt".to_string(),
        ] {
            let dir = Dir::open(&root, &StorageOptions::new()).unwrap();
            for file in [
                "s/c1/ids/p1.parquet",
                "s/c1/ids/p2.parquet",
                "s/c2.json",
                "top.json",
            ] {
                dir.put_atomic(file, b"x".to_vec()).unwrap();
            }
            let mut files = dir.files_under("s").unwrap();
            files.sort();
            assert_eq!(
                files,
                ["s/c1/ids/p1.parquet", "s/c1/ids/p2.parquet", "s/c2.json"],
                "{root}"
            );
            assert!(dir.files_under("missing").unwrap().is_empty(), "{root}");
        }
    }

    #[test]
    fn temp_names_say_their_writer() {
        let t = temp_name("part-1.parquet");
        assert!(t.starts_with('.') && t.ends_with(".tmp"));
        assert_eq!(temp_writer_pid(&t), Some(std::process::id()));
        assert_eq!(temp_writer_pid("part-1.parquet"), None);
    }

    #[test]
    fn a_temp_file_left_under_this_processs_pid_does_not_block_a_write() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::Local(tmp.path().to_path_buf());
        fs::write(
            tmp.path().join(temp_name("f.bin")),
            b"left by a dead writer",
        )
        .unwrap();
        dir.put_atomic("f.bin", b"new".to_vec()).unwrap();
        assert_eq!(fs::read(tmp.path().join("f.bin")).unwrap(), b"new");
        assert!(!tmp.path().join(temp_name("f.bin")).exists());
    }

    /// A thread that keeps adding files under `dir/late` until stopped (a writer of a dead
    /// run that lives on).
    fn late_writer(dir: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let sub = dir.join("late");
                let _ = fs::create_dir_all(&sub);
                let _ = fs::write(sub.join(format!("f{n}")), b"x");
                n += 1;
            }
        })
    }

    #[test]
    fn staging_removal_leaves_what_a_live_writer_of_a_dead_run_keeps_adding() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::Local(tmp.path().to_path_buf());
        let staging = tmp.path().join("_staging");
        fs::create_dir_all(staging.join("done")).unwrap();
        fs::write(staging.join("done/part.parquet"), b"staged").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = late_writer(staging.clone(), stop.clone());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let started = std::time::Instant::now();
        // (`delete_tree` would fail here after its retries, unless the writer happened to
        // pause for longer than an `rm -r` takes: not asserted, as that depends on load.)
        let deleted = dir.delete_staging("_staging");
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(deleted.is_ok(), "{deleted:?}");
        assert!(
            !staging.join("done").exists(),
            "what was staged before is gone"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        // Once the writer stopped, the next recovery removes the rest.
        dir.delete_staging("_staging").unwrap();
        assert!(!staging.exists());
    }
}
