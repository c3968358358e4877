//! Checkpointed writes: every input row written exactly once across failed and resumed
//! runs, finished inputs skipped unread, changed inputs noticed, damaged checkpoints
//! reported, and the commit protocol's recovery (roll forward, roll back). Checked against
//! the ids the test wrote.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use forebay_engine::{
    Checkpoint, EngineError, MapStage, OnChangedInput, ParquetSink, Pipeline, Source,
};
use forebay_parquet::{DatasetSource, ParquetDataset};

mod common;

const FILES: i64 = 6;
const ROWS: i64 = 5_000; // per file, row groups of 1,000

/// A temporary directory (kept while the returned guard lives) and the job's input, output
/// and checkpoint paths in it.
fn job_dirs() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (input, out, ckpt) = (
        tmp.path().join("in"),
        tmp.path().join("out"),
        tmp.path().join("ckpt"),
    );
    (tmp, input, out, ckpt)
}

fn write_inputs(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for f in 0..FILES {
        write_input(&dir.join(format!("in-{f}.parquet")), f * ROWS, ROWS);
    }
}

fn write_input(path: &Path, first: i64, n: i64) {
    write_ids(path, (first..first + n).collect());
}

fn write_ids(path: &Path, ids: Vec<i64>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("text", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("t{i}")),
            )),
        ],
    )
    .unwrap();
    write_batch(path, &batch);
}

/// One Parquet file of `batch`, in row groups of 1,000 rows.
fn write_batch(path: &Path, batch: &RecordBatch) {
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(1000))
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

fn dataset(dir: &Path) -> ParquetDataset {
    ParquetDataset::builder(DatasetSource::uris([dir.display().to_string()]))
        .with_batch_size(700)
        .build()
        .unwrap()
}

/// Ids in the output directory, with multiplicity.
fn output_ids(dir: &Path) -> Vec<i64> {
    common::i64_column_in(dir, "id")
}

fn assert_exactly_once(dir: &Path, expected: i64) {
    let mut ids = output_ids(dir);
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "no id written twice");
    assert_eq!(ids, (0..expected).collect::<Vec<_>>(), "every id written");
}

/// A map that fails once `fail_after` batches went through it (None: never).
fn doubling(fail_after: Option<usize>) -> MapStage {
    let seen = Arc::new(AtomicUsize::new(0));
    MapStage::rust("double", move |b: RecordBatch| {
        if fail_after.is_some_and(|n| seen.fetch_add(1, Ordering::SeqCst) >= n) {
            return Err("the model ran out of memory".into());
        }
        let id = b
            .column_by_name("id")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let doubled = Int64Array::from_iter_values(id.values().iter().map(|v| v * 2));
        let mut fields = b.schema().fields().to_vec();
        fields.push(Arc::new(Field::new("double", DataType::Int64, false)));
        let mut cols = b.columns().to_vec();
        cols.push(Arc::new(doubled));
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
    })
    .with_concurrency(2)
}

fn run(
    input: &Path,
    out: &Path,
    ckpt: &Path,
    fail_after: Option<usize>,
) -> Result<forebay_engine::WriteStats, EngineError> {
    run_with(
        input,
        out,
        Checkpoint::new("id", ckpt.display().to_string()),
        fail_after,
    )
}

/// The job of [`run`] with the checkpoint given.
fn run_with(
    input: &Path,
    out: &Path,
    checkpoint: Checkpoint,
    fail_after: Option<usize>,
) -> Result<forebay_engine::WriteStats, EngineError> {
    Pipeline::new(Source::Parquet(dataset(input)))
        .with_memory_limit(64 << 20)
        .map(doubling(fail_after))
        .write_parquet_checkpointed(
            ParquetSink::new(out.display().to_string()).with_rows_per_file(2_000),
            checkpoint,
        )
}

#[test]
fn failed_runs_resume_exactly_once_and_finished_input_is_skipped_unread() {
    let (_tmp, input, out, ckpt) = job_dirs();
    write_inputs(&input);
    // Two runs that die part way, then one that finishes.
    let err = run(&input, &out, &ckpt, Some(8)).unwrap_err();
    assert!(err.to_string().contains("ran out of memory"), "{err}");
    let first = output_ids(&out).len();
    assert!(
        first > 0 && first < (FILES * ROWS) as usize,
        "some files committed: {first}"
    );
    let _ = run(&input, &out, &ckpt, Some(12)).unwrap_err();
    let stats = run(&input, &out, &ckpt, None).unwrap();
    assert_exactly_once(&out, FILES * ROWS);
    let resume = stats.resume.unwrap();
    assert!(resume.report.ids_done > 0);
    assert_eq!(
        stats.rows + resume.report.ids_done,
        (FILES * ROWS) as u64,
        "the last run wrote exactly what was missing"
    );
    // A fourth run finds everything done: every file skipped without reading it.
    let again = run(&input, &out, &ckpt, None).unwrap();
    assert_eq!(again.rows, 0);
    let skipped = again.resume.unwrap();
    assert_eq!(skipped.files_skipped, FILES as u64);
    // Nothing read but the first file's footer, which the dataset reads for its schema.
    assert!(
        skipped.bytes_read <= 64 * 1024,
        "{} bytes read",
        skipped.bytes_read
    );
    assert_exactly_once(&out, FILES * ROWS);
    // Readers of the checkpoint see only forebay's committed parts.
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(".parquet") || n.starts_with('_')),
        "{names:?}"
    );
}

/// Input rows numbered `first..first + n` whose ids repeat every `distinct` rows.
fn write_repeating_ids(path: &Path, first: i64, n: i64, distinct: i64) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("row", DataType::Int64, false),
    ]));
    let rows: Vec<i64> = (first..first + n).collect();
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r % distinct),
            )),
            Arc::new(Int64Array::from(rows)),
        ],
    )
    .unwrap();
    write_batch(path, &batch);
}

#[test]
fn failed_runs_with_repeated_ids_resume_to_what_an_uninterrupted_run_writes() {
    // Every id is held by ~5 rows, in other row groups and files: each row is written
    // once (a resume drops rows by input position, not by id).
    let (_tmp, input, out, ckpt) = job_dirs();
    std::fs::create_dir_all(&input).unwrap();
    for f in 0..FILES {
        write_repeating_ids(
            &input.join(format!("in-{f}.parquet")),
            f * ROWS,
            ROWS,
            6_007,
        );
    }
    let err = run(&input, &out, &ckpt, Some(7)).unwrap_err();
    assert!(err.to_string().contains("ran out of memory"), "{err}");
    let first = common::i64_column_in(&out, "row").len();
    assert!(first > 0 && first < (FILES * ROWS) as usize, "{first}");
    let _ = run(&input, &out, &ckpt, Some(13)).unwrap_err();
    let stats = run(&input, &out, &ckpt, None).unwrap();
    let mut rows = common::i64_column_in(&out, "row");
    rows.sort_unstable();
    assert_eq!(rows, (0..FILES * ROWS).collect::<Vec<_>>(), "each row once");
    let resume = stats.resume.unwrap();
    assert_eq!(resume.rows_skipped_by_id, 0, "no id probed");
    assert_eq!(
        stats.rows + resume.report.ids_done,
        (FILES * ROWS) as u64,
        "the last run wrote exactly what was missing"
    );
    let again = run(&input, &out, &ckpt, None).unwrap();
    assert_eq!(again.rows, 0);
    assert_eq!(again.resume.unwrap().files_skipped, FILES as u64);
}

#[test]
fn a_checkpoint_by_position_resumes_without_writing_an_id() {
    let (_tmp, input, out, ckpt) = job_dirs();
    write_inputs(&input);
    let run = |fail_after| {
        let checkpoint = Checkpoint::by_position(ckpt.display().to_string());
        run_with(&input, &out, checkpoint, fail_after)
    };
    assert!(run(Some(9)).is_err());
    let first = output_ids(&out).len() as u64;
    assert!(first > 0);
    let stats = run(None).unwrap();
    assert_exactly_once(&out, FILES * ROWS);
    assert_eq!(stats.rows + first, (FILES * ROWS) as u64);
    assert!(!ckpt.join("ids").exists(), "no id written");
    assert!(ckpt.join("_forebay_by_position").exists());
}

#[test]
fn a_changed_input_is_an_error_unless_reprocessing_is_asked_for() {
    let (_tmp, input, out, ckpt) = job_dirs();
    write_inputs(&input);
    run(&input, &out, &ckpt, None).unwrap();
    // Rewrite one input: its rows plus 500 new ids.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let ids: Vec<i64> = (2 * ROWS..3 * ROWS).chain(1_000_000..1_000_500).collect();
    write_ids(&input.join("in-2.parquet"), ids);
    let err = run(&input, &out, &ckpt, None).unwrap_err().to_string();
    assert!(
        err.contains("in-2.parquet") && err.contains("changed") && err.contains("reprocess"),
        "{err}"
    );
    let stats = Pipeline::new(Source::Parquet(dataset(&input)))
        .map(doubling(None))
        .write_parquet_checkpointed(
            ParquetSink::new(out.display().to_string()),
            Checkpoint::new("id", ckpt.display().to_string())
                .with_on_changed_input(OnChangedInput::Reprocess),
        )
        .unwrap();
    // Only the 500 new ids were written (the file's old rows are done by id).
    assert_eq!(stats.rows, 500);
    let resume = stats.resume.unwrap();
    assert_eq!(resume.rows_skipped_by_id, ROWS as u64);
    assert_eq!(resume.files_skipped, FILES as u64 - 1);
    let ids: HashSet<i64> = output_ids(&out).into_iter().collect();
    assert!((1_000_000..1_000_500).all(|i| ids.contains(&i)));
}

#[test]
fn an_id_only_checkpoint_filters_by_id() {
    // A flat directory of Parquet files with an id column, as Ray Data writes.
    let (tmp, input, out, ckpt) = job_dirs();
    write_inputs(&input);
    std::fs::create_dir_all(&ckpt).unwrap();
    write_input(&ckpt.join("ray-part-0.parquet"), 0, 12_000);
    let stats = run(&input, &out, &ckpt, None).unwrap();
    assert_eq!(stats.rows, (FILES * ROWS - 12_000) as u64);
    assert_eq!(stats.resume.unwrap().rows_skipped_by_id, 12_000);
    let ids = output_ids(&out);
    assert_eq!(ids.iter().min(), Some(&12_000));
    // Row groups whose every id was done (dropped inside the scan, no batch left) completed
    // too: a rerun skips every file unread.
    let again = run(&input, &out, &ckpt, None).unwrap();
    assert_eq!(again.rows, 0);
    assert_eq!(again.resume.unwrap().files_skipped, FILES as u64);
    // And the single-file form: ids in one file, forebay's state beside it.
    let out2 = tmp.path().join("out2");
    let stats = Pipeline::new(Source::Parquet(dataset(&input)))
        .write_parquet_checkpointed(
            ParquetSink::new(out2.display().to_string()),
            Checkpoint::new("id", ckpt.join("ray-part-0.parquet").display().to_string()),
        )
        .unwrap();
    assert_eq!(stats.rows, (FILES * ROWS - 12_000) as u64);
    assert!(ckpt.join("ray-part-0.parquet.forebay").is_dir());
}

#[test]
fn a_damaged_checkpoint_is_a_clear_error_not_a_rerun() {
    let (_tmp, input, out, ckpt) = job_dirs();
    write_inputs(&input);
    run(&input, &out, &ckpt, None).unwrap();
    std::fs::write(ckpt.join("_forebay_inputs.json"), b"{not json").unwrap();
    let err = run(&input, &out, &ckpt, None).unwrap_err().to_string();
    assert!(
        err.contains("_forebay_inputs.json") && err.contains("damaged"),
        "{err}"
    );
    // A damaged id file, too.
    std::fs::write(
        ckpt.join("_forebay_inputs.json"),
        b"{\"format\":1,\"files\":{}}",
    )
    .unwrap();
    let part = std::fs::read_dir(ckpt.join("ids"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&part, b"PAR1 garbage").unwrap();
    let err = run(&input, &out, &ckpt, None).unwrap_err().to_string();
    assert!(err.contains(&part.display().to_string()), "{err}");
    assert_exactly_once(&out, FILES * ROWS); // nothing was written twice meanwhile
}

#[test]
fn a_missing_id_column_after_a_step_names_the_step() {
    let (_tmp, input, out, ckpt) = job_dirs();
    write_inputs(&input);
    let drop_id = MapStage::rust("embed", |b: RecordBatch| {
        let i = b.schema().index_of("text").unwrap();
        Ok(b.project(&[i])?)
    });
    let err = Pipeline::new(Source::Parquet(dataset(&input)))
        .map(drop_id)
        .write_parquet_checkpointed(
            ParquetSink::new(out.display().to_string()),
            Checkpoint::new("id", ckpt.display().to_string()),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("stage 'embed'") && err.contains("'id'"),
        "{err}"
    );
    assert!(output_ids(&out).is_empty());
}

/// Whether each column chunk of `column` in the Parquet files under `dir` (recursively) has
/// a dictionary page; one entry per file.
fn has_dictionary(dir: &Path, column: &str) -> Vec<bool> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(has_dictionary(&path, column));
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".parquet") || name.starts_with('.') {
            continue;
        }
        let reader =
            parquet::file::reader::SerializedFileReader::new(std::fs::File::open(&path).unwrap())
                .unwrap();
        let meta = parquet::file::reader::FileReader::metadata(&reader);
        let at = meta
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .position(|c| c.name() == column)
            .unwrap();
        found.push(
            meta.row_groups()
                .iter()
                .any(|rg| rg.column(at).dictionary_page_offset().is_some()),
        );
    }
    found
}

#[test]
fn ids_are_written_without_a_dictionary() {
    // Ids are distinct: a dictionary of them would only cost the hashing of every value.
    let (_tmp, input, out, ckpt) = job_dirs();
    write_inputs(&input);
    run(&input, &out, &ckpt, None).unwrap();
    let id_chunks = has_dictionary(&out, "id");
    assert!(!id_chunks.is_empty());
    assert!(id_chunks.iter().all(|d| !d), "data files: {id_chunks:?}");
    // Other columns keep the default (dictionary first).
    assert!(has_dictionary(&out, "text").iter().all(|d| *d));
    // The checkpoint's id parts too.
    let parts = has_dictionary(&ckpt, "id");
    assert!(!parts.is_empty());
    assert!(parts.iter().all(|d| !d), "id parts: {parts:?}");
}
