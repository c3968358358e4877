//! Small pieces of durable writing on local file systems, shared with the engine's commit
//! protocol: creating directories whose entries the caller syncs later, and running work
//! that waits on the device (syncs, unlinks) on several threads at once; and telling
//! whether the process that left a file behind is still alive.
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
