//! Output file formats: how batches become the bytes of one file. The seam where a new output
//! format goes.
//!
//! ```text
//!  writer (files, commits) ──► FileFormat::open(schema, FileSink) ──► FormatWriter
//!                                                                      write(batch) ...
//!                                                                      memory()  (charged to the pool)
//!                                                                      finish() ──► FileSink
//!  FileSink: local file (fsync, rename by the writer) or object-store upload (completed)
//! ```
//!
//! The writer (`writer` module) owns everything around a file: its name (`part-...` plus
//! [`FileFormat::extension`]), the temporary name and the rename, the upload, staging for a
//! commit, the memory reservation, cleanup of a failed file. A format only encodes: it
//! writes into the [`FileSink`] it is given and hands it back, complete, from
//! [`FormatWriter::finish`]. [`ParquetFormat`] is the first implementation; a new format (CSV,
//! JSON lines, Arrow IPC, Lance) is one more implementation here plus a way to choose it.

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::pin::Pin;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

/// An error of a format while encoding (its message is shown with the file's path).
pub type FormatError = Box<dyn std::error::Error + Send + Sync>;

/// A file format the writer can produce.
pub trait FileFormat: Send + Sync + fmt::Debug {
    /// The file name extension of this format's files, without the dot (`"parquet"`): the
    /// writer names files with it, and `mode="overwrite"`/`"error"` look for files that end
    /// with it.
    fn extension(&self) -> &str;

    /// Start a file of batches of `schema` that writes into `sink`.
    fn open(&self, schema: SchemaRef, sink: FileSink)
        -> Result<Box<dyn FormatWriter>, FormatError>;
}

/// One file being encoded.
pub trait FormatWriter: Send {
    /// Encode `batch` (of the schema the file was opened with).
    fn write(&mut self, batch: &RecordBatch) -> Result<(), FormatError>;

    /// Bytes held in memory for the file (encoded data not yet in the sink, buffers): the
    /// writer reserves them in the memory pool.
    fn memory(&self) -> usize;

    /// Write what remains (a footer) and give the sink back with every byte in it.
    fn finish(self: Box<Self>) -> Result<FileSink, FormatError>;
}

/// Bytes buffered before they are handed to an upload: object_store's upload takes `Bytes`
/// chunks, and a format writes many small slices (page headers).
const UPLOAD_CHUNK: usize = 1 << 20;
/// Part size of multipart uploads (object_store's BufWriter default).
const UPLOAD_PART: usize = 10 << 20;

/// Where a format's bytes go: a local file (the writer syncs and renames it) or an
/// object-store upload (the object appears when [`FileSink::complete`] completes it).
pub struct FileSink {
    kind: SinkKind,
    written: u64,
}

enum SinkKind {
    Local(BufWriter<File>),
    Remote {
        /// `None` once completed or aborted. (Boxed: it is 7 times the size of a local
        /// sink.)
        upload: Option<Box<object_store::buffered::BufWriter>>,
        chunk: Vec<u8>,
    },
}

impl FileSink {
    pub(crate) fn local(file: File) -> FileSink {
        FileSink {
            kind: SinkKind::Local(BufWriter::new(file)),
            written: 0,
        }
    }

    pub(crate) fn upload(store: Arc<dyn ObjectStore>, location: ObjectPath) -> FileSink {
        FileSink {
            kind: SinkKind::Remote {
                upload: Some(Box::new(object_store::buffered::BufWriter::new(
                    store, location,
                ))),
                chunk: Vec::with_capacity(UPLOAD_CHUNK),
            },
            written: 0,
        }
    }

    /// Bytes the sink itself holds in memory at most (an upload's chunk and part buffers).
    pub(crate) fn memory(&self) -> usize {
        match &self.kind {
            SinkKind::Local(_) => 0,
            SinkKind::Remote { .. } => UPLOAD_CHUNK + UPLOAD_PART,
        }
    }

    /// Bytes written into the sink.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Finish the file: a local file flushed and `fsync`ed (the writer renames it); an
    /// upload completed (the object appears now).
    pub(crate) fn complete(mut self) -> std::io::Result<()> {
        match &mut self.kind {
            SinkKind::Local(out) => {
                out.flush()?;
                out.get_ref().sync_all()
            }
            SinkKind::Remote { upload, chunk } => {
                let chunk = std::mem::take(chunk);
                let mut upload = upload.take().expect("an upload is completed once");
                forebay_io::block_on(async move {
                    if !chunk.is_empty() {
                        if let Err(e) = upload.put(Bytes::from(chunk)).await {
                            // No parts of a failed upload stay behind.
                            let _ = upload.abort().await;
                            return Err(e.into());
                        }
                    }
                    // Once shut down, object_store's writer cannot be aborted (it panics):
                    // a failed single put left nothing; the parts of a multipart upload
                    // whose completion failed are the store's to expire.
                    let mut pinned = Pin::new(&mut *upload);
                    futures::future::poll_fn(|cx| {
                        tokio::io::AsyncWrite::poll_shutdown(pinned.as_mut(), cx)
                    })
                    .await
                })
            }
        }
    }
}

impl Write for FileSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = match &mut self.kind {
            SinkKind::Local(out) => out.write(buf)?,
            SinkKind::Remote { upload, chunk } => {
                chunk.extend_from_slice(buf);
                if chunk.len() >= UPLOAD_CHUNK {
                    let full =
                        Bytes::from(std::mem::replace(chunk, Vec::with_capacity(UPLOAD_CHUNK)));
                    let mut taken = upload.take().expect("written before it is completed");
                    let (taken, put) = forebay_io::block_on(async move {
                        let put = taken.put(full).await;
                        (taken, put)
                    });
                    *upload = Some(taken);
                    put.map_err(std::io::Error::other)?;
                }
                buf.len()
            }
        };
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.kind {
            SinkKind::Local(out) => out.flush(),
            // Bytes reach the store when a chunk fills and at `complete`.
            SinkKind::Remote { .. } => Ok(()),
        }
    }
}

impl Drop for FileSink {
    /// An upload never completed (an error, a cancellation) is aborted, so that no parts of
    /// it stay behind in the store. A local file is removed by the writer, which knows its
    /// name.
    fn drop(&mut self) {
        if let SinkKind::Remote { upload, .. } = &mut self.kind {
            if let Some(mut upload) = upload.take() {
                forebay_io::block_on(async move {
                    let _ = upload.abort().await;
                });
            }
        }
    }
}

/// Rows per row group when not set.
pub const DEFAULT_ROW_GROUP_ROWS: usize = 128 * 1024;
/// Bytes a row group may take while it is encoded in memory before it is flushed.
const ROW_GROUP_BYTES: usize = 64 << 20;

/// Parquet files, through the parquet crate's `ArrowWriter`.
#[derive(Debug, Clone)]
pub struct ParquetFormat {
    pub compression: Compression,
    pub row_group_rows: usize,
    /// Columns written without dictionary encoding (nearly all values distinct).
    pub unique_columns: Vec<String>,
}

impl ParquetFormat {
    fn properties(&self) -> WriterProperties {
        let builder = WriterProperties::builder()
            .set_compression(self.compression)
            .set_max_row_group_row_count(Some(self.row_group_rows))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES));
        self.unique_columns
            .iter()
            .fold(builder, |b, column| {
                b.set_column_dictionary_enabled(ColumnPath::from(column.as_str()), false)
            })
            .build()
    }
}

impl FileFormat for ParquetFormat {
    fn extension(&self) -> &str {
        "parquet"
    }

    fn open(
        &self,
        schema: SchemaRef,
        sink: FileSink,
    ) -> Result<Box<dyn FormatWriter>, FormatError> {
        Ok(Box::new(ArrowWriter::try_new(
            sink,
            schema,
            Some(self.properties()),
        )?))
    }
}

impl FormatWriter for ArrowWriter<FileSink> {
    fn write(&mut self, batch: &RecordBatch) -> Result<(), FormatError> {
        Ok(ArrowWriter::write(self, batch)?)
    }

    fn memory(&self) -> usize {
        self.memory_size() + self.inner().memory()
    }

    fn finish(self: Box<Self>) -> Result<FileSink, FormatError> {
        Ok(self.into_inner()?)
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};
    use object_store::ObjectStoreExt;

    use super::*;

    fn batch(rows: i64) -> RecordBatch {
        RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..rows)) as arrow_array::ArrayRef,
            ),
            (
                "text",
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("row {i} {}", "x".repeat(40))),
                )),
            ),
        ])
        .unwrap()
    }

    fn object(store: &Arc<dyn ObjectStore>, path: &str) -> Option<Bytes> {
        let (store, path) = (store.clone(), ObjectPath::from(path));
        forebay_io::block_on(async move {
            match store.get(&path).await {
                Ok(got) => Some(got.bytes().await.unwrap()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => panic!("{e}"),
            }
        })
    }

    #[test]
    fn a_parquet_file_uploaded_in_chunks_reads_back_whole_and_a_dropped_one_leaves_nothing() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let format = ParquetFormat {
            compression: Compression::UNCOMPRESSED,
            row_group_rows: 10_000,
            unique_columns: vec!["id".into()],
        };
        assert_eq!(format.extension(), "parquet");
        // ~3 MB: several chunks of the sink, and more than one multipart part is not
        // needed for the chunking to be exercised.
        let data = batch(50_000);
        let sink = FileSink::upload(store.clone(), ObjectPath::from("out/part-0.parquet"));
        let mut writer = format.open(data.schema(), sink).unwrap();
        writer.write(&data).unwrap();
        assert!(writer.memory() >= UPLOAD_CHUNK + UPLOAD_PART);
        let sink = writer.finish().unwrap();
        let written = sink.bytes_written();
        assert!(written > 2 * UPLOAD_CHUNK as u64, "{written}");
        assert!(
            object(&store, "out/part-0.parquet").is_none(),
            "not before completion"
        );
        sink.complete().unwrap();
        let bytes = object(&store, "out/part-0.parquet").expect("completed");
        assert_eq!(bytes.len() as u64, written);
        let read: Vec<RecordBatch> =
            parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(bytes, 8192)
                .unwrap()
                .map(Result::unwrap)
                .collect();
        let read = arrow_select::concat::concat_batches(&data.schema(), &read).unwrap();
        assert_eq!(read, data);

        // An upload dropped before it completes (an error, a cancellation) is aborted.
        let sink = FileSink::upload(store.clone(), ObjectPath::from("out/part-1.parquet"));
        let mut writer = format.open(data.schema(), sink).unwrap();
        writer.write(&data).unwrap();
        drop(writer);
        assert!(object(&store, "out/part-1.parquet").is_none());
    }
}
