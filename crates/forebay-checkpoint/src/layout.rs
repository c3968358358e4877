//! Where a checkpoint's files are and what they are called: the manifest, shard directories,
//! one-file parts and their key-value metadata, temp and part names.
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

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_schema::DataType;

use crate::error::{CheckpointError, Result};
use crate::fingerprint::IdFamily;
use crate::index::shard_bits_for;

/// Name of the manifest file at the root of a checkpoint written by forebay.
pub const MANIFEST_FILE: &str = "_forebay_checkpoint";
pub(crate) const FORMAT_VERSION: u32 = 1;
pub(crate) const HASH_NAME: &str = "xxh3-128-top100";

/// What a checkpoint directory says about itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Manifest {
    pub(crate) num_shards: usize,
    pub(crate) family: IdFamily,
    pub(crate) id_column: String,
    pub(crate) id_type: DataType,
}

impl Manifest {
    pub(crate) fn to_text(&self) -> String {
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

    pub(crate) fn parse(text: &str, shown: &str) -> Result<Manifest> {
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

/// The key-value metadata of a file of [`IdPartsWriter::one_file`](crate::IdPartsWriter::one_file): each row group's shard,
/// as a JSON list (`[0, 3, 5]`: row group 1 holds shard 3's ids), of [`NUM_SHARDS_KEY`]
/// shards.
pub const SHARDS_KEY: &str = "forebay.shards";
/// The key-value metadata of a file of [`IdPartsWriter::one_file`](crate::IdPartsWriter::one_file): the shard count its
/// [`SHARDS_KEY`] numbers shards by.
pub const NUM_SHARDS_KEY: &str = "forebay.num_shards";

pub(crate) fn parse_shard_dir(name: &str) -> Option<usize> {
    name.strip_prefix("shard=")?.parse().ok()
}

/// The shard a data file declares by its `shard=<k>` directory, if any.
pub(crate) fn declared_shard(file: &str) -> Option<usize> {
    file.rsplit('/').skip(1).find_map(parse_shard_dir)
}

pub(crate) fn unique_part_name() -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_files_shard_is_its_shard_directory() {
        assert_eq!(
            declared_shard("s3://b/ck/shard=12/part-1.parquet"),
            Some(12)
        );
        assert_eq!(declared_shard("/ck/part-1.parquet"), None);
    }
}
