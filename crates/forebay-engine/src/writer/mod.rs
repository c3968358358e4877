//! The file sink: batches to files, each published atomically under its final name.
//!
//! ```text
//!  queue ──► writer worker(s) ──FormatWriter──► local: <dir>/.<name>.tmp ─fsync─rename─fsync(dir)─► <dir>/<name>
//!                 │ roll over at rows_per_file     remote: multipart upload ─complete─► s3://bucket/dir/<name>
//!                 └─ what the format holds (the row group being encoded) is reserved in the pool
//! ```
//!
//! The encoding is a [`FileFormat`](crate::format::FileFormat)'s (today Parquet); names,
//! temporary files, uploads, staging and cleanup are this module's, the same for every format.
//!
//! A reader of the output directory never sees a partial file: locally the temporary name
//! starts with `.` (readers, forebay's and pyarrow's, skip such names) and becomes final by
//! `rename`; on object stores the object appears only when its upload completes. A failed
//! or cancelled file is removed (locally) or its upload aborted.
//!
//! With a checkpoint, files are written whole-batch (a batch never spans two files, so the
//! ids of a file are exactly its rows'), staged under `_forebay_staging/`, and published by
//! the commit protocol (`commit` module) together with their ids and the inputs they finish
//! (submodule `checkpointed`). Rows set aside by the first map (`dead_letter`) are written
//! under `_dead_letter/<stage>/`: with a checkpoint in the commit that takes them, without
//! one at the end of each writer.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use forebay_parquet::StorageOptions;
use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};

use crate::commit::{CommitLog, StagedData};
use crate::dead_letter::SetAside;
use crate::error::{EngineError, Result};
use crate::events::PipelineEvent;
use crate::format::{FileFormat, FileSink, FormatWriter, ParquetFormat, DEFAULT_ROW_GROUP_ROWS};
use crate::memory::{Admission, MemoryConsumer, Reservation};
use crate::output_schema::{check_schema, DatasetSchema};
use crate::queue::BatchQueue;
use crate::resources::RunResources;
use crate::stats::{StageCounters, WriteStats, WrittenFile};
use forebay_io::durable::{create_dir_all_durable, sync_dir};
use forebay_io::{Dir, DirError, DirLocation};

mod checkpointed;

const STAGE: &str = "write_parquet";
/// Rows per file when `rows_per_file` is not set.
pub const DEFAULT_ROWS_PER_FILE: usize = 1 << 20;

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
    /// The output directory (its Debug shows the option keys, never their values).
    pub(crate) location: DirLocation,
    pub(crate) compression: Compression,
    /// The name `compression` was chosen by (what another process is told).
    pub(crate) compression_name: String,
    pub(crate) rows_per_file: usize,
    pub(crate) row_group_rows: usize,
    pub(crate) concurrency: usize,
    pub(crate) mode: WriteMode,
    /// Columns written without dictionary encoding (see [`ParquetSink::with_unique_column`]).
    pub(crate) unique_columns: Vec<String>,
}

impl ParquetSink {
    /// Write into the directory `root` (a local path or a URI: `s3://bucket/out/`).
    pub fn new(root: impl Into<String>) -> ParquetSink {
        ParquetSink::at(DirLocation::uri(root))
    }

    /// Write into a directory the caller opened: a local one, or a prefix of a store a host
    /// engine built ([`Dir::remote`]), used as given (forebay never sees its credentials).
    ///
    /// ```no_run
    /// # fn run(store: std::sync::Arc<dyn object_store::ObjectStore>) -> forebay_engine::Result<()> {
    /// let out = forebay_io::Dir::remote(store, "job/out", "s3://bucket/job/out").unwrap();
    /// let sink = forebay_engine::ParquetSink::in_dir(out).with_compression("snappy")?;
    /// # Ok(()) }
    /// ```
    pub fn in_dir(dir: Dir) -> ParquetSink {
        ParquetSink::at(DirLocation::opened(dir))
    }

    fn at(location: DirLocation) -> ParquetSink {
        ParquetSink {
            location,
            compression: Compression::ZSTD(ZstdLevel::default()),
            compression_name: "zstd".into(),
            rows_per_file: DEFAULT_ROWS_PER_FILE,
            row_group_rows: DEFAULT_ROW_GROUP_ROWS,
            concurrency: 1,
            mode: WriteMode::Append,
            unique_columns: Vec::new(),
        }
    }

    /// Options for the output's object store (`aws_endpoint`, credentials, ...); not for
    /// a sink [`in_dir`](Self::in_dir), whose store is configured already (an error when
    /// the run starts).
    pub fn with_storage_options(mut self, options: StorageOptions) -> Self {
        self.location = self.location.with_options(options);
        self
    }

    /// The output directory, as messages name it.
    pub fn root(&self) -> &str {
        self.location.shown()
    }

    /// Open the output directory.
    pub(crate) fn open_dir(&self) -> Result<Dir> {
        self.location.open().map_err(storage_err)
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
        self.compression_name = name.to_ascii_lowercase();
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

    /// Declare a column whose values are all (or nearly all) distinct, such as a row id: it
    /// is written without dictionary encoding. A dictionary of distinct values saves no
    /// space and costs time: the writer hashes every value into it until the dictionary
    /// reaches its size limit (1 MiB, ~100 K short strings) in each row group, then writes
    /// them plainly anyway. A checkpointed write declares its id column.
    pub fn with_unique_column(mut self, column: impl Into<String>) -> Self {
        let column = column.into();
        if !self.unique_columns.contains(&column) {
            self.unique_columns.push(column);
        }
        self
    }

    /// The format of the files: Parquet with this sink's settings.
    pub(crate) fn format(&self) -> ParquetFormat {
        ParquetFormat {
            compression: self.compression,
            row_group_rows: self.row_group_rows,
            unique_columns: self.unique_columns.clone(),
        }
    }
}

/// The output directory, opened once for the run.
pub(crate) struct OutputTarget {
    sink: ParquetSink,
    format: Arc<dyn FileFormat>,
    dir: Dir,
    run_id: String,
    next_file: AtomicU64,
    pub(crate) written: Mutex<Vec<WrittenFile>>,
    /// Dead-letter files written (see `dead_letter`).
    dead_letters_written: Mutex<Vec<WrittenFile>>,
    /// Set for checkpointed writes: files are staged and committed through it.
    commits: Option<Arc<CommitLog>>,
    /// The first batch's schema, which every writer's batches must have.
    schema: DatasetSchema,
}

fn storage_err(e: DirError) -> EngineError {
    EngineError::storage(STAGE, e)
}

impl OutputTarget {
    /// Check (and create) the output directory before anything runs, so that an unusable
    /// path fails at once.
    pub(crate) fn open(sink: ParquetSink, commits: Option<Arc<CommitLog>>) -> Result<OutputTarget> {
        let dir = match &commits {
            Some(log) => log.output().clone(),
            None => sink.open_dir()?,
        };
        if let Dir::Local(root) = &dir {
            fs::create_dir_all(root).map_err(|e| {
                EngineError::write(
                    STAGE,
                    root.display().to_string(),
                    format!("cannot create the output directory: {e}"),
                )
            })?;
            // Writable? Create and remove a probe file now rather than fail after hours.
            let probe = root.join(format!(".forebay-write-probe-{}", std::process::id()));
            File::create(&probe)
                .and_then(|_| fs::remove_file(&probe))
                .map_err(|e| {
                    EngineError::write(
                        STAGE,
                        root.display().to_string(),
                        format!("the output directory is not writable: {e}"),
                    )
                })?;
        }
        let target = OutputTarget {
            run_id: run_id(),
            format: Arc::new(sink.format()),
            sink,
            dir,
            next_file: AtomicU64::new(0),
            written: Mutex::new(Vec::new()),
            dead_letters_written: Mutex::new(Vec::new()),
            commits,
            schema: DatasetSchema::default(),
        };
        target.apply_mode()?;
        Ok(target)
    }

    pub(crate) fn concurrency(&self) -> usize {
        self.sink.concurrency
    }

    /// The extension of the files written (`"parquet"`), without the dot.
    /// The output directory.
    pub(crate) fn dir(&self) -> &Dir {
        &self.dir
    }

    pub(crate) fn extension(&self) -> &str {
        self.format.extension()
    }

    fn apply_mode(&self) -> Result<()> {
        if self.sink.mode == WriteMode::Append {
            return Ok(());
        }
        if self.commits.is_some() {
            return Err(EngineError::InvalidArgument(
                "a checkpointed write appends (it resumes into the same directory); use \
                 mode='append'"
                    .into(),
            ));
        }
        let suffix = format!(".{}", self.extension());
        let is_data = |name: &str| {
            name.ends_with(&suffix) && !name.starts_with('.') && !name.starts_with('_')
        };
        let existing: Vec<String> = self
            .dir
            .list("")
            .map_err(storage_err)?
            .into_iter()
            .filter(|n| is_data(n))
            .collect();
        match self.sink.mode {
            WriteMode::ErrorIfExists if !existing.is_empty() => Err(EngineError::write(
                STAGE,
                self.sink.root(),
                format!(
                    "holds {} data file(s) already (e.g. {}); use mode='append' or 'overwrite'",
                    existing.len(),
                    existing[0]
                ),
            )),
            WriteMode::Overwrite => {
                for name in existing {
                    self.dir.delete(&name).map_err(storage_err)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A new file: written under a hidden temporary name and renamed to `name` when
    /// published (local), or uploaded to `name` (object stores; `name` may be a staging
    /// path, which the commit protocol publishes).
    fn open_file(&self, name: &str, schema: SchemaRef, staged: bool) -> Result<OpenFile> {
        let shown = self.dir.shown(name);
        let (sink, local) = match (self.dir.local_path(name), self.dir.object(name)) {
            (Some(path), _) => {
                let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
                // A staged file is named by its commit record once it is complete: the
                // staging directory's own entry must survive a power loss as well.
                let made = if staged {
                    create_dir_all_durable(&dir).map_err(|e| e.source)
                } else {
                    fs::create_dir_all(&dir)
                };
                made.map_err(|e| EngineError::write(STAGE, &shown, e))?;
                let file_name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("part")
                    .to_string();
                let temp = if staged {
                    path.clone()
                } else {
                    dir.join(format!(".{file_name}.tmp"))
                };
                let file = File::create(&temp).map_err(|e| EngineError::write(STAGE, &shown, e))?;
                let local = LocalFile {
                    temp,
                    path: (!staged).then_some(path),
                };
                (FileSink::local(file), Some(local))
            }
            (None, Some((store, location))) => (FileSink::upload(store, location), None),
            (None, None) => unreachable!("a directory is local or remote"),
        };
        let mut file = OpenFile {
            writer: None,
            local,
            shown,
            rows: 0,
            published: false,
        };
        // Opened after `file` exists, so that a failure removes the temporary file.
        file.writer = Some(
            self.format
                .open(schema, sink)
                .map_err(|e| EngineError::write(STAGE, &file.shown, e))?,
        );
        Ok(file)
    }

    /// Write `batches` as one file at `name` and leave it there unpublished: a commit
    /// decided elsewhere (another process's commit protocol) publishes it.
    pub(crate) fn stage_file(&self, name: &str, batches: &[RecordBatch]) -> Result<WrittenFile> {
        let schema = match batches.first() {
            Some(b) => b.schema(),
            None => {
                return Err(EngineError::write(
                    STAGE,
                    self.dir.shown(name),
                    "no batches to write",
                ))
            }
        };
        let mut file = self.open_file(name, schema.clone(), true)?;
        for batch in batches {
            if batch.schema() != schema {
                return Err(EngineError::write(
                    STAGE,
                    &file.shown,
                    format!(
                        "batches of one file have different schemas: {:?} then {:?}",
                        schema,
                        batch.schema()
                    ),
                ));
            }
            file.write(batch)?;
        }
        file.finish()
    }

    fn record_dead_letters(&self, file: WrittenFile) {
        self.dead_letters_written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(file);
    }

    /// Dead-letter files a commit published.
    fn record_dead_letters_published(&self, files: &[StagedData]) {
        for f in files {
            self.record_dead_letters(WrittenFile {
                path: self.dir.shown(&f.final_name),
                rows: f.rows,
                bytes: f.bytes,
            });
        }
    }

    fn record(&self, file: WrittenFile, resources: &RunResources) {
        resources.emit(PipelineEvent::FileWritten {
            path: file.path.clone(),
            rows: file.rows,
            bytes: file.bytes,
        });
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(file);
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

/// A local file being written: where its bytes go, and the name it gets when published.
struct LocalFile {
    temp: PathBuf,
    /// The final name to rename to when published (None: staged, the commit protocol
    /// publishes it).
    path: Option<PathBuf>,
}

struct OpenFile {
    /// `None` only while opening and once finished.
    writer: Option<Box<dyn FormatWriter>>,
    /// Set for a local file (an upload is completed or aborted by its sink).
    local: Option<LocalFile>,
    shown: String,
    rows: u64,
    /// Set once the file is complete (under its final name, or staged for a commit); until
    /// then, dropping it removes the partial file.
    published: bool,
}

impl OpenFile {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.writer
            .as_mut()
            .expect("open")
            .write(batch)
            .map_err(|e| EngineError::write(STAGE, &self.shown, e))?;
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Bytes the writer holds in memory (encoded row group in progress, upload buffers).
    fn memory(&self) -> usize {
        self.writer.as_ref().map_or(0, |w| w.memory())
    }

    /// Finish the file: durable, and under its final name unless it is staged. Returns its
    /// size.
    fn finish(mut self) -> Result<WrittenFile> {
        let shown = self.shown.clone();
        let write_err =
            |e: &dyn std::fmt::Display| EngineError::write(STAGE, &shown, e.to_string());
        let sink = self
            .writer
            .take()
            .expect("open")
            .finish()
            .map_err(|e| write_err(&e))?;
        let bytes = sink.bytes_written();
        // Flushed and synced (local), or the upload completed: the object appears now.
        sink.complete().map_err(|e| write_err(&e))?;
        if let Some(local) = &self.local {
            // Durable under its final name, or (staged) under its staging name: the commit
            // record written next names it, so its directory entry must be on disk before
            // that record is.
            let named: &Path = match local.path.as_deref() {
                Some(path) => {
                    fs::rename(&local.temp, path).map_err(|e| write_err(&e))?;
                    path
                }
                None => &local.temp,
            };
            sync_dir(named.parent().unwrap_or(Path::new("/"))).map_err(|e| write_err(&e))?;
        }
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
        // An error or a cancellation: the sink aborts an upload as it drops; a partial
        // local file is removed.
        drop(self.writer.take());
        if let Some(local) = &self.local {
            let _ = fs::remove_file(&local.temp);
        }
    }
}

/// One writer worker: take batches from `input` until it ends, writing files. Returns the
/// rows this worker wrote (`rows_written`, shared by all workers, counts them live).
pub(crate) fn run_writer(
    target: Arc<OutputTarget>,
    worker: usize,
    input: Arc<BatchQueue>,
    resources: RunResources,
    holder: MemoryConsumer,
    rows_written: Arc<AtomicU64>,
    counters: &StageCounters,
) -> Result<u64> {
    match target.commits.clone() {
        None => write_plain(
            &target,
            worker,
            &input,
            &resources,
            &holder,
            &rows_written,
            counters,
        ),
        Some(log) => checkpointed::write_checkpointed(
            &target,
            &log,
            &input,
            &resources,
            &holder,
            &rows_written,
            counters,
        ),
    }
}

/// Without a checkpoint: files of exactly `rows_per_file` rows (a batch may span two).
fn write_plain(
    target: &OutputTarget,
    worker: usize,
    input: &BatchQueue,
    resources: &RunResources,
    holder: &MemoryConsumer,
    rows_written: &AtomicU64,
    counters: &StageCounters,
) -> Result<u64> {
    let mut written = 0;
    let cancel = resources.cancel_token().clone();
    let mut file: Option<OpenFile> = None;
    let mut buffered: Option<Reservation> = None;
    while let Some(mut batch) = input.pop(&cancel)? {
        batch.move_to(holder);
        check_schema(&target.schema, &mut batch)?;
        let batch = batch.batch;
        counters.record_in(batch.num_rows());
        let started = Instant::now();
        let mut offset = 0;
        while offset < batch.num_rows() {
            if file.is_none() {
                let n = target.next_file.fetch_add(1, Ordering::Relaxed);
                let name = format!(
                    "part-{}-{worker:02}-{n:05}.{}",
                    target.run_id,
                    target.extension()
                );
                file = Some(target.open_file(&name, batch.schema(), false)?);
            }
            let open = file.as_mut().expect("just opened");
            let room = target.sink.rows_per_file - open.rows as usize;
            let n = room.min(batch.num_rows() - offset);
            open.write(&batch.slice(offset, n))?;
            offset += n;
            rows_written.fetch_add(n as u64, Ordering::Relaxed);
            written += n as u64;
            // The encoder's buffers are memory in flight too.
            buffered = Some(holder.reserve_bytes(open.memory(), Admission::Now)?);
            if open.rows as usize >= target.sink.rows_per_file {
                let done = file.take().expect("open").finish()?;
                target.record(done, resources);
                buffered = None;
            }
            cancel.check()?;
        }
        counters.record_busy(started.elapsed());
        counters.record_out(batch.num_rows());
    }
    drop(buffered);
    if let Some(open) = file.take() {
        target.record(open.finish()?, resources);
    }
    write_dead_letters(target, worker, resources)?;
    Ok(written)
}

/// A write without a checkpoint: the rows set aside (see `dead_letter`), one file per stage
/// (each appears whole; nothing ties them to the output's files).
fn write_dead_letters(
    target: &OutputTarget,
    worker: usize,
    resources: &RunResources,
) -> Result<()> {
    let Some(asides) = resources.dead_letters().map(|b| b.take()) else {
        return Ok(());
    };
    for (directory, batches) in by_directory(asides) {
        let name = format!(
            "{directory}/part-{}-{worker:02}.{}",
            target.run_id,
            target.extension()
        );
        let mut file = target.open_file(&name, batches[0].schema(), false)?;
        for batch in &batches {
            file.write(batch)?;
        }
        target.record_dead_letters(file.finish()?);
    }
    Ok(())
}

/// The rows set aside, by the directory of their stage.
fn by_directory(asides: Vec<SetAside>) -> BTreeMap<String, Vec<RecordBatch>> {
    let mut by_directory: BTreeMap<String, Vec<RecordBatch>> = BTreeMap::new();
    for aside in asides {
        by_directory
            .entry(aside.directory.clone())
            .or_default()
            .push(aside.rows.clone());
    }
    by_directory
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
        dead_letter_files: target
            .dead_letters_written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        seconds: started.elapsed().as_secs_f64(),
        resume: None,
    }
}
