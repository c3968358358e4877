//! Where a write may go: never over its own input, never mixed with its checkpoint.
//!
//! Checked before a write touches anything (before `mode="overwrite"` deletes, before a
//! checkpoint is recovered), because each of these loses or duplicates data:
//!
//! ```text
//!  output holds an input file          overwrite deletes the input before it is read;
//!                                      append mixes outputs into the input of the next run
//!  output inside an input directory    the next read_parquet of that directory (read
//!   (or a recursive glob's root)       recursively) takes the output for input
//!  checkpoint and output overlap       the checkpoint's id files become "rows" of the
//!                                      output (pyarrow reads them; forebay's read fails)
//!  checkpoint and input overlap        its id files become input of the next run
//! ```
//!
//! Locations are compared as places: a store (`file`, `s3://bucket`, ...) and path segments,
//! local paths made absolute with symlinks resolved, globs cut at their first wildcard.

use forebay_parquet::{DatasetSource, ParquetDataset};

use crate::error::{EngineError, Result};

/// A location reduced to what containment needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Place {
    /// `file` for local paths, else `scheme://authority` (`s3://bucket`).
    store: String,
    segments: Vec<String>,
}

fn has_wildcard(segment: &str) -> bool {
    segment.contains(['*', '?', '['])
}

impl Place {
    /// The place of a path or URI, and whether it held a recursive glob (`**`). A glob is
    /// cut at its first segment with a wildcard.
    fn of(location: &str) -> (Place, bool) {
        let (store, path) = match location.split_once("://") {
            Some(("file", rest)) => ("file".to_string(), rest.to_string()),
            Some((scheme, rest)) => {
                let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
                (
                    format!("{}://{authority}", scheme.to_ascii_lowercase()),
                    path.to_string(),
                )
            }
            None => ("file".to_string(), location.to_string()),
        };
        let recursive = path.split('/').any(|s| s.contains("**"));
        let literal: Vec<&str> = path.split('/').take_while(|s| !has_wildcard(s)).collect();
        let segments = if store == "file" {
            local_segments(&literal.join("/"))
        } else {
            literal
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| s.to_string())
                .collect()
        };
        (Place { store, segments }, recursive)
    }

    /// `other` is this place or lies under it.
    fn contains(&self, other: &Place) -> bool {
        self.store == other.store && other.segments.starts_with(&self.segments)
    }
}

/// An absolute local path's segments: `.`/`..` resolved lexically (as forebay-parquet
/// resolves the paths it reads), then symlinks resolved in the longest part of it that
/// exists (the rest may be created by the write).
fn local_segments(path: &str) -> Vec<String> {
    let absolute = std::path::absolute(if path.is_empty() { "/" } else { path })
        .unwrap_or_else(|_| std::path::PathBuf::from(path));
    let mut normal = std::path::PathBuf::from("/");
    for part in absolute.components() {
        match part {
            std::path::Component::Normal(s) => normal.push(s),
            std::path::Component::ParentDir => {
                normal.pop();
            }
            _ => {}
        }
    }
    let mut existing = normal.as_path();
    let mut rest = Vec::new();
    let resolved = loop {
        if let Ok(real) = existing.canonicalize() {
            break real;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => break existing.to_path_buf(),
        }
    };
    let mut full = resolved;
    for name in rest.into_iter().rev() {
        full.push(name);
    }
    full.components()
        .filter_map(|part| match part {
            std::path::Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect()
}

/// What a dataset reads: its files, and the directories (or recursive globs' roots) it
/// lists, where a file written later would be read too.
struct Inputs {
    files: Vec<(String, Place)>,
    /// `(shown, place, recursive)`: a directory is listed recursively; a plain glob only
    /// matches names directly in its root.
    roots: Vec<(String, Place, bool)>,
}

impl Inputs {
    fn of(dataset: &ParquetDataset) -> Inputs {
        let files: Vec<(String, Place)> = dataset
            .files()
            .iter()
            .map(|f| (f.uri().to_string(), Place::of(f.uri()).0))
            .collect();
        let given: Vec<String> = match dataset.source() {
            DatasetSource::Uris { uris, .. } => uris.clone(),
            DatasetSource::Store {
                display_prefix,
                paths,
                ..
            }
            | DatasetSource::LocalStore {
                display_prefix,
                paths,
                ..
            } => paths
                .iter()
                .map(|p| format!("{display_prefix}{}", p.trim_start_matches('/')))
                .collect(),
        };
        let roots = given
            .iter()
            .filter_map(|uri| {
                let (place, recursive_glob) = Place::of(uri);
                // A path naming one of the files is that file, not a directory.
                if files.iter().any(|(_, f)| *f == place) {
                    return None;
                }
                let glob = uri.split('/').any(has_wildcard);
                Some((uri.clone(), place, recursive_glob || !glob))
            })
            .collect();
        Inputs { files, roots }
    }

    /// Why `place` (the output or the checkpoint, called `what`) would take part in the
    /// input, if it would.
    fn overlap(&self, what: &str, shown: &str, place: &Place, deletes: bool) -> Option<String> {
        // Rows an output set aside may be read back into it (a retry of its dead letters):
        // a write puts nothing there but new dead letters under new names, and a reader of
        // the output skips `_` directories.
        let dead_letter = |f: &Place| {
            what == "output"
                && !deletes
                && f.segments.get(place.segments.len()).map(String::as_str)
                    == Some(crate::dead_letter::DEAD_LETTER_DIR)
        };
        if let Some((file, _)) = self
            .files
            .iter()
            .find(|(_, f)| place.contains(f) && !dead_letter(f))
        {
            let consequence = if deletes {
                "mode='overwrite' would delete it before it is read"
            } else {
                "what is written there would be read as input by the next run of this job"
            };
            return Some(format!(
                "the {what} {shown} holds this dataset's own input file {file}: {consequence}; \
                 write the {what} somewhere else"
            ));
        }
        for (root, root_place, recursive) in &self.roots {
            let inside = if *recursive {
                root_place.contains(place)
            } else {
                root_place == place
            };
            if inside {
                return Some(format!(
                    "the {what} {shown} is inside the input directory {root}, which \
                     read_parquet lists{}: the next read of it would take the {what}'s files \
                     for input; write the {what} somewhere else",
                    if *recursive { " recursively" } else { "" }
                ));
            }
        }
        None
    }
}

/// Refuse a write to `output` (with `checkpoint`) that would overlap the dataset's input, or
/// a checkpoint that overlaps the output. `deletes`: the write deletes existing files of
/// the output first (`mode="overwrite"`).
pub(crate) fn check_write_locations(
    dataset: &ParquetDataset,
    output: &str,
    checkpoint: Option<&str>,
    deletes: bool,
) -> Result<()> {
    let inputs = Inputs::of(dataset);
    let refuse = |path: &str, reason: String| {
        Err(EngineError::Write {
            stage: "write_parquet".into(),
            path: path.to_string(),
            reason,
            source: None,
        })
    };
    let (out, _) = Place::of(output);
    if let Some(reason) = inputs.overlap("output", output, &out, deletes) {
        return refuse(output, reason);
    }
    let Some(checkpoint) = checkpoint else {
        return Ok(());
    };
    let (ckpt, _) = Place::of(checkpoint);
    if out.contains(&ckpt) || ckpt.contains(&out) {
        return refuse(
            checkpoint,
            format!(
                "the checkpoint {checkpoint} and the output {output} overlap: the checkpoint's \
                 id files would show up as rows of the output (and the output's files as ids); \
                 give the checkpoint a directory of its own, beside the output"
            ),
        );
    }
    if let Some(reason) = inputs.overlap("checkpoint", checkpoint, &ckpt, false) {
        return refuse(checkpoint, reason);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(s: &str) -> Place {
        Place::of(s).0
    }

    #[test]
    fn places_compare_by_store_and_whole_segments() {
        assert!(place("s3://b/data").contains(&place("s3://b/data/x.parquet")));
        assert!(place("s3://b/data/").contains(&place("s3://b/data")));
        assert!(!place("s3://b/data").contains(&place("s3://b/data2/x.parquet")));
        assert!(!place("s3://b/data").contains(&place("s3://other/data/x")));
        assert!(!place("s3://b/data").contains(&place("gs://b/data/x")));
        assert!(place("S3://b/data").contains(&place("s3://b/data/x")));
        assert!(place("/tmp/a/./b/../b").contains(&place("file:///tmp/a/b/c")));
        assert!(place("s3://b/data/*.parquet") == place("s3://b/data"));
        assert!(Place::of("s3://b/data/**/*.parquet").1);
    }

    #[test]
    fn a_symlink_is_the_place_it_points_to() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let inside = format!("{}/new/out", link.display());
        assert!(place(real.to_str().unwrap()).contains(&place(&inside)));
    }
}
