//! Small pieces of durable writing on local file systems, shared by the checkpoint's parts,
//! the engine's commit protocol and its writers: `mkdir -p` whose new entries are synced at
//! once or noted for the caller to sync, the sync of a directory, and running work that
//! waits on the device (syncs, unlinks) on several threads at once; and telling whether the
//! process that left a file behind is still alive.
//!
//! ```text
//!  write files ─► sync files ─┐   each sync is a device cache flush: one after another
//!  mkdir -p ──► sync parents ─┼─► they dominated a commit, so they overlap (WAITING_THREADS)
//!  rename ────► sync dirs ────┘
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Threads that wait on the file system at once: the work is waiting, not computing, so
/// more threads than cores.
pub const WAITING_THREADS: usize = 8;

/// An I/O error and the path it happened on.
#[derive(Debug)]
pub struct PathError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for PathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Make the entries of `dir` durable (what a rename or a create in it changed).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// `mkdir -p` that also makes each new directory's entry durable (its parent is synced). The
/// error names the directory being created or synced.
pub fn create_dir_all_durable(dir: &Path) -> Result<(), PathError> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_all_durable(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(source) => {
            return Err(PathError {
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    if let Some(parent) = dir.parent() {
        sync_dir(parent).map_err(|source| PathError {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

/// `mkdir -p` without syncing, adding the parent of every directory it creates to
/// `parents`: their entries must be synced (by the caller) for the new directories to be
/// durable.
pub fn create_dir_all_noting_parents(
    dir: &Path,
    parents: &mut BTreeSet<PathBuf>,
) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_all_noting_parents(parent, parents)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {
            if let Some(parent) = dir.parent() {
                parents.insert(parent.to_path_buf());
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Run `work` on every item on up to [`WAITING_THREADS`] threads (on this one when there is
/// a single item); the first error wins.
pub fn in_parallel<T: Sync, E: Send>(
    items: &[T],
    work: impl Fn(&T) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let threads = items.len().min(WAITING_THREADS);
    if threads <= 1 {
        return items.iter().try_for_each(work);
    }
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| loop {
                    let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        return Ok(());
                    };
                    work(item)?;
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("file system worker panicked"))
    })
}

/// Whether process `pid` of this machine (and pid namespace) is alive. Where that cannot be
/// told (not Linux), every process counts as alive: nothing of another process is ever
/// taken for abandoned.
pub fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_durable_mkdir_makes_every_level_and_names_what_failed() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a/b/c");
        create_dir_all_durable(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_all_durable(&deep).unwrap(); // already there: fine

        std::fs::write(root.path().join("file"), b"x").unwrap();
        let under_a_file = root.path().join("file/d");
        let err = create_dir_all_durable(&under_a_file).unwrap_err();
        assert_eq!(err.path, under_a_file);
        assert!(err
            .to_string()
            .starts_with(&under_a_file.display().to_string()));
    }

    #[test]
    fn noted_parents_are_the_parents_of_new_directories_only() {
        let root = tempfile::tempdir().unwrap();
        let mut parents = BTreeSet::new();
        create_dir_all_noting_parents(&root.path().join("x/y"), &mut parents).unwrap();
        let expected: BTreeSet<PathBuf> = [root.path().to_path_buf(), root.path().join("x")].into();
        assert_eq!(parents, expected);
    }

    #[test]
    fn this_process_is_alive() {
        assert!(process_alive(std::process::id()));
    }
}
