//! Turning what the user typed (paths, directories, globs, URIs) into a list of files.
//!
//! * A local path (`/data/x.parquet`, `data/`) or a `file://` URI is listed and its footer
//!   read through object_store's `LocalFileSystem`; its column chunks are read directly
//!   (`local.rs`: `pread` into uninitialised memory, no thread hand-off when cached).
//! * `s3://`, `gs://`, `az://`/`abfs://`, `http(s)://` and `memory://` open their store as
//!   forebay-io's `location` module says (from the environment, then the user's
//!   `storage_options`, which win); `memory://` is one process-wide in-memory store
//!   ([`global_memory_store`]).
//!
//! A directory (or prefix) is listed recursively and its files are read in lexicographic
//! order. Like pyarrow and Spark, names beginning with `_` or `.` (`_SUCCESS`, `.crc`,
//! `_metadata`, temporary files) are skipped. A glob (`*`, `?`, `[...]`, `**`) is matched
//! against the listing of its longest literal prefix. Explicit file lists keep their order.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

pub use forebay_io::location::{global_memory_store, StorageOptions};
use forebay_io::location::{StoreRoot, Stores};

use crate::error::{ParquetError, Result};
use crate::io::{FileEntry, IoMetrics};

/// Store `data` at a `memory://` URI in [`global_memory_store`] (blocking).
pub fn put_memory_object(uri: &str, data: Vec<u8>) -> Result<()> {
    forebay_io::location::put_memory_object(uri, data).map_err(ParquetError::from)
}

/// Where a dataset's files come from: paths and URIs forebay opens, or objects of a store the
/// caller built (a host engine's, with its own credentials and client).
///
/// ```
/// use std::sync::Arc;
/// use forebay_parquet::object_store::{memory::InMemory, path::Path, ObjectStore, ObjectStoreExt};
/// use forebay_parquet::{DatasetSource, ParquetDataset};
///
/// # let bytes = {
/// #     use forebay_parquet::arrow_array::{ArrayRef, Int64Array, RecordBatch};
/// #     let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..5));
/// #     let batch = RecordBatch::try_from_iter([("id", ids)])?;
/// #     let mut out = Vec::new();
/// #     let mut w = forebay_parquet::parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None)?;
/// #     w.write(&batch)?;
/// #     w.close()?;
/// #     out
/// # };
/// let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
/// let put = store.clone();
/// forebay_parquet::block_on(async move {
///     put.put(&Path::from("events/day=1/a.parquet"), bytes.into()).await
/// })?;
/// let dataset = ParquetDataset::builder(DatasetSource::Store {
///     store,
///     display_prefix: "mem://".into(),
///     paths: vec!["events/".into()], // a prefix: every Parquet file under it
/// })
/// .build()?;
/// assert_eq!(dataset.count_rows()?, 5);
/// assert_eq!(dataset.files()[0].uri(), "mem://events/day=1/a.parquet");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub enum DatasetSource {
    /// Paths, directories, globs or URIs, resolved with the given storage options.
    Uris {
        uris: Vec<String>,
        storage_options: StorageOptions,
    },
    /// Objects of an already-configured store (for Rust embedders); each entry may be a
    /// file, a prefix or a glob relative to the store's root.
    Store {
        store: Arc<dyn ObjectStore>,
        display_prefix: String,
        paths: Vec<String>,
    },
    /// [`Store`](Self::Store) for a local file system store the caller built: its files
    /// are read with positioned reads, as a local path's are, and their ranges are not
    /// merged across gaps (a `dyn ObjectStore` cannot say that it is local).
    LocalStore {
        store: Arc<object_store::local::LocalFileSystem>,
        display_prefix: String,
        paths: Vec<String>,
    },
}

impl DatasetSource {
    /// A source from local paths or URIs with no extra storage options.
    pub fn uris<I, S>(uris: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        DatasetSource::Uris {
            uris: uris.into_iter().map(Into::into).collect(),
            storage_options: StorageOptions::new(),
        }
    }
}

impl std::fmt::Debug for DatasetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatasetSource::Uris { uris, .. } => f.debug_tuple("Uris").field(uris).finish(),
            DatasetSource::Store {
                display_prefix,
                paths,
                ..
            }
            | DatasetSource::LocalStore {
                display_prefix,
                paths,
                ..
            } => f
                .debug_tuple("Store")
                .field(display_prefix)
                .field(paths)
                .finish(),
        }
    }
}

/// Open the object store behind one local path or URI (`s3://bucket/key`, `file:///x`,
/// `memory://k`, `/tmp/x`), returning the store, the object path inside it and the URI to show
/// in messages. Used by crates that write next to what this crate reads (checkpoint files).
pub fn open_location(
    uri: &str,
    options: &StorageOptions,
) -> Result<(Arc<dyn ObjectStore>, Path, String)> {
    forebay_io::location::open_location(uri, options).map_err(ParquetError::from)
}

/// The name endings a directory listing keeps by default (see
/// `ParquetDatasetBuilder::with_file_extensions`).
pub const DEFAULT_FILE_EXTENSIONS: &[&str] = &[".parquet", ".parq", ".pq"];

/// Paths of a list expanded (HEAD, LIST) at once.
const EXPANSIONS_IN_FLIGHT: usize = 16;

/// Resolve a [`DatasetSource`] into the ordered list of its files. A listed directory keeps
/// the names ending in one of `extensions` (all names with `None`).
pub(crate) async fn resolve(
    source: &DatasetSource,
    extensions: Option<&[String]>,
    metrics: &IoMetrics,
) -> Result<Vec<FileEntry>> {
    let mut files = Vec::new();
    match source {
        DatasetSource::Uris {
            uris,
            storage_options,
        } => {
            if uris.is_empty() {
                return Err(ParquetError::InvalidArgument("no paths given".into()));
            }
            let mut stores = Stores::default();
            let roots = uris
                .iter()
                .map(|uri| Ok((uri, stores.open(uri, storage_options)?)))
                .collect::<Result<Vec<_>>>()?;
            // Each expansion is a round trip or two on an object store: a list of 1,000
            // file URIs waits for ~1,000 / EXPANSIONS_IN_FLIGHT of them, not 1,000.
            for batch in roots.chunks(EXPANSIONS_IN_FLIGHT) {
                let mut expansions = Vec::with_capacity(batch.len());
                for (uri, (root, path)) in batch {
                    expansions.push(expand(root, uri, path, extensions, metrics));
                }
                let expanded = futures::future::try_join_all(expansions).await?;
                files.extend(expanded.into_iter().flatten());
            }
        }
        DatasetSource::Store {
            store,
            display_prefix,
            paths,
        } => {
            let root = StoreRoot {
                local: None,
                store: store.clone(),
                display_prefix: display_prefix.clone(),
            };
            files.extend(expand_store_paths(&root, paths, extensions, metrics).await?);
        }
        DatasetSource::LocalStore {
            store,
            display_prefix,
            paths,
        } => {
            let root = StoreRoot {
                local: Some(store.clone()),
                store: store.clone(),
                display_prefix: display_prefix.clone(),
            };
            files.extend(expand_store_paths(&root, paths, extensions, metrics).await?);
        }
    }
    Ok(files)
}

/// Files named on their own (not listed) under one of `bases` (paths, URIs, or for a
/// store's source paths in it) get the directories between the base and them, as if the
/// base had been listed (`FileEntry::listed_under`, read for hive partition columns); the
/// longest base holding a file wins.
pub(crate) fn place_under_bases(
    files: &mut [FileEntry],
    source: &DatasetSource,
    bases: &[String],
) -> Result<()> {
    let mut stores = Stores::default();
    let shown: Vec<String> = bases
        .iter()
        .map(|base| {
            let shown = match source {
                DatasetSource::Uris {
                    storage_options, ..
                } => {
                    let (root, path) = stores.open(base, storage_options)?;
                    format!("{}{}", root.display_prefix, path.trim_matches('/'))
                }
                DatasetSource::Store { display_prefix, .. }
                | DatasetSource::LocalStore { display_prefix, .. } => {
                    format!("{display_prefix}{}", base.trim_matches('/'))
                }
            };
            Ok(format!("{}/", shown.trim_end_matches('/')))
        })
        .collect::<Result<_>>()?;
    for file in files.iter_mut().filter(|f| f.listed_under.is_none()) {
        let base = shown
            .iter()
            .filter(|base| file.uri.starts_with(base.as_str()))
            .max_by_key(|base| base.len());
        if let Some(base) = base {
            let relative = &file.uri[base.len()..];
            let dir = relative.rsplit_once('/').map_or("", |(dir, _)| dir);
            file.listed_under = Some(Arc::from(dir));
        }
    }
    Ok(())
}

/// Expand paths relative to a store's root, in order.
async fn expand_store_paths(
    root: &StoreRoot,
    paths: &[String],
    extensions: Option<&[String]>,
    metrics: &IoMetrics,
) -> Result<Vec<FileEntry>> {
    let mut files = Vec::new();
    for p in paths {
        let path = Path::parse(p.trim_start_matches('/')).map_err(|e| {
            ParquetError::InvalidArgument(format!("{p}: not a valid object path: {e}"))
        })?;
        files.extend(expand(root, p, path.as_ref(), extensions, metrics).await?);
    }
    Ok(files)
}

/// The object path of `segments` (names as they are) in `root`'s store. Locally, as the
/// store's own listing names a file (its names' `%` escaped the way the store maps them
/// back to the file system): `a%20b.parquet` is that file, not `a b.parquet`.
fn object_path<'a>(root: &StoreRoot, segments: impl Iterator<Item = &'a str>) -> Path {
    let parts: Vec<&str> = segments.collect();
    if root.local.is_some() {
        if let Ok(path) = Path::from_absolute_path(format!("/{}", parts.join("/"))) {
            return path;
        }
    }
    Path::from_iter(parts)
}

fn is_glob(path: &str) -> bool {
    path.contains(['*', '?', '['])
}

/// Names that dataset readers conventionally skip: `_SUCCESS`, `.crc`, temp files.
fn is_hidden(relative: &str) -> bool {
    relative
        .split('/')
        .any(|part| part.starts_with('_') || part.starts_with('.'))
}

/// Expand one location: a glob, a single object, or a prefix to list.
async fn expand(
    root: &StoreRoot,
    shown: &str,
    path: &str,
    extensions: Option<&[String]>,
    metrics: &IoMetrics,
) -> Result<Vec<FileEntry>> {
    // A listed file remembers the directories between the listed prefix and itself.
    let entry = |meta: object_store::ObjectMeta, listed: Option<&Path>| FileEntry {
        listed_under: listed.map(|prefix| {
            let relative = relative_to(prefix, &meta.location);
            let dir = relative.rsplit_once('/').map_or("", |(dir, _)| dir);
            Arc::from(dir)
        }),
        local_path: root
            .local
            .as_ref()
            .and_then(|fs| fs.path_to_filesystem(&meta.location).ok())
            .map(Arc::from),
        store: root.store.clone(),
        uri: Arc::from(format!("{}{}", root.display_prefix, meta.location)),
        location: meta.location,
        size: meta.size,
        last_modified_ms: meta.last_modified.timestamp_millis(),
        e_tag: meta.e_tag.map(Arc::from),
    };
    let not_found = |reason: &str| ParquetError::NotFound {
        path: shown.to_string(),
        reason: reason.to_string(),
    };

    if is_glob(path) {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let literal = segments.iter().take_while(|s| !is_glob(s)).count();
        let prefix = object_path(root, segments[..literal].iter().copied());
        let pattern = &segments[literal..];
        let mut found = list(root, shown, &prefix, metrics).await?;
        found.retain(|m| {
            let rel = relative_to(&prefix, &m.location);
            let rel_parts: Vec<&str> = rel.split('/').collect();
            glob_match_segments(pattern, &rel_parts) && !is_hidden(&rel)
        });
        if found.is_empty() {
            return Err(not_found("the glob matched no files"));
        }
        found.sort_by(|a, b| a.location.cmp(&b.location));
        return Ok(found.into_iter().map(|m| entry(m, Some(&prefix))).collect());
    }

    let location = object_path(root, path.split('/').filter(|s| !s.is_empty()));
    // A file, or a directory (a prefix)? Locally a HEAD answers at once. On an object store
    // each question is a round trip, so the HEAD and the LIST go out together (one round
    // trip before the first footer instead of two; the LIST of a file's name as a prefix
    // finds nothing and costs one request), and a path ending in '/' is only listed.
    let named_a_prefix = root.local.is_none() && shown.ends_with('/');
    let head = async {
        if named_a_prefix {
            return None;
        }
        metrics.record_head();
        Some(root.store.head(&location).await)
    };
    let (head, listed) = if root.local.is_some() {
        (head.await, None)
    } else {
        let (head, listed) = futures::join!(head, list(root, shown, &location, metrics));
        (head, Some(listed))
    };
    match head {
        Some(Ok(meta)) => return Ok(vec![entry(meta, None)]),
        Some(Err(object_store::Error::NotFound { .. })) | None => {}
        // Local directories answer HEAD with an error other than NotFound on some platforms.
        Some(Err(err)) if !is_directory_error(&err) => {
            return Err(ParquetError::from_store(shown.to_string(), err))
        }
        Some(Err(_)) => {}
    }
    let mut found = match listed {
        Some(listed) => listed?,
        None => list(root, shown, &location, metrics).await?,
    };
    found.retain(|m| !is_hidden(&relative_to(&location, &m.location)));
    if found.is_empty() {
        let empty_dir =
            root.local.is_some() && std::path::Path::new(&format!("/{location}")).is_dir();
        return Err(not_found(if empty_dir {
            "an empty directory: no files under it (names starting with '_' or '.' are not read)"
        } else {
            "no such file, and no files under it as a directory"
        }));
    }
    if let Some(extensions) = extensions {
        let listed = found.len();
        let example = found[0].location.filename().unwrap_or_default().to_string();
        found.retain(|m| {
            let name = m
                .location
                .filename()
                .unwrap_or_default()
                .to_ascii_lowercase();
            extensions.iter().any(|e| name.ends_with(e.as_str()))
        });
        if found.is_empty() {
            return Err(not_found(&format!(
                "the directory holds {listed} file(s), none named *{} (e.g. {example}); name \
                 the Parquet files so, pass file_extensions=None to read every file, or name \
                 the files (or a glob) explicitly",
                extensions.join(", *")
            )));
        }
    }
    found.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(found
        .into_iter()
        .map(|m| entry(m, Some(&location)))
        .collect())
}

fn is_directory_error(err: &object_store::Error) -> bool {
    let text = err.to_string().to_lowercase();
    text.contains("is a directory") || text.contains("directory")
}

async fn list(
    root: &StoreRoot,
    shown: &str,
    prefix: &Path,
    metrics: &IoMetrics,
) -> Result<Vec<object_store::ObjectMeta>> {
    metrics.record_list();
    let prefix_opt = if prefix.as_ref().is_empty() {
        None
    } else {
        Some(prefix)
    };
    match root.store.list(prefix_opt).try_collect::<Vec<_>>().await {
        Ok(v) => Ok(v),
        Err(object_store::Error::NotFound { .. }) => Ok(Vec::new()),
        Err(e) => Err(ParquetError::from_store(shown.to_string(), e)),
    }
}

fn relative_to(prefix: &Path, location: &Path) -> String {
    let p = prefix.as_ref();
    let l = location.as_ref();
    if p.is_empty() {
        return l.to_string();
    }
    l.strip_prefix(p)
        .map(|r| r.trim_start_matches('/').to_string())
        .unwrap_or_else(|| l.to_string())
}

/// Match path segments against glob segments; `**` matches any number of segments.
fn glob_match_segments(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => {
            (0..=path.len()).any(|skip| glob_match_segments(rest, &path[skip..]))
        }
        Some((first, rest)) => match path.split_first() {
            Some((p, prest)) => {
                glob_match_one(first.as_bytes(), p.as_bytes()) && glob_match_segments(rest, prest)
            }
            None => false,
        },
    }
}

/// Match one segment: `*` any run, `?` one byte, `[abc]`, `[a-z]`, `[!x]` a class.
fn glob_match_one(pat: &[u8], text: &[u8]) -> bool {
    match pat.first() {
        None => text.is_empty(),
        Some(b'*') => (0..=text.len()).any(|i| glob_match_one(&pat[1..], &text[i..])),
        Some(b'?') => !text.is_empty() && glob_match_one(&pat[1..], &text[1..]),
        Some(b'[') => {
            let Some(close) = pat.iter().skip(1).position(|&c| c == b']').map(|i| i + 1) else {
                return text.first() == Some(&b'[') && glob_match_one(&pat[1..], &text[1..]);
            };
            let Some(&c) = text.first() else { return false };
            let mut class = &pat[1..close];
            let negate = matches!(class.first(), Some(b'!') | Some(b'^'));
            if negate {
                class = &class[1..];
            }
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == b'-' {
                    hit |= class[i] <= c && c <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == c;
                    i += 1;
                }
            }
            hit != negate && glob_match_one(&pat[close + 1..], &text[1..])
        }
        Some(&ch) => text.first() == Some(&ch) && glob_match_one(&pat[1..], &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, t: &str) -> bool {
        let ps: Vec<&str> = p.split('/').collect();
        let ts: Vec<&str> = t.split('/').collect();
        glob_match_segments(&ps, &ts)
    }

    /// A host's local store is read like a local path (positioned reads); the same store as
    /// a plain `dyn ObjectStore` goes through object_store.
    #[test]
    fn a_local_store_given_by_a_host_reads_its_files_directly() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/a.parquet"), b"x").unwrap();
        let store =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let resolved = |source: DatasetSource| {
            let metrics = IoMetrics::default();
            forebay_io::block_on(async move { resolve(&source, None, &metrics).await }).unwrap()
        };
        let local = resolved(DatasetSource::LocalStore {
            store: store.clone(),
            display_prefix: "/data/".into(),
            paths: vec!["d/".into()],
        });
        assert_eq!(local[0].uri(), "/data/d/a.parquet");
        assert_eq!(
            local[0].local_path.as_deref(),
            Some(
                dir.path()
                    .join("d/a.parquet")
                    .canonicalize()
                    .unwrap()
                    .as_path()
            )
        );
        let plain = resolved(DatasetSource::Store {
            store,
            display_prefix: "/data/".into(),
            paths: vec!["d/".into()],
        });
        assert!(plain[0].local_path.is_none());
    }

    #[test]
    fn glob_semantics() {
        assert!(m("*.parquet", "a.parquet"));
        assert!(!m("*.parquet", "dir/a.parquet"));
        assert!(m("**/*.parquet", "dir/a.parquet"));
        assert!(m("**/*.parquet", "a.parquet"));
        assert!(m("part-?.parquet", "part-1.parquet"));
        assert!(!m("part-?.parquet", "part-10.parquet"));
        assert!(m("part-[0-3].parquet", "part-2.parquet"));
        assert!(!m("part-[!0-3].parquet", "part-2.parquet"));
        assert!(m("shard=*/part-*", "shard=3/part-x.parquet"));
    }

    /// On an object store a path is asked about with a HEAD and a LIST at once; a path
    /// ending in '/' only with the LIST; a list of paths keeps its order.
    #[test]
    fn remote_paths_resolve_to_files_a_prefix_or_an_ordered_list() {
        let base = "memory://resolve-test";
        for name in ["d/b.parquet", "d/a.parquet", "d/_SUCCESS", "f.parquet"] {
            put_memory_object(&format!("{base}/{name}"), b"x".to_vec()).unwrap();
        }
        let resolved = |uris: &[&str]| {
            let metrics = IoMetrics::default();
            let source = DatasetSource::uris(uris.iter().map(|u| format!("{base}/{u}")));
            let files = forebay_io::block_on(async move {
                let files = resolve(&source, None, &metrics).await;
                (files, metrics.snapshot())
            });
            let (files, io) = files;
            let names: Vec<String> = files
                .unwrap()
                .iter()
                .map(|f| f.uri.trim_start_matches(base).to_string())
                .collect();
            (names, io.head_requests, io.list_requests)
        };
        assert_eq!(resolved(&["f.parquet"]), (vec!["/f.parquet".into()], 1, 1));
        let listed = vec!["/d/a.parquet".to_string(), "/d/b.parquet".to_string()];
        assert_eq!(resolved(&["d"]), (listed.clone(), 1, 1));
        assert_eq!(resolved(&["d/"]), (listed, 0, 1));
        let many: Vec<String> = (0..40).map(|k| format!("m/{k:02}.parquet")).collect();
        for name in &many {
            put_memory_object(&format!("{base}/{name}"), b"x".to_vec()).unwrap();
        }
        let mut order: Vec<&str> = many.iter().map(String::as_str).collect();
        order.reverse();
        let (names, heads, _) = resolved(&order);
        assert_eq!(
            names,
            order.iter().map(|n| format!("/{n}")).collect::<Vec<_>>()
        );
        assert_eq!(heads, 40);
        let source = DatasetSource::uris([format!("{base}/nothing-here")]);
        let missing = forebay_io::block_on(async move {
            resolve(&source, None, &IoMetrics::default())
                .await
                .map(|f| f.len())
        });
        assert!(
            matches!(missing, Err(ParquetError::NotFound { .. })),
            "{missing:?}"
        );
    }

    #[test]
    fn hidden_names() {
        assert!(is_hidden("_SUCCESS"));
        assert!(is_hidden("a/.tmp-1.parquet"));
        assert!(!is_hidden("shard=1/part-0.parquet"));
    }
}
