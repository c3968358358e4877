//! Worker processes, spoken to with the engine's protocol. The worker is this test binary
//! itself, started with `FOREBAY_TEST_WORKER=1` (see `worker_entry`): it attaches to the
//! run's object store, reads its batches by id, writes its results back, and on request
//! fails, dies by SIGKILL, or refuses to start.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use arrow_array::{Array, Int64Array};
use forebay_engine::process::{ProcessPool, RemoteError};
use forebay_engine::{
    EngineError, IterOptions, MapStage, Pipeline, PipelineEvent, Source, UserError,
};
use forebay_store::{ObjectId, ObjectStore};

mod common;
use common::batch_of;

// ---------------------------------------------------------------- the worker side

fn read_frame(s: &mut UnixStream) -> Option<(u8, Vec<u8>)> {
    let mut header = [0u8; 5];
    s.read_exact(&mut header).ok()?;
    let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; len - 1];
    s.read_exact(&mut payload).ok()?;
    Some((header[4], payload))
}

fn write_frame(s: &mut UnixStream, kind: u8, payload: &[u8]) {
    let mut frame = ((payload.len() + 1) as u32).to_le_bytes().to_vec();
    frame.push(kind);
    frame.extend_from_slice(payload);
    s.write_all(&frame).unwrap();
}

fn error_payload(text: &str) -> Vec<u8> {
    let mut p = (text.len() as u32).to_le_bytes().to_vec();
    p.extend_from_slice(text.as_bytes());
    p.extend_from_slice(b"opaque");
    p
}

/// The worker: `INIT` names a behaviour; batches are doubled unless it says otherwise.
fn worker_main() {
    // SAFETY: the engine passes the worker its socket as fd 3.
    let mut socket = unsafe { UnixStream::from_raw_fd(3) };
    let store = ObjectStore::attach(std::env::var("FOREBAY_STORE").unwrap()).unwrap();
    let (_, init) = read_frame(&mut socket).unwrap();
    let mode = String::from_utf8(init).unwrap();
    if mode == "refuse" {
        write_frame(
            &mut socket,
            3,
            &error_payload("RuntimeError: cannot load the model"),
        );
        return;
    }
    write_frame(&mut socket, 2, &[]);
    while let Some((kind, payload)) = read_frame(&mut socket) {
        if kind == 7 {
            return;
        }
        let task = &payload[..8];
        let id = ObjectId(u128::from_le_bytes(payload[8..24].try_into().unwrap()));
        let (_, batches) = store.get_arrow(id).unwrap();
        let x = batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let first = x.value(0);
        if mode.starts_with("die-at-") && first == mode[7..].parse::<i64>().unwrap() {
            let marker = std::env::var("FOREBAY_TEST_MARKER").ok();
            let die = match &marker {
                Some(path) => std::fs::File::create_new(path).is_ok(), // only the first time
                None => true,
            };
            if die {
                // SAFETY: ends this process, as a crash in native code would.
                unsafe { libc::raise(libc::SIGKILL) };
            }
        }
        if mode == "fail-at-300" && first == 300 {
            let mut p = task.to_vec();
            p.extend(error_payload("ValueError: row 300 is bad"));
            write_frame(&mut socket, 6, &p);
            continue;
        }
        let out = batch_of(x.values().iter().map(|v| v * 2));
        let out_id = store.put_arrow(&out.schema(), &[out], &[]).unwrap();
        let mut p = task.to_vec();
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&out_id.0.to_le_bytes());
        write_frame(&mut socket, 5, &p);
    }
}

#[test]
fn worker_entry() {
    if std::env::var_os("FOREBAY_TEST_WORKER").is_some() {
        worker_main();
        std::process::exit(0);
    }
}

// ---------------------------------------------------------------- the engine side

fn pool(mode: &str) -> ProcessPool {
    let exe = std::env::current_exe().unwrap();
    ProcessPool::new(
        vec![
            exe.into_os_string(),
            "--exact".into(),
            "worker_entry".into(),
            "--quiet".into(),
            "--test-threads=1".into(),
        ],
        mode.as_bytes().to_vec(),
    )
    .with_env(vec![("FOREBAY_TEST_WORKER".into(), "1".into())])
}

fn source(batches: i64) -> Source {
    let b: Vec<_> = (0..batches)
        .map(|i| Ok::<_, UserError>(batch_of(i * 100..(i + 1) * 100)))
        .collect();
    Source::Batches {
        schema: batch_of([]).schema(),
        batches: Box::new(b.into_iter()),
    }
}

fn run(stage: MapStage, batches: i64) -> (Result<Vec<i64>, EngineError>, Vec<PipelineEvent>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let stream = Pipeline::new(source(batches))
        .with_preserve_order(true)
        .with_events(Arc::new(move |e: &PipelineEvent| {
            sink.lock().unwrap().push(e.clone())
        }))
        .map(stage)
        .iter(IterOptions::default())
        .unwrap();
    let mut values = Vec::new();
    for b in stream {
        match b {
            Ok(b) => values.extend(
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .iter(),
            ),
            Err(e) => return (Err(e), events.lock().unwrap().clone()),
        }
    }
    let events = events.lock().unwrap().clone();
    (Ok(values), events)
}

#[test]
fn batches_travel_through_the_store_to_worker_processes() {
    let (values, events) = run(
        MapStage::new("double", pool("double")).with_concurrency(2),
        40,
    );
    assert_eq!(
        values.unwrap(),
        (0..4000).map(|v| v * 2).collect::<Vec<_>>()
    );
    let started: Vec<_> = events
        .iter()
        .filter(|e| matches!(e, PipelineEvent::WorkerStarted { .. }))
        .collect();
    assert_eq!(started.len(), 2, "one process per worker");
}

#[test]
fn a_killed_worker_fails_the_run_naming_the_batch_and_signal() {
    let (result, _) = run(
        MapStage::new("model", pool("die-at-700")).with_concurrency(2),
        20,
    );
    let err = result.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, EngineError::WorkerDied { .. }), "{text}");
    assert!(text.contains("stage 'model'"), "{text}");
    assert!(text.contains("SIGKILL"), "{text}");
    assert!(text.contains("batch 7"), "{text}");
    assert!(text.contains("max_retries"), "{text}");
}

#[test]
fn a_killed_worker_is_replaced_and_its_batch_retried() {
    let marker = tempfile::tempdir().unwrap();
    let marker_path = marker.path().join("died-once");
    let p = pool("die-at-700")
        .with_env(vec![
            ("FOREBAY_TEST_WORKER".into(), "1".into()),
            (
                OsString::from("FOREBAY_TEST_MARKER"),
                marker_path.clone().into_os_string(),
            ),
        ])
        .with_max_retries(1);
    let (values, events) = run(MapStage::new("model", p).with_concurrency(2), 20);
    assert_eq!(
        values.unwrap(),
        (0..2000).map(|v| v * 2).collect::<Vec<_>>()
    );
    assert!(marker_path.exists(), "the worker did die once");
    assert!(events.iter().any(|e| matches!(
        e,
        PipelineEvent::WorkerDied { retrying: true, how, .. } if how.contains("SIGKILL")
    )));
}

#[test]
fn a_worker_error_comes_back_as_the_workers_own_error() {
    let (result, _) = run(MapStage::new("parse", pool("fail-at-300")), 10);
    match result.unwrap_err() {
        EngineError::UserFunction {
            stage,
            batch,
            error,
        } => {
            assert_eq!(stage, "parse");
            assert!(batch.to_string().contains("batch 3"), "{batch}");
            let remote = error
                .downcast_ref::<RemoteError>()
                .expect("the worker's error");
            assert_eq!(remote.text, "ValueError: row 300 is bad");
            assert_eq!(remote.payload, b"opaque");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_worker_that_cannot_start_fails_the_run() {
    let (result, _) = run(MapStage::new("model", pool("refuse")), 3);
    let text = result.unwrap_err().to_string();
    assert!(
        text.contains("cannot load the model") && text.contains("start-up"),
        "{text}"
    );
}
