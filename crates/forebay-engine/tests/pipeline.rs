//! Pipelines end to end: order, re-chunking, limits, errors, memory accounting, spilling of
//! held batches, and the Parquet sink. Each test checks results against an independent
//! reference (the rows it generated itself, a re-read of the files written).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::{Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use forebay_engine::{
    EngineError, IterOptions, MapStage, ParquetSink, Pipeline, PipelineEvent, Source, UserError,
    WriteMode,
};

mod common;
use common::{batch_of, schema, times};

/// Batches of consecutive values with uneven sizes (deterministic).
fn uneven_source(batches: usize) -> (Source, i64) {
    let mut out = Vec::new();
    let mut next = 0i64;
    for i in 0..batches {
        let n = 1 + (i * 7919 % 400) as i64;
        out.push(batch_of(next..next + n));
        next += n;
    }
    let iter = out.into_iter().map(Ok::<_, UserError>);
    (
        Source::Batches {
            schema: schema(),
            batches: Box::new(iter),
        },
        next,
    )
}

fn values(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect()
}

fn collect(stream: forebay_engine::BatchStream) -> Vec<RecordBatch> {
    stream.map(|b| b.unwrap()).collect()
}

#[test]
fn ordered_stages_with_batch_sizes_keep_every_row_in_order() {
    let (source, n) = uneven_source(120);
    let stream = Pipeline::new(source)
        .with_preserve_order(true)
        .map(times("double", 2).with_concurrency(3).with_batch_size(128))
        .map(times("triple", 3).with_concurrency(2))
        .iter(IterOptions {
            batch_size: Some(100),
            ..Default::default()
        })
        .unwrap();
    let out = collect(stream);
    assert_eq!(values(&out), (0..n).map(|v| v * 6).collect::<Vec<_>>());
    let sizes: Vec<usize> = out.iter().map(|b| b.num_rows()).collect();
    assert!(
        sizes[..sizes.len() - 1].iter().all(|&s| s == 100),
        "{sizes:?}"
    );
}

#[test]
fn unordered_runs_yield_every_row_exactly_once() {
    let (source, n) = uneven_source(200);
    let out = collect(
        Pipeline::new(source)
            .map(times("double", 2).with_concurrency(4).with_batch_size(50))
            .iter(IterOptions::default())
            .unwrap(),
    );
    let mut got = values(&out);
    got.sort_unstable();
    assert_eq!(got, (0..n).map(|v| v * 2).collect::<Vec<_>>());
}

#[test]
fn drop_last_and_local_shuffle() {
    let (source, n) = uneven_source(50);
    let out = collect(
        Pipeline::new(source)
            .iter(IterOptions {
                batch_size: Some(64),
                drop_last: true,
                ..Default::default()
            })
            .unwrap(),
    );
    assert!(out.iter().all(|b| b.num_rows() == 64));
    assert_eq!(values(&out), (0..(n / 64) * 64).collect::<Vec<_>>());

    let shuffled = |seed| {
        let (source, _) = uneven_source(50);
        values(&collect(
            Pipeline::new(source)
                .iter(IterOptions {
                    batch_size: Some(64),
                    local_shuffle: Some((1000, Some(seed))),
                    ..Default::default()
                })
                .unwrap(),
        ))
    };
    let a = shuffled(1);
    assert_ne!(a, (0..n).collect::<Vec<_>>());
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    assert_eq!(a, shuffled(1));
}

#[test]
fn a_failing_function_stops_the_run_and_names_stage_and_batch() {
    let (source, _) = uneven_source(100);
    let seen = Arc::new(AtomicUsize::new(0));
    let seen_in = seen.clone();
    let stage = MapStage::rust("parse", move |b| {
        if seen_in.fetch_add(1, Ordering::SeqCst) == 10 {
            return Err("row 17 is not a number".into());
        }
        Ok(b)
    })
    .with_concurrency(2);
    let mut stream = Pipeline::new(source)
        .map(stage)
        .iter(IterOptions::default())
        .unwrap();
    let err = loop {
        match stream.next() {
            Some(Ok(_)) => continue,
            Some(Err(e)) => break e,
            None => panic!("the run must fail"),
        }
    };
    let text = err.to_string();
    match &err {
        EngineError::UserFunction { stage, error, .. } => {
            assert_eq!(stage, "parse");
            assert_eq!(error.to_string(), "row 17 is not a number");
        }
        other => panic!("wrong error {other:?}"),
    }
    assert!(
        text.contains("stage 'parse'") && text.contains("batch"),
        "{text}"
    );
    assert!(stream.next().is_none(), "the stream ends after the error");
    // The run stopped: far from all 100 batches were processed.
    assert!(seen.load(Ordering::SeqCst) < 60);
}

#[test]
fn a_limit_stops_an_endless_source() {
    let pulled = Arc::new(AtomicU64::new(0));
    let p = pulled.clone();
    let endless = (0i64..).map(move |i| {
        p.fetch_add(1, Ordering::Relaxed);
        Ok::<_, UserError>(batch_of(i * 100..(i + 1) * 100))
    });
    let out = collect(
        Pipeline::new(Source::Batches {
            schema: schema(),
            batches: Box::new(endless),
        })
        .map(times("double", 2).with_concurrency(2))
        .limit(1050)
        .iter(IterOptions::default())
        .unwrap(),
    );
    let mut got = values(&out);
    assert_eq!(got.len(), 1050);
    got.sort_unstable();
    got.dedup();
    assert_eq!(got.len(), 1050);
    assert!(pulled.load(Ordering::Relaxed) < 100, "the source stopped");
}

#[test]
fn held_batches_beyond_the_reorder_budget_go_to_the_store_and_come_back() {
    // 120 batches of 2,000 rows (16 KiB); 16 tasks may run ahead of a slow head, more than
    // the reorder budget (an eighth of the 1 MiB limit) holds.
    let n = 120 * 2000;
    let source = Source::Batches {
        schema: schema(),
        batches: Box::new(
            (0..120i64).map(|i| Ok::<_, UserError>(batch_of(i * 2000..(i + 1) * 2000))),
        ),
    };
    let slow_first = MapStage::rust("slow head", move |b| {
        let x = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        if x.value(0) == 0 {
            std::thread::sleep(Duration::from_millis(400)); // the head holds everything up
        }
        Ok(b)
    })
    .with_concurrency(4);
    let spills = Arc::new(AtomicU64::new(0));
    let spills_in = spills.clone();
    let mut options = forebay_engine::PipelineOptions {
        memory_limit: 1 << 20,
        preserve_order: true,
        ..Default::default()
    };
    options.events = Some(Arc::new(move |e: &PipelineEvent| {
        if let PipelineEvent::Spilled { bytes, .. } = e {
            spills_in.fetch_add(*bytes, Ordering::Relaxed);
        }
    }));
    let mut stream = Pipeline::new(source)
        .with_options(options)
        .map(slow_first)
        .iter(IterOptions::default())
        .unwrap();
    let mut out = Vec::new();
    for b in stream.by_ref() {
        out.push(b.unwrap());
    }
    assert_eq!(values(&out), (0..n).collect::<Vec<_>>(), "order restored");
    let stats = stream.stats().unwrap();
    let stage = stats.stages.iter().find(|s| s.name == "slow head").unwrap();
    assert!(stage.spilled_bytes > 0, "{stats:?}");
    assert_eq!(spills.load(Ordering::Relaxed), stage.spilled_bytes);
}

#[test]
fn a_missing_required_column_names_the_stage() {
    let (source, _) = uneven_source(5);
    let rename = MapStage::rust("rename", |b: RecordBatch| {
        let schema = Arc::new(Schema::new(vec![Field::new("y", DataType::Int64, false)]));
        Ok(RecordBatch::try_new(schema, b.columns().to_vec())?)
    })
    .with_required_columns(["x"]);
    let err = Pipeline::new(source)
        .map(rename)
        .iter(IterOptions::default())
        .unwrap()
        .find_map(|b| b.err())
        .unwrap();
    let text = err.to_string();
    assert!(
        text.contains("stage 'rename'") && text.contains("no column 'x'"),
        "{text}"
    );
}

fn read_back(dir: &std::path::Path) -> Vec<i64> {
    common::i64_column_in(dir, "x")
}

#[test]
fn write_parquet_publishes_whole_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (source, n) = uneven_source(60);
    let stats = Pipeline::new(source)
        .map(times("double", 2).with_concurrency(2))
        .write_parquet(
            ParquetSink::new(out.display().to_string())
                .with_rows_per_file(1000)
                .with_compression("snappy")
                .unwrap(),
        )
        .unwrap();
    assert_eq!(stats.rows, n as u64);
    assert_eq!(stats.files.len(), (n as usize).div_ceil(1000));
    assert!(stats.files.iter().all(|f| f.rows <= 1000 && f.bytes > 0));
    let mut got = read_back(&out);
    got.sort_unstable();
    assert_eq!(got, (0..n).map(|v| v * 2).collect::<Vec<_>>());
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(".parquet") && !n.starts_with('.')),
        "{names:?}"
    );

    // mode="error" refuses a directory with data; "overwrite" replaces it.
    let (source, _) = uneven_source(3);
    let err = Pipeline::new(source)
        .write_parquet(
            ParquetSink::new(out.display().to_string()).with_mode(WriteMode::ErrorIfExists),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("use mode='append' or 'overwrite'"),
        "{err}"
    );
    let (source, m) = uneven_source(3);
    Pipeline::new(source)
        .write_parquet(ParquetSink::new(out.display().to_string()).with_mode(WriteMode::Overwrite))
        .unwrap();
    assert_eq!(read_back(&out), (0..m).collect::<Vec<_>>());
}

#[test]
fn an_unusable_output_path_fails_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let pulled = Arc::new(AtomicUsize::new(0));
    let p = pulled.clone();
    let source = Source::Batches {
        schema: schema(),
        batches: Box::new((0..10).map(move |i| {
            p.fetch_add(1, Ordering::Relaxed);
            Ok::<_, UserError>(batch_of(i..i + 1))
        })),
    };
    let err = Pipeline::new(source)
        .write_parquet(ParquetSink::new(file.join("out").display().to_string()))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("write_parquet") && text.contains("a-file"),
        "{text}"
    );
    assert_eq!(pulled.load(Ordering::Relaxed), 0);
}

#[test]
fn a_failed_write_leaves_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (source, _) = uneven_source(40);
    let fail_late = Arc::new(AtomicUsize::new(0));
    let f = fail_late.clone();
    let stage = MapStage::rust("boom", move |b| {
        if f.fetch_add(1, Ordering::SeqCst) == 30 {
            return Err("boom".into());
        }
        Ok(b)
    });
    let err = Pipeline::new(source)
        .map(stage)
        .write_parquet(ParquetSink::new(out.display().to_string()).with_rows_per_file(2000))
        .unwrap_err();
    assert!(err.to_string().contains("boom"));
    for entry in std::fs::read_dir(&out).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        assert!(!name.starts_with('.'), "temporary file left: {name}");
    }
    // Whatever was published is complete and readable.
    let _ = read_back(&out);
}

/// Every batch the test creates is built on buffers it tracks; the pool must account for
/// all of them while they live anywhere in the pipeline (no hidden buffers).
mod hidden_buffers {
    use super::*;
    use arrow_buffer::{Buffer, ScalarBuffer};
    use std::ptr::NonNull;

    static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

    struct Tracked(Vec<i64>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            LIVE_BYTES.fetch_sub(self.0.len() * 8, Ordering::SeqCst);
        }
    }

    fn tracked_batch(values: Vec<i64>) -> RecordBatch {
        let len = values.len();
        LIVE_BYTES.fetch_add(len * 8, Ordering::SeqCst);
        let owner = Arc::new(Tracked(values));
        let ptr = NonNull::new(owner.0.as_ptr() as *mut u8).unwrap();
        // SAFETY (test): the Vec lives as long as `owner`, which the buffer holds.
        let buffer = unsafe { Buffer::from_custom_allocation(ptr, len * 8, owner) };
        batch_from(ScalarBuffer::new(buffer, 0, len))
    }

    fn batch_from(values: ScalarBuffer<i64>) -> RecordBatch {
        RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::new(values, None))]).unwrap()
    }

    #[test]
    fn the_pool_accounts_for_every_live_batch() {
        const BATCH: usize = 16_384; // 128 KiB per batch
        let source = Source::Batches {
            schema: schema(),
            batches: Box::new((0..400i64).map(|i| {
                Ok::<_, UserError>(tracked_batch((0..BATCH as i64).map(|v| v + i).collect()))
            })),
        };
        let map = MapStage::rust("add one", |b: RecordBatch| {
            let x = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            Ok(tracked_batch(x.values().iter().map(|v| v + 1).collect()))
        })
        .with_concurrency(2);
        let samples = Arc::new(Mutex::new(Vec::new()));
        let mut stream = Pipeline::new(source)
            .with_memory_limit(4 << 20)
            .map(map)
            .iter(IterOptions {
                prefetch_batches: 4,
                ..Default::default()
            })
            .unwrap();
        let mut n = 0;
        while let Some(b) = stream.next() {
            let b = b.unwrap();
            n += b.num_rows();
            drop(b);
            std::thread::sleep(Duration::from_millis(2)); // a slow consumer: queues fill
                                                          // The pool is read before and after the live bytes: a batch released between two
                                                          // reads lowers both counters, so the reading taken before `live` still covers it.
            let before = stream.memory().unwrap().used;
            let live = LIVE_BYTES.load(Ordering::SeqCst);
            let memory = stream.memory().unwrap();
            let held: usize = memory.consumers.iter().map(|c| c.held).sum();
            samples
                .lock()
                .unwrap()
                .push((live, before.max(memory.used), memory.used, held));
        }
        assert_eq!(n, 400 * BATCH);
        let samples = samples.lock().unwrap();
        // Buffers in transit between two holders (being created by the source or a worker
        // and not yet reserved): at most one per producing thread (source + 2 workers).
        let in_transit = 3 * BATCH * 8;
        for &(live, reserved, used, held) in samples.iter() {
            assert_eq!(held, used, "the holders' bytes add up to the pool's");
            assert!(
                live <= reserved + in_transit,
                "{live} bytes of batches alive, only {reserved} reserved: a hidden buffer"
            );
        }
        // The queues really filled up (so a hidden queue would have shown).
        let max_used = samples.iter().map(|s| s.2).max().unwrap();
        assert!(max_used >= 8 * BATCH * 8, "max used {max_used}");
    }
}

/// A function that sets aside the rows whose value ends in 7 (as Python's
/// `on_error="skip"` runner does: the other rows' output, then the errored rows).
struct SetsAsideSevens;

struct SevensWorker;

impl forebay_engine::MapFn for SetsAsideSevens {
    fn start_worker(
        &self,
        _: &forebay_engine::WorkerContext<'_>,
    ) -> Result<Box<dyn forebay_engine::MapWorker>, forebay_engine::StageFailure> {
        Ok(Box::new(SevensWorker))
    }
}

impl forebay_engine::MapWorker for SevensWorker {
    fn call(
        &mut self,
        batch: RecordBatch,
        _: &forebay_engine::WorkerContext<'_>,
    ) -> Result<Vec<RecordBatch>, forebay_engine::StageFailure> {
        let vals = values(std::slice::from_ref(&batch));
        let (bad, good): (Vec<usize>, Vec<usize>) =
            (0..vals.len()).partition(|&i| vals[i] % 10 == 7);
        let take = |rows: &[usize]| {
            let rows = arrow_array::UInt64Array::from_iter_values(rows.iter().map(|&r| r as u64));
            arrow_select::take::take_record_batch(&batch, &rows).unwrap()
        };
        let failures: Vec<(usize, String, String)> = bad
            .iter()
            .map(|&i| {
                (
                    i,
                    "ValueError".to_string(),
                    format!("{} ends in 7", vals[i]),
                )
            })
            .collect();
        let mut out = vec![take(&good)];
        if !failures.is_empty() {
            out.push(forebay_engine::errored_rows_batch(&batch, &failures).unwrap());
        }
        Ok(out)
    }
}

#[test]
fn errored_rows_are_taken_out_counted_and_reported_and_a_limit_fails_the_run() {
    let (source, n) = uneven_source(60);
    let mut stream = Pipeline::new(source)
        .map(MapStage::new("model", SetsAsideSevens).with_concurrency(2))
        .iter(IterOptions::default())
        .unwrap();
    let mut got = values(&stream.by_ref().map(|b| b.unwrap()).collect::<Vec<_>>());
    got.sort_unstable();
    let expected: Vec<i64> = (0..n).filter(|v| v % 10 != 7).collect();
    assert_eq!(
        got, expected,
        "every other row once, no errored row downstream"
    );
    let stats = stream.stats().unwrap();
    let model = stats.stages.iter().find(|s| s.name == "model").unwrap();
    assert_eq!(
        model.rows_errored,
        (0..n).filter(|v| v % 10 == 7).count() as u64
    );
    assert_eq!(model.errored.len(), forebay_engine::errored::SAMPLES);
    assert!(model.errored.iter().all(|e| e.error_type == "ValueError"
        && e.message.ends_with("ends in 7")
        && e.stage == "model"));

    let (source, _) = uneven_source(60);
    let mut stream = Pipeline::new(source)
        .map(MapStage::new("model", SetsAsideSevens).with_max_errored_rows(30))
        .iter(IterOptions::default())
        .unwrap();
    let err = stream.find_map(Result::err).expect("the run must fail");
    match err {
        EngineError::TooManyErroredRows {
            stage,
            errored,
            limit,
            last,
        } => {
            assert_eq!((stage.as_str(), limit), ("model", 30));
            assert!(errored > 30);
            assert!(
                last.contains("ValueError: ") && last.ends_with("ends in 7"),
                "{last}"
            );
        }
        other => panic!("wrong error {other:?}"),
    }
}

/// A worker with up to `limit` calls in flight, each finishing after a pseudo-random few
/// milliseconds (an async client of a model server); it doubles every value.
struct Concurrent {
    limit: usize,
    most_in_flight: Arc<AtomicUsize>,
    collected: Arc<AtomicUsize>,
}

struct ConcurrentWorker {
    limit: usize,
    running: Vec<(u64, RecordBatch, std::time::Instant)>,
    most_in_flight: Arc<AtomicUsize>,
    /// Calls handed back by `completed`.
    collected: Arc<AtomicUsize>,
}

impl forebay_engine::MapFn for Concurrent {
    fn start_worker(
        &self,
        _: &forebay_engine::WorkerContext<'_>,
    ) -> Result<Box<dyn forebay_engine::MapWorker>, forebay_engine::StageFailure> {
        Ok(Box::new(ConcurrentWorker {
            limit: self.limit,
            running: Vec::new(),
            most_in_flight: self.most_in_flight.clone(),
            collected: self.collected.clone(),
        }))
    }
}

impl forebay_engine::MapWorker for ConcurrentWorker {
    fn call(
        &mut self,
        _: RecordBatch,
        _: &forebay_engine::WorkerContext<'_>,
    ) -> Result<Vec<RecordBatch>, forebay_engine::StageFailure> {
        unreachable!("a worker with calls in flight is never called one at a time")
    }

    fn in_flight(&self) -> usize {
        self.limit
    }

    fn submit(
        &mut self,
        call: u64,
        batch: RecordBatch,
        _: &forebay_engine::WorkerContext<'_>,
    ) -> Result<(), forebay_engine::StageFailure> {
        let delay = Duration::from_micros(500 + call * 7919 % 4000);
        self.running
            .push((call, batch, std::time::Instant::now() + delay));
        assert!(
            self.running.len() <= self.limit,
            "more calls than in_flight"
        );
        self.most_in_flight
            .fetch_max(self.running.len(), Ordering::SeqCst);
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn completed(
        &mut self,
        timeout: Duration,
        _: &forebay_engine::WorkerContext<'_>,
    ) -> Result<
        Vec<(u64, Result<Vec<RecordBatch>, forebay_engine::StageFailure>)>,
        forebay_engine::StageFailure,
    > {
        let first = self.running.iter().map(|r| r.2).min();
        if let Some(first) = first {
            let now = std::time::Instant::now();
            std::thread::sleep(first.saturating_duration_since(now).min(timeout));
        }
        let now = std::time::Instant::now();
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|r| r.2 <= now);
        self.running = running;
        self.collected.fetch_add(done.len(), Ordering::SeqCst);
        Ok(done
            .into_iter()
            .map(|(call, batch, _)| {
                let doubled: Int64Array = values(std::slice::from_ref(&batch))
                    .iter()
                    .map(|v| v * 2)
                    .collect();
                let out = RecordBatch::try_new(batch.schema(), vec![Arc::new(doubled)]).unwrap();
                (call, Ok(vec![out]))
            })
            .collect())
    }
}

#[test]
fn a_worker_with_calls_in_flight_keeps_them_full_and_loses_no_row() {
    for preserve_order in [true, false] {
        let (source, n) = uneven_source(80);
        let most = Arc::new(AtomicUsize::new(0));
        let stage = MapStage::new(
            "endpoint",
            Concurrent {
                limit: 16,
                most_in_flight: most.clone(),
                collected: Arc::default(),
            },
        )
        .with_batch_size(7);
        let stream = Pipeline::new(source)
            .with_preserve_order(preserve_order)
            .map(stage)
            .iter(IterOptions::default())
            .unwrap();
        let got = values(&collect(stream));
        let mut expected: Vec<i64> = (0..n).map(|v| v * 2).collect();
        if preserve_order {
            assert_eq!(
                got, expected,
                "order kept across calls finishing out of order"
            );
        } else {
            let mut sorted = got.clone();
            sorted.sort_unstable();
            expected.sort_unstable();
            assert_eq!(sorted, expected);
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            16,
            "the calls in flight reach the limit"
        );
    }
}

/// A worker with calls in flight hands a task's small outputs on as one batch: downstream's
/// queue of two takes three tasks before the worker waits for it (handed on one by one, the
/// first task's 100 outputs would stop the worker, and an event loop that stood still would
/// leave a model server's answers unread).
#[test]
fn a_worker_with_calls_in_flight_collects_them_while_downstream_waits() {
    let source = Source::Batches {
        schema: schema(),
        batches: Box::new((0..4).map(|i| Ok::<_, UserError>(batch_of(i * 700..(i + 1) * 700)))),
    };
    let collected = Arc::new(AtomicUsize::new(0));
    let stage = MapStage::new(
        "endpoint",
        Concurrent {
            limit: 16,
            most_in_flight: Arc::default(),
            collected: collected.clone(),
        },
    )
    .with_batch_size(7); // 100 calls an input batch (a task)
    let mut stream = Pipeline::new(source)
        .map(stage)
        .iter(IterOptions::default())
        .unwrap();
    let first = stream.next().expect("a first batch").unwrap();
    // Downstream (this test) takes nothing more: tasks 1 and 2 fill the queue of 2 batches,
    // and the worker collects every call of all four tasks before it waits to hand on the
    // last.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while collected.load(Ordering::SeqCst) < 400 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        collected.load(Ordering::SeqCst),
        400,
        "calls collected while downstream waited"
    );
    let mut rest = vec![first];
    rest.extend(stream.map(|b| b.unwrap()));
    let mut got = values(&rest);
    got.sort_unstable();
    assert_eq!(got, (0..2800).map(|v| v * 2).collect::<Vec<i64>>());
}

/// A host engine's pool: the run's charges are held in it while they last, the source waits
/// for its room while the run has batches that can drain, and everything is given back.
#[test]
fn a_run_shares_a_host_engines_memory_pool() {
    use forebay_io::memory::{BoundedPool, MemoryPool, MemoryReservation};

    let source = || Source::Batches {
        schema: schema(),
        batches: Box::new((0..40).map(|i| Ok::<_, UserError>(batch_of(i * 1000..(i + 1) * 1000)))),
    };
    let host = Arc::new(BoundedPool::new(64 << 20));
    let out = collect(
        Pipeline::new(source())
            .with_memory_limit(32 << 20)
            .with_host_memory_pool(host.clone())
            .map(times("double", 2).with_concurrency(2))
            .iter(IterOptions::default())
            .unwrap(),
    );
    assert_eq!(values(&out).len(), 40_000);
    assert!(
        host.peak() >= 8_000,
        "the run's batches were held in the host's pool"
    );
    assert_eq!(
        (host.reserved(), host.consumers()),
        (0, 0),
        "all given back"
    );

    // The host's own work leaves almost no room: the run goes on a batch at a time (it
    // never waits for room when nothing of it could drain), and the host's limit is only
    // passed by what the run already holds.
    let crowded = Arc::new(BoundedPool::new(1 << 20));
    let mut hosts_work = MemoryReservation::new(crowded.clone(), "host query");
    hosts_work.try_grow((1 << 20) - 100).unwrap();
    let out = collect(
        Pipeline::new(source())
            .with_host_memory_pool(crowded.clone())
            .map(times("double", 2))
            .iter(IterOptions::default())
            .unwrap(),
    );
    let mut got = values(&out);
    got.sort_unstable();
    assert_eq!(got, (0..40_000).map(|v| v * 2).collect::<Vec<_>>());
    drop(hosts_work);
    assert_eq!(crowded.reserved(), 0);
}
