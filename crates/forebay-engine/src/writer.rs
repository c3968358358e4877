//! The Parquet sink: batches to files, each published atomically under its final name.
//!
//! ```text
//!  queue ──► writer worker(s) ──ArrowWriter──► local: <dir>/.<name>.tmp ─fsync─rename─fsync(dir)─► <dir>/<name>
//!                 │ roll over at rows_per_file     remote: multipart upload ─complete─► s3://bucket/dir/<name>
//!                 └─ the row group being encoded is reserved in the pool (no hidden buffer)
//! ```
//!
//! A reader of the output directory never sees a partial file: locally the temporary name
//! starts with `.` (readers, forebay's and pyarrow's, skip such names) and becomes final by
//! `rename`; on object stores the object appears only when its upload completes. A failed
//! or cancelled file is removed (locally) or its upload aborted.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use forebay_parquet::StorageOptions;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::{ArrowWriter, AsyncArrowWriter};
use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::batch::EngineBatch;
use crate::error::{EngineError, Result};
use crate::events::PipelineEvent;
use crate::memory::{Admission, MemoryConsumer, Reservation};
use crate::queue::BatchQueue;
use crate::resources::RunResources;

const STAGE: &str = "write_parquet";
/// Rows per file when `rows_per_file` is not set.
pub const DEFAULT_ROWS_PER_FILE: usize = 1 << 20;
/// Bytes a row group may take while it is encoded in memory before it is flushed.
const ROW_GROUP_BYTES: usize = 64 << 20;
/// Part size of multipart uploads (object_store's BufWriter default).
const UPLOAD_PART: usize = 10 << 20;

/// What to do with data files already in the output directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Add new files next to them (new, unique names).
    Append,
    /// Delete the directory's data files (`*.parquet` not starting with `.` or `_`) first.
    Overwrite,
    /// Fail if the directory holds data files.
    ErrorIfExists,
}

/// Where and how to write Parquet files. Build with [`ParquetSink::new`].
#[derive(Debug, Clone)]
pub struct ParquetSink {
    pub(crate) root: String,
    pub(crate) storage_options: StorageOptions,
    pub(crate) compression: Compression,
    pub(crate) rows_per_file: usize,
    pub(crate) row_group_rows: usize,
    pub(crate) concurrency: usize,
    pub(crate) mode: WriteMode,
}

impl ParquetSink {
    /// Write into the directory `root` (a local path or a URI: `s3://bucket/out/`).
    pub fn new(root: impl Into<String>) -> ParquetSink {
        ParquetSink {
            root: root.into(),
            storage_options: StorageOptions::new(),
            compression: Compression::ZSTD(ZstdLevel::default()),
            rows_per_file: DEFAULT_ROWS_PER_FILE,
            row_group_rows: 128 * 1024,
            concurrency: 1,
            mode: WriteMode::Append,
        }
    }

    pub fn with_storage_options(mut self, options: StorageOptions) -> Self {
        self.storage_options = options;
        self
    }

    /// `"zstd"` (default), `"snappy"`, `"gzip"`, `"lz4"`, `"brotli"` or `"none"`.
    pub fn with_compression(mut self, name: &str) -> Result<Self> {
        self.compression = match name.to_ascii_lowercase().as_str() {
            "zstd" => Compression::ZSTD(ZstdLevel::default()),
            "snappy" => Compression::SNAPPY,
            "gzip" => Compression::GZIP(GzipLevel::default()),
            "lz4" => Compression::LZ4_RAW,
            "brotli" => Compression::BROTLI(BrotliLevel::default()),
            "none" | "uncompressed" => Compression::UNCOMPRESSED,
            other => {
                return Err(EngineError::InvalidArgument(format!(
                    "compression {other:?} is not one of zstd, snappy, gzip, lz4, brotli, none"
                )))
            }
        };
        Ok(self)
    }

    /// Start a new file after this many rows (default [`DEFAULT_ROWS_PER_FILE`]).
    pub fn with_rows_per_file(mut self, rows: usize) -> Self {
        self.rows_per_file = rows.max(1);
        self
    }

    /// Rows per row group (default 131,072; a row group is also cut at 64 MiB).
    pub fn with_row_group_rows(mut self, rows: usize) -> Self {
        self.row_group_rows = rows.max(1);
        self
    }

    /// Files written at once (each worker writes its own files; default 1).
    pub fn with_concurrency(mut self, workers: usize) -> Self {
        self.concurrency = workers.max(1);
        self
    }

    pub fn with_mode(mut self, mode: WriteMode) -> Self {
        self.mode = mode;
        self
    }
}

/// One published file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
}

/// What a write did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteStats {
    pub rows: u64,
    pub files: Vec<WrittenFile>,
    pub bytes: u64,
    pub seconds: f64,
}

/// The output directory, opened once for the run.
pub(crate) struct OutputTarget {
    sink: ParquetSink,
    location: Location,
    run_id: String,
    next_file: AtomicU64,
    pub(crate) written: Mutex<Vec<WrittenFile>>,
}

enum Location {
    Local(PathBuf),
    Remote {
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        shown: String,
    },
}

impl OutputTarget {
    /// Check (and create) the output directory before anything runs, so that an unusable
    /// path fails at once.
    pub(crate) fn open(sink: ParquetSink) -> Result<OutputTarget> {
        let (store, prefix, shown) =
            forebay_parquet::open_location(&sink.root, &sink.storage_options)
                .map_err(|e| EngineError::write(STAGE, &sink.root, e))?;
        let location = if sink.root.contains("://") && !sink.root.starts_with("file://") {
            Location::Remote {
                store,
                prefix,
                shown,
            }
        } else {
            let dir = PathBuf::from(format!("/{prefix}"));
            fs::create_dir_all(&dir).map_err(|e| {
                EngineError::write(
                    STAGE,
                    dir.display().to_string(),
                    format!("cannot create the output directory: {e}"),
                )
            })?;
            // Writable? Create and remove a probe file now rather than fail after hours.
            let probe = dir.join(format!(".forebay-write-probe-{}", std::process::id()));
            File::create(&probe)
                .and_then(|_| fs::remove_file(&probe))
                .map_err(|e| {
                    EngineError::write(
                        STAGE,
                        dir.display().to_string(),
                        format!("the output directory is not writable: {e}"),
                    )
                })?;
            Location::Local(dir)
        };
        let target = OutputTarget {
            run_id: run_id(),
            sink,
            location,
            next_file: AtomicU64::new(0),
            written: Mutex::new(Vec::new()),
        };
        target.apply_mode()?;
        Ok(target)
    }

    pub(crate) fn concurrency(&self) -> usize {
        self.sink.concurrency
    }

    fn apply_mode(&self) -> Result<()> {
        if self.sink.mode == WriteMode::Append {
            return Ok(());
        }
        let existing = self.existing_data_files()?;
        match self.sink.mode {
            WriteMode::ErrorIfExists if !existing.is_empty() => Err(EngineError::write(
                STAGE,
                &self.sink.root,
                format!(
                    "holds {} data file(s) already (e.g. {}); use mode='append' or 'overwrite'",
                    existing.len(),
                    existing[0]
                ),
            )),
            WriteMode::Overwrite => {
                for name in existing {
                    self.delete(&name)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn existing_data_files(&self) -> Result<Vec<String>> {
        let is_data = |name: &str| {
            name.ends_with(".parquet") && !name.starts_with('.') && !name.starts_with('_')
        };
        match &self.location {
            Location::Local(dir) => {
                let mut names = Vec::new();
                for entry in fs::read_dir(dir)
                    .map_err(|e| EngineError::write(STAGE, dir.display().to_string(), e))?
                {
                    let entry = entry
                        .map_err(|e| EngineError::write(STAGE, dir.display().to_string(), e))?;
                    let name = entry.file_name().to_string_lossy().to_string();
                    if is_data(&name) {
                        names.push(name);
                    }
                }
                Ok(names)
            }
            Location::Remote {
                store,
                prefix,
                shown,
            } => {
                let store = store.clone();
                let prefix = prefix.clone();
                let listed = forebay_parquet::block_on(async move {
                    store.list_with_delimiter(Some(&prefix)).await
                })
                .map_err(|e| {
                    EngineError::write(STAGE, shown.clone(), format!("cannot list: {e}"))
                })?;
                let names = listed
                    .objects
                    .into_iter()
                    .filter_map(|o| o.location.filename().map(str::to_string));
                Ok(names.filter(|n| is_data(n)).collect())
            }
        }
    }

    fn delete(&self, name: &str) -> Result<()> {
        match &self.location {
            Location::Local(dir) => fs::remove_file(dir.join(name))
                .map_err(|e| EngineError::write(STAGE, dir.join(name).display().to_string(), e)),
            Location::Remote {
                store,
                prefix,
                shown,
            } => {
                let store = store.clone();
                let path = prefix.clone().join(name);
                forebay_parquet::block_on(async move { store.delete(&path).await })
                    .map_err(|e| EngineError::write(STAGE, format!("{shown}/{name}"), e))
            }
        }
    }

    fn next_name(&self, worker: usize) -> String {
        let n = self.next_file.fetch_add(1, Ordering::Relaxed);
        format!("part-{}-{worker:02}-{n:05}.parquet", self.run_id)
    }

    fn shown(&self, name: &str) -> String {
        match &self.location {
            Location::Local(dir) => dir.join(name).display().to_string(),
            Location::Remote { shown, .. } => format!("{}/{name}", shown.trim_end_matches('/')),
        }
    }

    fn properties(&self) -> WriterProperties {
        WriterProperties::builder()
            .set_compression(self.sink.compression)
            .set_max_row_group_row_count(Some(self.sink.row_group_rows))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
            .build()
    }

    fn open_file(&self, worker: usize, schema: SchemaRef) -> Result<OpenFile> {
        let name = self.next_name(worker);
        let shown = self.shown(&name);
        let props = self.properties();
        let writer = match &self.location {
            Location::Local(dir) => {
                let temp = dir.join(format!(".{name}.tmp"));
                let file = File::create(&temp).map_err(|e| EngineError::write(STAGE, &shown, e))?;
                let writer = ArrowWriter::try_new(BufWriter::new(file), schema, Some(props))
                    .map_err(|e| EngineError::write(STAGE, &shown, e))?;
                FileWriter::Local {
                    writer: Some(writer),
                    temp,
                    path: dir.join(&name),
                }
            }
            Location::Remote { store, prefix, .. } => {
                let upload = object_store::buffered::BufWriter::new(
                    store.clone(),
                    prefix.clone().join(name.as_str()),
                );
                let writer = AsyncArrowWriter::try_new(upload, schema, Some(props))
                    .map_err(|e| EngineError::write(STAGE, &shown, e))?;
                FileWriter::Remote {
                    writer: Some(writer),
                }
            }
        };
        Ok(OpenFile {
            writer,
            shown,
            rows: 0,
            published: false,
        })
    }
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{:012x}",
        (nanos as u64 ^ ((std::process::id() as u64) << 40)) & 0xffff_ffff_ffff
    )
}

enum FileWriter {
    Local {
        writer: Option<ArrowWriter<BufWriter<File>>>,
        temp: PathBuf,
        path: PathBuf,
    },
    Remote {
        writer: Option<AsyncArrowWriter<object_store::buffered::BufWriter>>,
    },
}

struct OpenFile {
    writer: FileWriter,
    shown: String,
    rows: u64,
    /// Set once the file is under its final name; until then, dropping removes it.
    published: bool,
}

impl OpenFile {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let shown = &self.shown;
        match &mut self.writer {
            FileWriter::Local { writer, .. } => writer
                .as_mut()
                .expect("open")
                .write(batch)
                .map_err(|e| EngineError::write(STAGE, shown, e))?,
            FileWriter::Remote { writer } => {
                let mut w = writer.take().expect("open");
                let b = batch.clone();
                let (w, result) = forebay_parquet::block_on(async move {
                    let r = w.write(&b).await;
                    (w, r)
                });
                *writer = Some(w);
                result.map_err(|e| EngineError::write(STAGE, shown, e))?
            }
        }
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Bytes the writer holds in memory (encoded row group in progress, upload buffer).
    fn memory(&self) -> usize {
        match &self.writer {
            FileWriter::Local { writer, .. } => writer.as_ref().map_or(0, |w| w.memory_size()),
            FileWriter::Remote { writer } => {
                writer.as_ref().map_or(0, |w| w.memory_size()) + UPLOAD_PART
            }
        }
    }

    /// Finish the file and publish it under its final name; returns its size.
    fn publish(mut self) -> Result<WrittenFile> {
        let shown = self.shown.clone();
        let bytes = match &mut self.writer {
            FileWriter::Local { writer, temp, path } => {
                let w = writer.take().expect("open");
                let mut out = w
                    .into_inner()
                    .map_err(|e| EngineError::write(STAGE, &shown, e))?;
                out.flush()
                    .map_err(|e| EngineError::write(STAGE, &shown, e))?;
                let file = out
                    .into_inner()
                    .map_err(|e| EngineError::write(STAGE, &shown, e.error().to_string()))?;
                file.sync_all()
                    .map_err(|e| EngineError::write(STAGE, &shown, e))?;
                let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                drop(file);
                fs::rename(&*temp, &*path).map_err(|e| EngineError::write(STAGE, &shown, e))?;
                sync_dir(path.parent().unwrap_or(Path::new("/")))
                    .map_err(|e| EngineError::write(STAGE, &shown, e))?;
                size
            }
            FileWriter::Remote { writer } => {
                let w = writer.take().expect("open");
                forebay_parquet::block_on(async move {
                    let mut w = w;
                    w.finish().await?;
                    let written = w.bytes_written() as u64;
                    use tokio::io::AsyncWriteExt;
                    let mut upload = w.into_inner();
                    upload
                        .shutdown()
                        .await
                        .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
                    Ok::<u64, parquet::errors::ParquetError>(written)
                })
                .map_err(|e| EngineError::write(STAGE, &shown, e))?
            }
        };
        self.published = true;
        Ok(WrittenFile {
            path: shown,
            rows: self.rows,
            bytes,
        })
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if self.published {
            return;
        }
        // An error or a cancellation: remove the partial file / abort the upload.
        match &mut self.writer {
            FileWriter::Local { writer, temp, .. } => {
                drop(writer.take());
                let _ = fs::remove_file(&*temp);
            }
            FileWriter::Remote { writer } => {
                if let Some(w) = writer.take() {
                    let mut upload = w.into_inner();
                    forebay_parquet::block_on(async move {
                        let _ = upload.abort().await;
                    });
                }
            }
        }
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// One writer worker: take batches from `input` until it ends, writing files.
pub(crate) fn run_writer(
    target: Arc<OutputTarget>,
    worker: usize,
    input: Arc<BatchQueue>,
    resources: RunResources,
    holder: MemoryConsumer,
    rows_written: Arc<AtomicU64>,
) -> Result<()> {
    let cancel = resources.cancel_token().clone();
    let mut file: Option<OpenFile> = None;
    let mut buffered: Option<Reservation> = None;
    let mut schema: Option<SchemaRef> = None;
    while let Some(batch) = input.pop(&cancel)? {
        let EngineBatch { batch, .. } = {
            batch.move_to(&holder);
            batch
        };
        match &schema {
            None => schema = Some(batch.schema()),
            Some(s) if s.fields() != batch.schema().fields() => {
                return Err(EngineError::BadOutput {
                    stage: STAGE.into(),
                    batch: Default::default(),
                    reason: format!(
                        "a batch's schema differs from the first batch's: {:?} vs {:?}; every \
                         batch written to one dataset needs the same columns and types",
                        batch.schema(),
                        s
                    ),
                })
            }
            _ => {}
        }
        let mut offset = 0;
        while offset < batch.num_rows() {
            if file.is_none() {
                file = Some(target.open_file(worker, batch.schema())?);
            }
            let open = file.as_mut().expect("just opened");
            let room = target.sink.rows_per_file - open.rows as usize;
            let n = room.min(batch.num_rows() - offset);
            open.write(&batch.slice(offset, n))?;
            offset += n;
            rows_written.fetch_add(n as u64, Ordering::Relaxed);
            // The encoder's buffers are memory in flight too.
            let now = holder.reserve_bytes(open.memory(), Admission::Now)?;
            buffered = Some(now);
            if open.rows as usize >= target.sink.rows_per_file {
                publish(&target, file.take().expect("open"), &resources)?;
                buffered = None;
            }
            cancel.check()?;
        }
    }
    drop(buffered);
    if let Some(open) = file.take() {
        publish(&target, open, &resources)?;
    }
    Ok(())
}

fn publish(target: &OutputTarget, file: OpenFile, resources: &RunResources) -> Result<()> {
    let written = file.publish()?;
    resources.emit(PipelineEvent::FileWritten {
        path: written.path.clone(),
        rows: written.rows,
        bytes: written.bytes,
    });
    target
        .written
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(written);
    Ok(())
}

/// Gather the write's statistics.
pub(crate) fn write_stats(target: &OutputTarget, started: Instant) -> WriteStats {
    let files = target
        .written
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    WriteStats {
        rows: files.iter().map(|f| f.rows).sum(),
        bytes: files.iter().map(|f| f.bytes).sum(),
        files,
        seconds: started.elapsed().as_secs_f64(),
    }
}
