//! The checkpoint's directory: a [`forebay_io::Dir`] (a local directory whose files are made
//! durable, or an object-store prefix), what its top level holds, and what a write wrote.
//!
//! # Commit protocol
//!
//! Every file is written whole or not at all ([`Dir::put_atomic`], [`Dir::put_all_atomic`]):
//! locally to `.<name>.<pid>.tmp`, `fsync`ed, renamed, its directory `fsync`ed; the parts
//! written together (one per shard) overlap their syncs on several threads. Readers skip
//! dot-files, so they see either the whole file or nothing. A temp file whose writer process
//! no longer exists (checked through `/proc` on Linux) is removed by the next load or write of
//! that checkpoint ([`clean_stale_temp_files`]); elsewhere stale temp files are only ignored.
//! On object stores (`s3://`, `gs://`, ...) a PUT is already atomic, so parts are uploaded
//! directly under their final names, several at once.

use std::fs;
use std::path::Path;

use forebay_io::dir::{temp_writer_pid, Dir, DirError};
use forebay_io::durable::process_alive;
use forebay_parquet::StorageOptions;

use crate::error::{CheckpointError, Result};
use crate::layout::{parse_shard_dir, Manifest, MANIFEST_FILE};

impl From<DirError> for CheckpointError {
    fn from(e: DirError) -> Self {
        match e {
            DirError::Io { path, source } => CheckpointError::Io { path, source },
            DirError::Store { path, source } => CheckpointError::Store {
                path,
                source: Box::new(source),
            },
            DirError::Location { path, source } => CheckpointError::Read {
                path,
                column: String::new(),
                source: Box::new(source.into()),
            },
            other => CheckpointError::Manifest {
                path: other.path().to_string(),
                reason: other.reason(),
            },
        }
    }
}

/// Open the checkpoint at `path` (a local path, `file://...`, or a URI such as `s3://b/ck`).
pub(crate) fn open_dir(path: &str, options: &StorageOptions) -> Result<Dir> {
    Ok(Dir::open(path, options)?)
}

/// The manifest at the top of the checkpoint, if there is one. A local path that is a file or
/// a glob has none: only a directory can.
pub(crate) fn read_manifest(dir: &Dir) -> Result<Option<Manifest>> {
    if let Dir::Local(root) = dir {
        if !root.is_dir() {
            return Ok(None);
        }
    }
    let shown = dir.shown(MANIFEST_FILE);
    let Some(bytes) = dir.get(MANIFEST_FILE)? else {
        return Ok(None);
    };
    let text = String::from_utf8(bytes.to_vec()).map_err(|_| CheckpointError::Manifest {
        path: shown.clone(),
        reason: "not UTF-8 text".into(),
    })?;
    Manifest::parse(&text, &shown).map(Some)
}

/// The top level of a checkpoint directory: the shard numbers that have a `shard=<k>`
/// directory, and the names of other entries that may hold ids (Parquet files and
/// directories not hidden with `_` or `.`: files another writer, such as Ray Data, left
/// beside forebay's shards).
pub(crate) fn top_level(dir: &Dir) -> Result<(Vec<usize>, Vec<String>)> {
    let mut shards = Vec::new();
    let mut others = Vec::new();
    for entry in dir.entries("")? {
        if let Some(k) = parse_shard_dir(&entry.name) {
            shards.push(k);
        } else if !entry.name.starts_with('_')
            && !entry.name.starts_with('.')
            && (entry.is_dir || entry.name.ends_with(".parquet"))
        {
            others.push(entry.name);
        }
    }
    Ok((shards, others))
}

/// Remove temp files of dead writers under a local checkpoint (root and shard directories).
/// Best effort: a file that cannot be removed is left (readers ignore it anyway).
pub fn clean_stale_temp_files(root: &Path) -> usize {
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
            if pid != me && !process_alive(pid) && fs::remove_file(e.path()).is_ok() {
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
