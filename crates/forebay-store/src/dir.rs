//! The store's directory: created private (0700), or reused when only a dead owner's files
//! are in it; stores of dead owners under the same base reclaimed.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

pub use crate::error::{Result, StoreError};
use crate::{server, ARENA_FILE, SOCKET_FILE};

pub(crate) fn io_err<'a>(
    path: &'a Path,
    context: &'static str,
) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        context,
        source,
    }
}

pub(crate) fn random_nonce() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let local = 0u8;
    let mut seed = Vec::with_capacity(40);
    seed.extend_from_slice(&t.to_le_bytes());
    seed.extend_from_slice(&std::process::id().to_le_bytes());
    seed.extend_from_slice(&(&local as *const u8 as usize).to_le_bytes());
    static STORES_OPENED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = STORES_OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    seed.extend_from_slice(&n.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&seed) | 1
}

/// Prepare the store directory: create it 0700, or reuse a private one that holds no live
/// store (a dead owner's files are removed).
pub(crate) fn prepare_dir(dir: &Path) -> Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            // Parents may be missing: create them, then the store directory itself.
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|_| e)
                .map_err(io_err(dir, "creating the store directory"))?;
            return Ok(());
        }
    }
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(dir).map_err(io_err(dir, "inspecting the store directory"))?;
    if !meta.is_dir() || meta.uid() != server::euid() || meta.mode() & 0o077 != 0 {
        return Err(StoreError::Invalid {
            path: dir.to_path_buf(),
            reason: format!(
                "exists and is not a private directory of ours (uid {}, mode {:o}); use a new \
                 path",
                meta.uid(),
                meta.mode() & 0o7777
            ),
        });
    }
    let socket = dir.join(SOCKET_FILE);
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        return Err(StoreError::Invalid {
            path: dir.to_path_buf(),
            reason: "a live store already uses this directory; attach to it instead".into(),
        });
    }
    for name in [SOCKET_FILE, ARENA_FILE] {
        match fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(dir, "removing a dead store's files")(e)),
        }
    }
    Ok(())
}

/// Remove the default-placed stores (`<base>/forebay-store-<pid>-<nonce>`) of this user
/// whose owner is dead: a process killed with SIGKILL (or SIGTERM without a handler) cannot
/// remove its own, and each holds a sparse arena file in `/dev/shm` (memory, once written).
/// A store counts as dead only when its owner's pid is gone and its socket accepts no
/// connection; anything unexpected is left alone.
pub(crate) fn reclaim_dead_stores(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|n| n.strip_prefix("forebay-store-"))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, nonce)| nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        let ours =
            fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == server::euid());
        let owner_alive = owner == std::process::id()
            || !cfg!(target_os = "linux")
            || Path::new("/proc").join(owner.to_string()).exists();
        if !ours || owner_alive {
            continue;
        }
        if std::os::unix::net::UnixStream::connect(dir.join(SOCKET_FILE)).is_ok() {
            continue; // served after all (another pid namespace)
        }
        for file in [SOCKET_FILE, ARENA_FILE] {
            let _ = fs::remove_file(dir.join(file));
        }
        let _ = fs::remove_dir(&dir);
    }
}
