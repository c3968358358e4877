//! A host engine that writes its own Parquet files and commits them through forebay's public
//! commit API (`CommitCoordinator` + `CommitStager::reserve` / `stage_written`): killed with
//! SIGKILL at random moments (and at each step of the protocol) and run again, its output
//! holds every input row exactly once.
//!
//! The job runs in a child process: this test binary again, running the ignored test
//! `host_job` with `HOST_JOB_DIR` set.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use forebay_engine::{Checkpoint, CommitCoordinator, CommitStager, ParquetSink};
use forebay_io::Dir;
use forebay_parquet::{DatasetSource, ParquetDataset};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

const FILES: usize = 4;
const ROW_GROUPS: usize = 4;
const ROWS: usize = 250; // per row group

fn id(n: usize) -> String {
    format!("id-{n:06}")
}

fn write_inputs(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for f in 0..FILES {
        let first = f * ROW_GROUPS * ROWS;
        let ids: ArrayRef = Arc::new(StringArray::from_iter_values(
            (first..first + ROW_GROUPS * ROWS).map(id),
        ));
        let batch = RecordBatch::try_from_iter([("id", ids)]).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(ROWS))
            .build();
        let file = std::fs::File::create(dir.join(format!("in-{f}.parquet"))).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
}

/// The host's job: read what is not finished, one row group at a time; write each as a
/// Parquet file of its own (the host's writer, not forebay's) into a reserved staging name;
/// commit it with its ids, recording its input row group finished.
fn run_host_job(root: &Path) {
    let input =
        ParquetDataset::builder(DatasetSource::uris([root.join("in").display().to_string()]))
            .with_batch_size(ROWS)
            .build()
            .unwrap();
    let checkpoint = Checkpoint::new("id", root.join("ckpt").display().to_string());
    let sink = ParquetSink::new(root.join("out").display().to_string());
    let coordinator = CommitCoordinator::open(&checkpoint, &sink, &input).unwrap();
    let stager = coordinator.stager().unwrap();
    let file_index: HashMap<String, usize> = coordinator
        .files()
        .into_iter()
        .enumerate()
        .map(|(i, f)| (f, i))
        .collect();
    println!("started");
    let todo = input.with_skip(Arc::new(coordinator.finished_inputs().clone()));
    for batch in todo.scan().blocking_iter() {
        let batch = batch.unwrap();
        let unit = (
            file_index[batch.provenance.file.as_ref()],
            batch.provenance.row_group,
        );
        assert_eq!(batch.batch.num_rows(), ROWS, "one batch per row group");
        let ids = batch.batch.column(0).clone();
        let text: ArrayRef = Arc::new(StringArray::from_iter_values(
            ids.as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .iter()
                .map(|i| format!("processed {}", i.unwrap())),
        ));
        let out = RecordBatch::try_from_iter([("id", ids.clone()), ("text", text)]).unwrap();
        let slot = stager.reserve("parquet").unwrap();
        let path = slot.local_path().expect("a local output");
        let mut writer =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), out.schema(), None)
                .unwrap();
        writer.write(&out).unwrap();
        writer.close().unwrap();
        let staged = stager.stage_written(slot, &[ids]).unwrap();
        coordinator
            .commit(Some(staged), vec![unit], Vec::new(), None)
            .unwrap();
    }
    coordinator.finish().unwrap();
}

/// The child's side: the job, when the parent asked for it.
#[test]
#[ignore = "run by host_written_files_survive_fifty_kills in a child process"]
fn host_job() {
    if let Some(root) = std::env::var_os("HOST_JOB_DIR") {
        run_host_job(Path::new(&root));
    }
}

fn spawn_job(root: &Path, crash_at: Option<&str>) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "host_job",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HOST_JOB_DIR", root)
        .env_remove("FOREBAY_CRASH_AT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(point) = crash_at {
        command.env("FOREBAY_CRASH_AT", point);
    }
    command.spawn().unwrap()
}

/// Wait for the child's "started" (it has opened the checkpoint; libtest may have written
/// "test host_job ... " on the same line).
fn wait_started(child: &mut Child) -> bool {
    let stdout = child.stdout.as_mut().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    lines.any(|l| {
        l.map(|l| l.trim_end().ends_with("started"))
            .unwrap_or(false)
    })
}

fn run_to_completion(root: &Path) {
    let out = spawn_job(root, None).wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the rerun failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Ids in the committed output files, with their count.
fn output_ids(out: &Path) -> Vec<String> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(out).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !name.ends_with(".parquet") || name.starts_with(['.', '_']) {
            continue;
        }
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let column = batch
                .column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap();
            ids.extend(column.iter().map(|v| v.unwrap().to_string()));
        }
    }
    ids
}

fn assert_exactly_once(root: &Path, context: &str) {
    let mut ids = output_ids(&root.join("out"));
    ids.sort();
    let total = ids.len();
    ids.dedup();
    assert_eq!(
        total,
        ids.len(),
        "{context}: {} rows written twice",
        total - ids.len()
    );
    let expected: Vec<String> = (0..FILES * ROW_GROUPS * ROWS).map(id).collect();
    assert_eq!(ids, expected, "{context}: rows lost");
}

fn reset(root: &Path) {
    for dir in ["out", "ckpt"] {
        let _ = std::fs::remove_dir_all(root.join(dir));
    }
}

/// Kill times as fractions of the kill window, from a small deterministic generator
/// (splitmix64).
fn kill_fractions(seed: u64, n: usize) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect()
}

#[test]
fn host_written_files_survive_fifty_kills() {
    let tmp = tempfile::tempdir().unwrap();
    let root: PathBuf = tmp.path().to_path_buf();
    write_inputs(&root.join("in"));

    // How long a run's work takes here (from "started" to its end; the quickest of three):
    // kills land anywhere in its first 80 %. A machine that speeds up later (warm caches,
    // a neighbour that finished) would let runs finish before their kill, so the window
    // shrinks each time one does.
    let work = (0..3)
        .map(|_| {
            let mut child = spawn_job(&root, None);
            assert!(wait_started(&mut child), "the job did not start");
            let started = std::time::Instant::now();
            assert!(child.wait().unwrap().success());
            let took = started.elapsed();
            assert_exactly_once(&root, "an uninterrupted run");
            reset(&root);
            took
        })
        .min()
        .unwrap();
    let mut kill_window = work.mul_f64(0.8);

    let mut killed = 0;
    for (trial, fraction) in kill_fractions(20_261_127, 50).into_iter().enumerate() {
        let delay = kill_window.mul_f64(fraction);
        let mut child = spawn_job(&root, None);
        assert!(
            wait_started(&mut child),
            "trial {trial}: the job did not start"
        );
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        if status.success() {
            kill_window = kill_window.mul_f64(0.7);
        } else {
            killed += 1;
        }
        run_to_completion(&root);
        assert_exactly_once(&root, &format!("trial {trial} (killed after {delay:?})"));
        reset(&root);
    }
    eprintln!("{killed} of 50 runs killed before they finished (last window {kill_window:?})");
    assert!(
        killed >= 40,
        "only {killed} of 50 runs were killed before they finished"
    );

    // And at each step of the protocol, twice in: staged, recorded, published.
    for point in ["staged:2", "recorded:2", "ids-published:2", "published:3"] {
        let status = spawn_job(&root, Some(point)).wait().unwrap();
        assert!(
            !status.success(),
            "{point}: the crash point was not reached"
        );
        run_to_completion(&root);
        assert_exactly_once(&root, point);
        reset(&root);
    }
}

/// The test's input files written under `root/in`, opened.
fn inputs_in(root: &Path) -> ParquetDataset {
    write_inputs(&root.join("in"));
    ParquetDataset::builder(DatasetSource::uris([root.join("in").display().to_string()]))
        .build()
        .unwrap()
}

fn parquet_bytes(batch: &RecordBatch) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
    out
}

fn id_batch(ids: &[&str]) -> (RecordBatch, ArrayRef) {
    let column: ArrayRef = Arc::new(StringArray::from(ids.to_vec()));
    (
        RecordBatch::try_from_iter([("id", column.clone())]).unwrap(),
        column,
    )
}

#[test]
fn a_host_file_is_refused_when_it_is_missing_unreadable_or_its_ids_do_not_match() {
    let tmp = tempfile::tempdir().unwrap();
    let input = inputs_in(tmp.path());
    let checkpoint = Checkpoint::new("id", tmp.path().join("ckpt").display().to_string());
    let sink = ParquetSink::new(tmp.path().join("out").display().to_string());
    let coordinator = CommitCoordinator::open(&checkpoint, &sink, &input).unwrap();
    let stager = coordinator.stager().unwrap();
    let (batch, ids) = id_batch(&["a", "b", "c"]);

    let missing = stager.reserve("parquet").unwrap();
    let err = stager
        .stage_written(missing, std::slice::from_ref(&ids))
        .unwrap_err();
    assert!(err.to_string().contains("not there"), "{err}");

    let garbage = stager.reserve("parquet").unwrap();
    std::fs::write(garbage.local_path().unwrap(), b"not parquet").unwrap();
    let err = stager
        .stage_written(garbage, std::slice::from_ref(&ids))
        .unwrap_err();
    assert!(
        err.to_string().contains("not a readable Parquet file"),
        "{err}"
    );

    let short = stager.reserve("parquet").unwrap();
    std::fs::write(short.local_path().unwrap(), parquet_bytes(&batch)).unwrap();
    let err = stager.stage_written(short, &[ids.slice(0, 2)]).unwrap_err();
    assert!(err.to_string().contains("3 rows but 2 ids"), "{err}");

    let nulls: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![1, 2, 3]));
    let typed = stager.reserve("parquet").unwrap();
    std::fs::write(typed.local_path().unwrap(), parquet_bytes(&batch)).unwrap();
    let err = stager.stage_written(typed, &[nulls]).unwrap_err();
    assert!(err.to_string().contains("id"), "{err}");

    // Nothing refused became visible; a good file commits under its final name.
    let good = stager.reserve("parquet").unwrap();
    let name = good.final_name().to_string();
    std::fs::write(good.local_path().unwrap(), parquet_bytes(&batch)).unwrap();
    let staged = stager.stage_written(good, &[ids]).unwrap();
    assert_eq!((staged.rows(), staged.bytes() > 0), (3, true));
    coordinator
        .commit(Some(staged), vec![], vec![], None)
        .unwrap();
    coordinator.finish().unwrap();
    let mut ids = output_ids(&tmp.path().join("out"));
    ids.sort();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(tmp.path().join("out").join(name).exists());
}

/// A store the host built (an in-memory one here: any `ObjectStore` is used as given, never
/// opened again by URI), and its output and checkpoint prefixes as forebay directories.
fn host_store_dirs() -> (Arc<dyn object_store::ObjectStore>, Dir, Dir) {
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let out = Dir::remote(store.clone(), "job/out", "host://job/out").unwrap();
    let ckpt = Dir::remote(store.clone(), "job/ckpt", "host://job/ckpt").unwrap();
    (store, out, ckpt)
}

#[test]
fn a_host_file_on_a_host_store_is_written_to_its_slot_and_published() {
    use object_store::ObjectStoreExt;
    let tmp = tempfile::tempdir().unwrap();
    let input = inputs_in(tmp.path());
    let (store, out, ckpt) = host_store_dirs();
    let checkpoint = Checkpoint::in_dir("id", ckpt.clone());
    let sink = ParquetSink::in_dir(out.clone());
    let coordinator = CommitCoordinator::open(&checkpoint, &sink, &input).unwrap();
    // A stager elsewhere cannot open the host's store by name: it is given the directories.
    let none = Default::default();
    let refused = CommitStager::new(coordinator.stager_spec().clone(), &none, &none)
        .err()
        .expect("a stager cannot reopen a host's store by name")
        .to_string();
    assert!(refused.contains("in_dirs"), "{refused}");
    let swapped = CommitStager::in_dirs(coordinator.stager_spec().clone(), ckpt.clone(), out);
    assert!(
        swapped.is_err(),
        "the output and checkpoint directories are checked"
    );
    let stager = coordinator.stager().unwrap();
    let (batch, ids) = id_batch(&["x", "y"]);
    let slot = stager.reserve("parquet").unwrap();
    assert!(slot.local_path().is_none());
    let (slot_store, location) = slot.object().unwrap();
    let bytes = parquet_bytes(&batch);
    forebay_io::block_on(async move { slot_store.put(&location, bytes.into()).await }).unwrap();
    let final_name = slot.final_name().to_string();
    let staged = stager.stage_written(slot, &[ids]).unwrap();
    coordinator
        .commit(Some(staged), vec![], vec![], None)
        .unwrap();
    coordinator.finish().unwrap();
    let published = object_store::path::Path::from(format!("job/out/{final_name}"));
    let head = forebay_io::block_on({
        let store = store.clone();
        async move { store.head(&published).await }
    });
    assert!(
        head.is_ok(),
        "the committed file is at its final name in the host's store"
    );
    let files: Vec<String> = coordinator
        .committed()
        .iter()
        .map(|f| f.path.clone())
        .collect();
    assert_eq!(files, [format!("host://job/out/{final_name}")]);
    // The ids went into the host's store too: a second run finds them done.
    let index = forebay_checkpoint::CheckpointIndex::loader_in(ckpt, "id")
        .load()
        .unwrap();
    assert_eq!(index.len(), 2);
}

#[test]
fn a_pipeline_writes_exactly_once_into_a_host_store() {
    use forebay_engine::{Pipeline, Source};
    let tmp = tempfile::tempdir().unwrap();
    let (_store, out, ckpt) = host_store_dirs();
    let input = inputs_in(tmp.path());
    let run = |limit: Option<u64>| {
        let mut pipeline = Pipeline::new(Source::Parquet(input.clone()));
        if let Some(rows) = limit {
            pipeline = pipeline.limit(rows);
        }
        pipeline
            .write_parquet_checkpointed(
                ParquetSink::in_dir(out.clone()).with_rows_per_file(ROWS),
                Checkpoint::in_dir("id", ckpt.clone()),
            )
            .unwrap()
    };
    // A first run that stops early, then a resume: every input row once in the host's store.
    let first = run(Some(3 * ROWS as u64));
    assert_eq!(first.rows, 3 * ROWS as u64);
    run(None);
    let written = ParquetDataset::builder(DatasetSource::Store {
        store: match &out {
            Dir::Remote { store, .. } => store.clone(),
            Dir::Local(_) => unreachable!(),
        },
        display_prefix: "host://".into(),
        paths: vec!["job/out/".into()], // every Parquet file under it (not `_` directories)
    })
    .build()
    .unwrap();
    let mut ids = Vec::new();
    for batch in written.scan().blocking_iter() {
        let batch = batch.unwrap().batch;
        let column = batch.column_by_name("id").unwrap();
        let column = column.as_any().downcast_ref::<StringArray>().unwrap();
        ids.extend(column.iter().map(|v| v.unwrap().to_string()));
    }
    ids.sort();
    let expected: Vec<String> = (0..FILES * ROW_GROUPS * ROWS).map(id).collect();
    assert_eq!(ids, expected, "every input row exactly once");
}

#[test]
fn storage_options_never_travel_in_a_stager_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let input = inputs_in(tmp.path());
    let secret: forebay_parquet::StorageOptions = [(
        "aws_secret_access_key".to_string(),
        "s3cr3t-value".to_string(),
    )]
    .into();
    // Local directories ignore store options, so the run opens; the spec must not hold them.
    let checkpoint = Checkpoint::new("id", tmp.path().join("ckpt").display().to_string())
        .with_storage_options(secret.clone());
    let sink = ParquetSink::new(tmp.path().join("out").display().to_string())
        .with_storage_options(secret.clone());
    assert!(!format!("{checkpoint:?}{sink:?}").contains("s3cr3t"));
    let coordinator = CommitCoordinator::open(&checkpoint, &sink, &input).unwrap();
    let spec = coordinator.stager_spec();
    assert!(!spec.to_json().contains("s3cr3t"), "{}", spec.to_json());
    assert!(!format!("{spec:?}").contains("s3cr3t"));
    // The stager is given the options by its caller.
    let stager = CommitStager::new(spec.clone(), &secret, &secret).unwrap();
    let (batch, _) = id_batch(&["s"]);
    let staged = stager.stage(&[batch]).unwrap();
    coordinator
        .commit(Some(staged), vec![], vec![], None)
        .unwrap();
    coordinator.finish().unwrap();
    assert_eq!(output_ids(&tmp.path().join("out")), ["s"]);
}

#[test]
fn options_for_a_host_opened_directory_are_refused_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let input = inputs_in(tmp.path());
    let (_store, out, ckpt) = host_store_dirs();
    let options: forebay_parquet::StorageOptions =
        [("aws_region".to_string(), "eu-west-1".to_string())].into();
    let sink = ParquetSink::in_dir(out).with_storage_options(options);
    let err = CommitCoordinator::open(&Checkpoint::in_dir("id", ckpt), &sink, &input)
        .err()
        .expect("options for a host's store are an error")
        .to_string();
    assert!(
        err.contains("aws_region") && err.contains("host://job/out"),
        "{err}"
    );
}

#[test]
fn a_host_commits_from_async_code() {
    let tmp = tempfile::tempdir().unwrap();
    let input = inputs_in(tmp.path());
    let checkpoint = Checkpoint::new("id", tmp.path().join("ckpt").display().to_string());
    let sink = ParquetSink::new(tmp.path().join("out").display().to_string());
    let host = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    host.block_on(async move {
        let coordinator = Arc::new(
            CommitCoordinator::open_async(checkpoint, sink, input)
                .await
                .unwrap(),
        );
        let stager = coordinator.stager().unwrap();
        let (batch, ids) = id_batch(&["p", "q"]);
        let slot = stager.reserve("parquet").unwrap();
        std::fs::write(slot.local_path().unwrap(), parquet_bytes(&batch)).unwrap();
        let staged = stager.stage_written(slot, &[ids]).unwrap();
        coordinator
            .commit_async(Some(staged), vec![(0, 0)], vec![], None)
            .await
            .unwrap();
        coordinator.finish_async().await.unwrap();
    });
    let mut ids = output_ids(&tmp.path().join("out"));
    ids.sort();
    assert_eq!(ids, ["p", "q"]);
}
