//! forebay embedded in a host engine: the host's tokio runtime, the host's S3 store (built by
//! the host against a moto server on 127.0.0.1), the host's memory pool. The reader and the
//! checkpoint run on them, and forebay never starts a runtime of its own.
//!
//! One test in this binary: `use_host_runtime` is process-wide, and the assertion that no
//! forebay runtime thread exists needs a process no other test touched.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::DataType;
use forebay_checkpoint::CheckpointIndex;
use forebay_io::memory::{BoundedPool, MemoryPool};
use forebay_io::Dir;
use forebay_parquet::{DatasetSource, ParquetDataset, ParquetError};
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

const BUCKET: &str = "embed";
const FILES: usize = 3;
const ROWS_PER_FILE: usize = 20_000;
const ROW_GROUP_ROWS: usize = 5_000;

/// A moto S3 server on a free 127.0.0.1 port, stopped on drop.
struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python that has moto: `FOREBAY_TEST_PYTHON`, else the repository's `.venv` (which
/// `make test` creates before the cargo tests).
fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FOREBAY_TEST_PYTHON") {
        return Some(p.into());
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    venv.exists().then_some(venv)
}

fn start_moto(python: &PathBuf) -> Moto {
    for _ in 0..5 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(python)
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break; // the port was taken: try another
            }
            if http(port, "GET", "/moto-api/").is_some() {
                return Moto {
                    child,
                    endpoint: format!("http://127.0.0.1:{port}"),
                };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("moto server did not start");
}

/// One plain HTTP request to the moto server (unsigned: moto accepts it); the status line.
fn http(port: u16, method: &str, path: &str) -> Option<String> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply).ok()?;
    reply.lines().next().map(str::to_string)
}

/// Names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

fn parquet_file(first_id: i64) -> Vec<u8> {
    let ids = Int64Array::from_iter_values(first_id..first_id + ROWS_PER_FILE as i64);
    let payload = StringArray::from_iter_values(ids.values().iter().map(|i| format!("row-{i}")));
    let batch = RecordBatch::try_from_iter([
        ("id", Arc::new(ids) as ArrayRef),
        ("payload", Arc::new(payload) as ArrayRef),
    ])
    .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

#[test]
fn reader_and_checkpoint_run_on_the_hosts_runtime_store_and_memory_pool() {
    let Some(python) = python() else {
        eprintln!("skipped: no Python with moto (run `make venv` or set FOREBAY_TEST_PYTHON)");
        return;
    };
    let moto = start_moto(&python);
    let port: u16 = moto.endpoint.rsplit(':').next().unwrap().parse().unwrap();
    let created = http(port, "PUT", &format!("/{BUCKET}")).expect("create bucket");
    assert!(created.contains("200"), "{created}");

    // The host: its runtime (forebay is told before anything else), its TLS provider, its
    // store and its memory pool.
    let host = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("host-worker")
        .enable_all()
        .build()
        .unwrap();
    forebay_io::use_host_runtime(host.handle().clone()).unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store: Arc<dyn ObjectStore> = Arc::new(
        AmazonS3Builder::new()
            .with_endpoint(&moto.endpoint)
            .with_allow_http(true)
            .with_bucket_name(BUCKET)
            .with_region("us-east-1")
            .with_access_key_id("testing")
            .with_secret_access_key("testing")
            .build()
            .unwrap(),
    );
    let source = || DatasetSource::Store {
        store: store.clone(),
        display_prefix: format!("s3://{BUCKET}/"),
        paths: vec!["data/".into()],
    };
    let total = (FILES * ROWS_PER_FILE) as i64;

    host.block_on(async {
        for f in 0..FILES {
            let location = ObjectPath::from(format!("data/part-{f}.parquet"));
            let bytes = parquet_file((f * ROWS_PER_FILE) as i64);
            store.put(&location, PutPayload::from(bytes)).await.unwrap();
        }

        // The reader, async all the way, charging the host's pool.
        let pool = Arc::new(BoundedPool::new(64 << 20));
        let dataset = ParquetDataset::builder(source())
            .with_memory_pool(pool.clone())
            .with_prefetch(2)
            .build_async()
            .await
            .unwrap();
        assert_eq!(dataset.count_rows_async().await.unwrap(), total as u64);
        let mut scan = dataset.scan();
        let (mut rows, mut sum) = (0i64, 0i64);
        while let Some(batch) = scan.next().await {
            let batch = batch.unwrap().batch;
            let ids = batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            rows += ids.len() as i64;
            sum += ids.values().iter().sum::<i64>();
        }
        assert_eq!((rows, sum), (total, total * (total - 1) / 2));
        assert!(pool.peak() > 0, "the scan charged nothing");
        drop(scan);
        assert_eq!(pool.reserved(), 0, "the scan kept memory after it ended");
        assert_eq!(pool.consumers(), 0);

        // What one row group is charged: a scan of one at a time.
        let single = Arc::new(BoundedPool::new(64 << 20));
        let dataset = ParquetDataset::builder(source())
            .with_memory_pool(single.clone())
            .with_prefetch(1)
            .with_fetch_ahead(0)
            .build_async()
            .await
            .unwrap();
        let mut scan = dataset.scan();
        while let Some(batch) = scan.next().await {
            batch.unwrap();
        }
        let one_unit = single.peak();
        assert!(pool.peak() >= 2 * one_unit, "{} vs {one_unit}", pool.peak());

        // A pool that fits one and a half row groups: the scan waits for room instead of
        // failing, whatever its prefetch and fetch-ahead ask for.
        let limit = one_unit * 3 / 2;
        let narrow = Arc::new(BoundedPool::new(limit));
        let dataset = ParquetDataset::builder(source())
            .with_memory_pool(narrow.clone())
            .with_prefetch(4)
            .build_async()
            .await
            .unwrap();
        let mut scan = dataset.scan();
        let mut rows = 0;
        while let Some(batch) = scan.next().await {
            rows += batch.unwrap().batch.num_rows() as i64;
        }
        assert_eq!(rows, total);
        assert_eq!(narrow.peak(), one_unit);

        // A pool too small for one row group: a clear error, not a hang.
        let tiny = Arc::new(BoundedPool::new(1024));
        let dataset = ParquetDataset::builder(source())
            .with_memory_pool(tiny.clone())
            .build_async()
            .await
            .unwrap();
        let mut scan = dataset.scan();
        let err = loop {
            match scan.next().await.expect("the scan ended without its error") {
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, ParquetError::MemoryRefused { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("s3://embed/data/part-0.parquet") && message.contains("row group 0"),
            "{message}"
        );
        drop(scan);
        assert_eq!(tiny.reserved(), 0);

        // The checkpoint in a prefix of the host's store: written and loaded back async.
        let dir = Dir::remote(store.clone(), "ckpt", format!("s3://{BUCKET}/ckpt")).unwrap();
        let mut done = CheckpointIndex::new(DataType::Int64, "id", 16).unwrap();
        let finished = Int64Array::from_iter_values((0..total).step_by(2));
        done.insert(&finished).unwrap();
        let summary = done.write_async(dir.clone()).await.unwrap();
        assert_eq!(summary.ids, finished.len());
        assert!(summary
            .files
            .iter()
            .all(|f| f.starts_with("s3://embed/ckpt/")));
        let loaded = CheckpointIndex::loader_in(dir.clone(), "id")
            .with_threads(2)
            .load_async()
            .await
            .unwrap();
        assert_eq!(loaded.len(), finished.len());
        let probe = Int64Array::from(vec![0, 1, 2, total - 1]);
        let mask = loaded.contains(&probe).unwrap();
        assert_eq!(
            (0..4).map(|i| mask.value(i)).collect::<Vec<_>>(),
            [true, false, true, false]
        );
        // Only some shards, as a shard-owning worker loads them.
        let part = CheckpointIndex::loader_in(dir, "id")
            .with_shards([0, 1])
            .load_async()
            .await
            .unwrap();
        assert!(part.len() < finished.len() && !part.is_empty());
    });

    assert!(
        !forebay_io::runtime::own_runtime_started(),
        "forebay started a runtime of its own"
    );
    let names = thread_names();
    assert!(
        !names.iter().any(|n| n.starts_with("forebay")),
        "forebay-owned threads: {names:?}"
    );
}
