//! Repairs of footers that known writers got wrong, so that forebay reads these files the
//! way pyarrow (parquet-cpp) does instead of refusing them or returning nothing.
//!
//! ```text
//!  footer bytes ──decode──► ParquetMetaData ──repair_metadata──► metadata the reader uses
//!       │ decoder refuses a field                │ dictionary_page_offset 0 → unset
//!       ▼                                        │ file num_rows 0 → Σ row groups
//!  compact::drop_mistyped_fields ──decode──►─────┘ parquet-mr ≤ 1.2.8: chunks measured
//! ```
//!
//! | symptom in arrow-rs 60 | writer | repair | upstream fix |
//! |---|---|---|---|
//! | footer refused: a `ColumnMetaData` field id carries another wire type (Dremio's parquet-mr fork put a list in field 15, `bloom_filter_length`) | parquet-mr 1.12 (Dremio) | drop fields whose wire type is not the spec's ([`compact`]) | the thrift decoder should skip such a field, as Thrift's generated readers do |
//! | `dictionary_page_offset = 0`: the chunk is read from byte 0 (the magic) | parquet-mr 1.8 and Dremio | offsets outside `(0, data_page_offset)` are ignored | `ColumnChunkMetaData::byte_range` should ignore an offset that is not before the data pages |
//! | file `num_rows = 0` while row groups hold rows: every batch has 0 rows | parquet-rs 0.3 | `num_rows` = Σ row groups | the arrow reader should not clamp the batch size to the file's `num_rows` |
//! | "Invalid page header" at the end of a chunk: the chunk size excludes the dictionary page header (PARQUET-816, IMPALA-694) | parquet-mr ≤ 1.2.8 | [`measure_short_chunks`]: walk the chunk's page headers to its real end | read until the chunk's values are complete, not until its declared size (parquet-cpp pads the read by 100 bytes and stops at the last value) |
//!
//! Every repair only widens what is read or replaces a value the reader cannot use; a file
//! that is still inconsistent fails later with a clear error (the scan checks each row
//! group's decoded row count).

pub(crate) mod compact;

use parquet::file::metadata::{
    ColumnChunkMetaData, FileMetaData, ParquetMetaData, ParquetMetaDataBuilder, RowGroupMetaData,
};

use crate::error::ParquetError;
use crate::io::ObjectFileReader;

/// The most bytes a dictionary page header can take (parquet-mr ≤ 1.2.8 left it out of the
/// column chunk's size).
const MAX_DICTIONARY_HEADER: u64 = 100;

/// Apply the repairs this file needs (usually none: the metadata is returned unchanged).
pub(crate) fn repair_metadata(metadata: ParquetMetaData) -> Result<ParquetMetaData, String> {
    let file_meta = metadata.file_metadata();
    let declared_rows: i64 = metadata.row_groups().iter().map(|rg| rg.num_rows()).sum();
    let fix_rows = file_meta.num_rows() != declared_rows
        && metadata.row_groups().iter().all(|rg| rg.num_rows() >= 0);
    let fix_chunks = metadata
        .row_groups()
        .iter()
        .flat_map(|rg| rg.columns())
        .any(|c| unusable_dictionary_offset(c).is_some());
    if !fix_rows && !fix_chunks {
        return Ok(metadata);
    }

    let file_meta = if fix_rows {
        FileMetaData::new(
            file_meta.version(),
            declared_rows,
            file_meta.created_by().map(str::to_string),
            file_meta.key_value_metadata().cloned(),
            file_meta.schema_descr_ptr(),
            file_meta.column_orders().cloned(),
        )
    } else {
        file_meta.clone()
    };
    let mut builder = ParquetMetaDataBuilder::new_from_metadata(metadata);
    let mut row_groups = builder.take_row_groups();
    let page_index = builder.take_page_index();
    if fix_chunks {
        row_groups = row_groups
            .into_iter()
            .map(|rg| map_chunks(rg, forget_unusable_dictionary_offset))
            .collect::<Result<_, _>>()?;
    }
    Ok(ParquetMetaDataBuilder::new(file_meta)
        .set_row_groups(row_groups)
        .set_page_index(page_index)
        .build())
}

fn map_chunks(
    rg: RowGroupMetaData,
    mut repair: impl FnMut(ColumnChunkMetaData) -> Result<ColumnChunkMetaData, String>,
) -> Result<RowGroupMetaData, String> {
    let columns = rg
        .columns()
        .iter()
        .map(|c| repair(c.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    rg.into_builder()
        .set_column_metadata(columns)
        .build()
        .map_err(|e| e.to_string())
}

fn forget_unusable_dictionary_offset(
    chunk: ColumnChunkMetaData,
) -> Result<ColumnChunkMetaData, String> {
    if unusable_dictionary_offset(&chunk).is_none() {
        return Ok(chunk);
    }
    chunk
        .into_builder()
        .set_dictionary_page_offset(None)
        .build()
        .map_err(|e| e.to_string())
}

/// For files of parquet-mr ≤ 1.2.8 (see [`writes_short_chunk_sizes`]): give each column chunk
/// its real size, found by walking its page headers from its start until its values are
/// complete (reading up to [`MAX_DICTIONARY_HEADER`] bytes past the declared end). A chunk
/// whose pages cannot be walked keeps its declared size; reading it then fails with the
/// decoder's error. Costs one extra read of each chunk, only for these old files.
pub(crate) async fn measure_short_chunks(
    metadata: ParquetMetaData,
    reader: &ObjectFileReader,
    file_size: u64,
    path: &str,
) -> Result<ParquetMetaData, ParquetError> {
    if !writes_short_chunk_sizes(metadata.file_metadata().created_by()) {
        return Ok(metadata);
    }
    let mut measured: Vec<Vec<Option<i64>>> = Vec::new();
    for rg in metadata.row_groups() {
        let mut sizes = Vec::new();
        for chunk in rg.columns() {
            let (start, declared) = chunk.byte_range();
            let end = (start + declared + MAX_DICTIONARY_HEADER).min(file_size);
            let bytes = reader.fetch(start..end).await?;
            sizes.push(chunk_length(&bytes, chunk.num_values()).map(|n| n as i64));
        }
        measured.push(sizes);
    }
    let mut builder = ParquetMetaDataBuilder::new_from_metadata(metadata);
    let row_groups = builder
        .take_row_groups()
        .into_iter()
        .zip(measured)
        .map(|(rg, sizes)| {
            let mut sizes = sizes.into_iter();
            map_chunks(rg, |chunk| match sizes.next().flatten() {
                Some(len) if len != chunk.compressed_size() => chunk
                    .into_builder()
                    .set_total_compressed_size(len)
                    .build()
                    .map_err(|e| e.to_string()),
                _ => Ok(chunk),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|reason| ParquetError::Corrupt {
            path: path.to_string(),
            row_group: None,
            reason,
            source: None,
        })?;
    Ok(builder.set_row_groups(row_groups).build())
}

/// Bytes from a chunk's start to the end of the page that completes its `num_values`.
fn chunk_length(bytes: &[u8], num_values: i64) -> Option<usize> {
    let (mut pos, mut values) = (0usize, 0i64);
    while values < num_values {
        let page = compact::read_page_header(bytes.get(pos..)?)?;
        pos = pos
            .checked_add(page.header_len)?
            .checked_add(page.compressed_page_size as usize)?;
        if pos > bytes.len() {
            return None;
        }
        values += page.num_values;
    }
    Some(pos)
}

/// A dictionary page offset the reader must not use: not positive, or not before the data
/// pages (the dictionary page comes first in a chunk). Returns it when unusable.
fn unusable_dictionary_offset(chunk: &ColumnChunkMetaData) -> Option<i64> {
    chunk
        .dictionary_page_offset()
        .filter(|&offset| offset <= 0 || offset >= chunk.data_page_offset())
}

/// Whether `created_by` names parquet-mr 1.2.8 or older (or parquet-mr without a version),
/// whose column chunk sizes leave out the dictionary page header.
fn writes_short_chunk_sizes(created_by: Option<&str>) -> bool {
    let Some(created_by) = created_by else {
        return false;
    };
    let mut words = created_by.split_whitespace();
    if words.next() != Some("parquet-mr") {
        return false;
    }
    let version = match (words.next(), words.next()) {
        (Some("version"), Some(v)) => v,
        _ => return true, // "parquet-mr" alone: written before versions were recorded
    };
    let numbers: Vec<u64> = version
        .split(['.', '-'])
        .take(3)
        .map_while(|part| part.parse().ok())
        .collect();
    match numbers.as_slice() {
        [major, minor, patch] => (*major, *minor, *patch) < (1, 2, 9),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::writes_short_chunk_sizes;

    #[test]
    fn parquet_mr_versions_before_the_fix_are_padded() {
        assert!(writes_short_chunk_sizes(Some("parquet-mr")));
        assert!(writes_short_chunk_sizes(Some(
            "parquet-mr version 1.2.8 (build x)"
        )));
        assert!(!writes_short_chunk_sizes(Some(
            "parquet-mr version 1.2.9 (build x)"
        )));
        assert!(!writes_short_chunk_sizes(Some(
            "parquet-mr version 1.12.0-2018 (build x)"
        )));
        assert!(!writes_short_chunk_sizes(Some(
            "parquet-cpp-arrow version 15.0.0"
        )));
        assert!(!writes_short_chunk_sizes(None));
    }
}
