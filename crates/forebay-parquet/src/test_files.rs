//! Parquet files for this crate's unit tests, written with the parquet crate's `ArrowWriter`
//! (the reference writer every decoder here must agree with).

use std::path::Path;

use arrow_array::RecordBatch;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};

/// `batch` as the bytes of a Parquet file written with `props`.
pub(crate) fn parquet_bytes(batch: &RecordBatch, props: WriterProperties) -> Bytes {
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
    Bytes::from(out)
}

/// `batch` written to the file `path` with `props`; returns the path as a string.
pub(crate) fn write_parquet_file(
    path: &Path,
    batch: &RecordBatch,
    props: WriterProperties,
) -> String {
    std::fs::write(path, parquet_bytes(batch, props)).unwrap();
    path.to_str().unwrap().to_string()
}

/// The footer of the Parquet file `bytes`.
pub(crate) fn metadata_of(bytes: &Bytes) -> ParquetMetaData {
    SerializedFileReader::new(bytes.clone())
        .unwrap()
        .metadata()
        .clone()
}
