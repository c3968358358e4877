//! A directory the engine writes into: a local directory or a prefix in an object store,
//! with the few operations the Parquet sink and the commit protocol need.
//!
//! | operation | local directory | object store (S3, GCS, ...) |
//! |---|---|---|
//! | [`put_atomic`](Dir::put_atomic) | temp file, fsync, rename, fsync dir | one PUT (atomic) |
//! | [`publish`](Dir::publish) (move a staged file to its final name) | rename + fsync dir (atomic) | server-side copy (the object appears whole), then delete the source |
//! | [`publish_all`](Dir::publish_all) | renames, then each directory synced once, in parallel | copies (8 at a time), then bulk deletes of the sources |
//! | [`get`](Dir::get), [`list`](Dir::list), [`exists`](Dir::exists), [`delete`](Dir::delete), [`delete_tree`](Dir::delete_tree) | std::fs | object_store |
//! | [`delete_trees`](Dir::delete_trees) | trees removed on several threads | `delete_tree` each (a listing, then bulk deletes) |
//!
//! Paths are relative to the directory and use `/`.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use forebay_io::durable::{create_dir_all_noting_parents, in_parallel};
use forebay_parquet::StorageOptions;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// An error of a storage operation: what was being done and to which path.
#[derive(Debug)]
pub(crate) struct StorageError {
    pub path: String,
    pub reason: String,
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

pub(crate) type StorageResult<T> = std::result::Result<T, StorageError>;

/// A local directory or an object-store prefix.
#[derive(Clone)]
pub(crate) enum Dir {
    Local(PathBuf),
    Remote {
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        /// The URI of the prefix, for messages (`s3://bucket/out`).
        shown: String,
    },
}

impl Dir {
    /// Open `root` (a local path, `file://...`, or a URI such as `s3://bucket/dir`).
    pub(crate) fn open(root: &str, options: &StorageOptions) -> StorageResult<Dir> {
        let err = |reason: String| StorageError {
            path: root.to_string(),
            reason,
        };
        if root.contains("://") && !root.starts_with("file://") {
            let (store, prefix, shown) =
                forebay_parquet::open_location(root, options).map_err(|e| err(e.to_string()))?;
            return Ok(Dir::Remote {
                store,
                prefix,
                shown: shown.trim_end_matches('/').to_string(),
            });
        }
        let local = root.strip_prefix("file://").unwrap_or(root);
        let absolute = std::path::absolute(local).map_err(|e| err(e.to_string()))?;
        Ok(Dir::Local(absolute))
    }

    /// The directory `relative` inside this one.
    pub(crate) fn child(&self, relative: &str) -> Dir {
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
    pub(crate) fn shown(&self, relative: &str) -> String {
        match self {
            Dir::Local(p) if relative.is_empty() => p.display().to_string(),
            Dir::Local(p) => p.join(relative).display().to_string(),
            Dir::Remote { shown, .. } if relative.is_empty() => shown.clone(),
            Dir::Remote { shown, .. } => format!("{shown}/{relative}"),
        }
    }

    /// The directory's root as a location string forebay's readers accept.
    pub(crate) fn root_uri(&self) -> String {
        self.shown("")
    }

    fn error(&self, relative: &str, reason: impl std::fmt::Display) -> StorageError {
        StorageError {
            path: self.shown(relative),
            reason: reason.to_string(),
        }
    }

    /// The local file path of `relative` (None on object stores).
    pub(crate) fn local_path(&self, relative: &str) -> Option<PathBuf> {
        match self {
            Dir::Local(root) => Some(root.join(relative)),
            Dir::Remote { .. } => None,
        }
    }

    /// The store and object path of `relative` (None for local directories).
    pub(crate) fn object(&self, relative: &str) -> Option<(Arc<dyn ObjectStore>, ObjectPath)> {
        match self {
            Dir::Local(_) => None,
            Dir::Remote { store, prefix, .. } => {
                Some((store.clone(), object_path(prefix, relative)))
            }
        }
    }

    /// Make sure a local directory exists (object stores need nothing).
    pub(crate) fn create(&self) -> StorageResult<()> {
        if let Dir::Local(p) = self {
            create_dir_all_durable(p).map_err(|e| self.error("", e))?;
        }
        Ok(())
    }

    /// Store `bytes` at `relative` so that readers see all of them or nothing.
    pub(crate) fn put_atomic(&self, relative: &str, bytes: Vec<u8>) -> StorageResult<()> {
        match self {
            Dir::Local(root) => {
                let path = root.join(relative);
                write_local_atomic(&path, &bytes).map_err(|e| self.error(relative, e))
            }
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                forebay_io::block_on(
                    async move { store.put(&location, PutPayload::from(bytes)).await },
                )
                .map(drop)
                .map_err(|e| self.error(relative, e))
            }
        }
    }

    /// The bytes at `relative`, or `None` if there is nothing there.
    pub(crate) fn get(&self, relative: &str) -> StorageResult<Option<Bytes>> {
        match self {
            Dir::Local(root) => match fs::read(root.join(relative)) {
                Ok(b) => Ok(Some(Bytes::from(b))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(self.error(relative, e)),
            },
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                forebay_io::block_on(async move {
                    match store.get(&location).await {
                        Ok(r) => r.bytes().await.map(Some),
                        Err(object_store::Error::NotFound { .. }) => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .map_err(|e| self.error(relative, e))
            }
        }
    }

    pub(crate) fn exists(&self, relative: &str) -> StorageResult<bool> {
        match self {
            Dir::Local(root) => Ok(root.join(relative).exists()),
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                forebay_io::block_on(async move {
                    match store.head(&location).await {
                        Ok(_) => Ok(true),
                        Err(object_store::Error::NotFound { .. }) => Ok(false),
                        Err(e) => Err(e),
                    }
                })
                .map_err(|e| self.error(relative, e))
            }
        }
    }

    /// Names (files) directly in the directory `relative` (empty: this directory).
    pub(crate) fn list(&self, relative: &str) -> StorageResult<Vec<String>> {
        match self {
            Dir::Local(root) => match fs::read_dir(root.join(relative)) {
                Ok(entries) => Ok(entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(self.error(relative, e)),
            },
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                let listing = forebay_io::block_on(async move {
                    store.list_with_delimiter(Some(&location)).await
                })
                .map_err(|e| self.error(relative, e))?;
                Ok(listing
                    .objects
                    .into_iter()
                    .filter_map(|o| o.location.filename().map(str::to_string))
                    .collect())
            }
        }
    }

    pub(crate) fn delete(&self, relative: &str) -> StorageResult<()> {
        match self {
            Dir::Local(root) => match fs::remove_file(root.join(relative)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(self.error(relative, e)),
            },
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                forebay_io::block_on(async move {
                    match store.delete(&location).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                        Err(e) => Err(e),
                    }
                })
                .map_err(|e| self.error(relative, e))
            }
        }
    }

    /// Delete the directory `relative` and everything under it.
    ///
    /// A writer of an earlier run that is still going (a Ray task of a killed driver) can add
    /// files while the tree is removed, which fails it with "directory not empty"; the removal
    /// is retried for up to ~2 s, as such a writer stops soon after its run died.
    pub(crate) fn delete_tree(&self, relative: &str) -> StorageResult<()> {
        match self {
            Dir::Local(root) => {
                remove_local_tree(&root.join(relative)).map_err(|e| self.error(relative, e))
            }
            Dir::Remote { store, prefix, .. } => {
                let (store, location) = (store.clone(), object_path(prefix, relative));
                forebay_io::block_on(async move {
                    // Listed and deleted as one stream: stores with a bulk delete (S3's
                    // DeleteObjects) remove up to 1,000 objects a request.
                    let listed = store
                        .list(Some(&location))
                        .map_ok(|meta| meta.location)
                        .boxed();
                    delete_all(&*store, listed).await
                })
                .map_err(|e| self.error(relative, e))
            }
        }
    }

    /// Delete what is staged under `relative`: [`Dir::delete_tree`], except that files a
    /// writer of a dead run keeps adding after the retries (a Ray task of a killed driver
    /// that lives on) are left instead of failing the recovery. Nothing can publish them: no
    /// record names them, and records are written only by a run's driver. Readers skip
    /// `_`-names, and the next recovery removes them.
    pub(crate) fn delete_staging(&self, relative: &str) -> StorageResult<()> {
        match self {
            Dir::Local(root) => remove_local_tree_around_writers(&root.join(relative))
                .map_err(|e| self.error(relative, e)),
            Dir::Remote { .. } => self.delete_tree(relative),
        }
    }

    /// Delete several trees (as [`Dir::delete_tree`]). Locally each unlink waits on the file
    /// system (on a mount with `discard`, on the device), so the trees go on several threads.
    pub(crate) fn delete_trees(&self, relatives: &[String]) -> StorageResult<()> {
        match self {
            Dir::Local(_) => in_parallel(relatives, |relative| self.delete_tree(relative)),
            Dir::Remote { .. } => relatives.iter().try_for_each(|r| self.delete_tree(r)),
        }
    }

    /// [`Dir::publish`] for several files, each `(from, to)`. Locally the renames are made
    /// first, then every directory involved is synced once, the syncs overlapping on
    /// several threads: each is a device cache flush, and one per file in turn dominated a
    /// commit's time.
    pub(crate) fn publish_all(&self, moves: &[(String, String)]) -> StorageResult<()> {
        let root = match self {
            Dir::Local(root) => root,
            Dir::Remote { store, prefix, .. } => {
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
                // Copies first (several at once), then the staged sources in bulk deletes: a
                // crash in between leaves sources that the next recovery copies again.
                let sources: Vec<ObjectPath> =
                    objects.iter().map(|(_, src, _)| src.clone()).collect();
                let first_source = moves
                    .first()
                    .map(|(from, _)| from.clone())
                    .unwrap_or_default();
                return forebay_io::block_on(async move {
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
                    let sources = futures::stream::iter(sources.into_iter().map(Ok)).boxed();
                    delete_all(&*store, sources)
                        .await
                        .map_err(|e| (first_source, e))
                })
                .map_err(|(from, e)| self.error(&from, format!("publish: {e}")));
            }
        };
        let mut to_sync = BTreeSet::new();
        for (from, to) in moves {
            let (src, dst) = (root.join(from), root.join(to));
            if !src.exists() && dst.exists() {
                continue;
            }
            let parent = dst.parent().unwrap_or(Path::new("/"));
            create_dir_all_noting_parents(parent, &mut to_sync).map_err(|e| self.error(to, e))?;
            fs::rename(&src, &dst).map_err(|e| self.error(from, format!("rename to {to}: {e}")))?;
            to_sync.insert(parent.to_path_buf());
        }
        let to_sync: Vec<PathBuf> = to_sync.into_iter().collect();
        in_parallel(&to_sync, |dir| {
            sync_dir(dir).map_err(|e| StorageError {
                path: dir.display().to_string(),
                reason: e.to_string(),
            })
        })
    }

    /// Move the file at `from` to `to` (both relative), so that `to` appears whole: a
    /// rename locally, a server-side copy then delete on object stores. Idempotent: if `to`
    /// exists and `from` does not, the move already happened.
    pub(crate) fn publish(&self, from: &str, to: &str) -> StorageResult<()> {
        self.publish_all(&[(from.to_string(), to.to_string())])
    }
}

/// `rm -r`, retried for up to ~2 s while a writer still adds files ("directory not
/// empty"); a tree already gone is fine.
fn remove_local_tree(path: &Path) -> std::io::Result<()> {
    let mut attempts = 0;
    loop {
        match fs::remove_dir_all(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && attempts < 40 => {
                attempts += 1;
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

/// Copy `src` to `dst` server-side (the object appears whole). Idempotent: a source
/// already gone is fine when the destination is there (copied and deleted before).
async fn copy_object(
    store: &dyn ObjectStore,
    src: &ObjectPath,
    dst: &ObjectPath,
) -> object_store::Result<()> {
    match store.copy(src, dst).await {
        Ok(()) => Ok(()),
        Err(object_store::Error::NotFound { .. }) => store.head(dst).await.map(drop),
        Err(e) => Err(e),
    }
}

/// Delete every object of `locations` in as few requests as the store allows (S3: up to
/// 1,000 a request); objects already gone are fine.
async fn delete_all(
    store: &dyn ObjectStore,
    locations: BoxStream<'static, object_store::Result<ObjectPath>>,
) -> object_store::Result<()> {
    let mut deleted = store.delete_stream(locations);
    while let Some(result) = deleted.next().await {
        match result {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Requests an object-store operation on many files keeps in flight at once: each waits a
/// round trip, so one after another a commit of 16 id parts waited 16 of them.
const REQUESTS_IN_FLIGHT: usize = 8;

fn object_path(prefix: &ObjectPath, relative: &str) -> ObjectPath {
    relative
        .split('/')
        .filter(|p| !p.is_empty())
        .fold(prefix.clone(), |p, part| p.clone().join(part))
}

pub(crate) use forebay_io::durable::sync_dir;

/// `mkdir -p` that makes each new directory's entry durable.
pub(crate) fn create_dir_all_durable(dir: &Path) -> std::io::Result<()> {
    forebay_io::durable::create_dir_all_durable(dir).map_err(|e| e.source)
}

/// Temp file, fsync, rename, fsync of the directory.
fn write_local_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    create_dir_all_durable(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

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
