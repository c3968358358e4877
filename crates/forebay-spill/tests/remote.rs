//! The remote spill target against real object_store backends (a local directory through
//! `LocalFileSystem`, `InMemory`) and a recording wrapper around them that sees every payload
//! handed to the store: round trips of many sizes and buffer counts cut into many parts,
//! proof that parts are slices of the caller's buffers (no copy), failed uploads aborted and
//! leaving nothing, corruption and truncation detected, deletion on drop, removal of a dead
//! process's objects, backpressure, and the async entry points. The S3 protocol itself is
//! exercised against a moto server in `tests/python/test_spill_remote.py`.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use forebay_spill::{RemoteSpillConfig, RemoteSpillTarget, SpillError, SpillObject};
use futures::stream::BoxStream;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

mod common;
use common::pattern;

fn objects(sizes: &[&[usize]], seed: u64) -> Vec<SpillObject> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, lens)| SpillObject {
            id: 1000 + i as u64,
            buffers: lens
                .iter()
                .enumerate()
                .map(|(j, len)| pattern(seed * 97 + i as u64 * 13 + j as u64, *len))
                .collect(),
        })
        .collect()
}

/// What the recording store saw.
#[derive(Default)]
struct Record {
    /// Address ranges of every chunk of every payload (PUT or part).
    chunks: Vec<Range<usize>>,
    parts: usize,
    puts: usize,
    aborts: usize,
}

/// Delegates to `inner`, records payload chunks, can fail part number `fail_part` and can
/// hold every PUT/part until `gate` opens.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn ObjectStore>,
    record: Arc<Mutex<Record>>,
    fail_part: Option<usize>,
    gate: Arc<AtomicBool>,
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Record({} chunks)", self.chunks.len())
    }
}

impl fmt::Display for Recording {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Recording({})", self.inner)
    }
}

impl Recording {
    fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Recording {
            inner,
            record: Arc::default(),
            fail_part: None,
            gate: Arc::new(AtomicBool::new(true)),
        }
    }
}

fn note_chunks(record: &Mutex<Record>, payload: &PutPayload) {
    let mut r = record.lock().unwrap();
    for chunk in payload.iter() {
        let start = chunk.as_ptr() as usize;
        r.chunks.push(start..start + chunk.len());
    }
}

async fn wait_gate(gate: &AtomicBool) {
    while !gate.load(Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[derive(Debug)]
struct RecordingUpload {
    inner: Box<dyn MultipartUpload>,
    record: Arc<Mutex<Record>>,
    fail_part: Option<usize>,
    next_part: usize,
    gate: Arc<AtomicBool>,
}

#[async_trait]
impl MultipartUpload for RecordingUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        note_chunks(&self.record, &data);
        self.record.lock().unwrap().parts += 1;
        let number = self.next_part;
        self.next_part += 1;
        if self.fail_part == Some(number) {
            return Box::pin(async move {
                Err(object_store::Error::Generic {
                    store: "Recording",
                    source: format!("injected failure of part {number}").into(),
                })
            });
        }
        let put = self.inner.put_part(data);
        let gate = self.gate.clone();
        Box::pin(async move {
            wait_gate(&gate).await;
            put.await
        })
    }
    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.inner.complete().await
    }
    async fn abort(&mut self) -> object_store::Result<()> {
        self.record.lock().unwrap().aborts += 1;
        self.inner.abort().await
    }
}

#[async_trait]
impl ObjectStore for Recording {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        note_chunks(&self.record, &payload);
        self.record.lock().unwrap().puts += 1;
        wait_gate(&self.gate).await;
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Ok(Box::new(RecordingUpload {
            inner: self.inner.put_multipart_opts(location, opts).await?,
            record: self.record.clone(),
            fail_part: self.fail_part,
            next_part: 0,
            gate: self.gate.clone(),
        }))
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn list_all(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
    let prefix = Path::from(prefix);
    block_on(async {
        store
            .list(Some(&prefix))
            .map_ok(|m| m.location.to_string())
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
    })
}

const SIZES: &[&[usize]] = &[
    &[],
    &[0],
    &[1],
    &[63, 64, 65],
    &[4096],
    &[10_000, 1, 0, 7777],
    &[100_003],
    &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17],
];

fn round_trip(store: Arc<dyn ObjectStore>, part_size: usize) {
    let config = RemoteSpillConfig::default()
        .with_part_size(part_size)
        .with_parts_in_flight(3);
    let target = RemoteSpillTarget::open(store.clone(), "spill/run", "test://", config).unwrap();
    let originals = objects(SIZES, part_size as u64);
    let locations = target.spill(originals.clone()).unwrap();
    assert_eq!(locations.len(), originals.len());
    // A second round with one object: its own remote object.
    let single = objects(&[&[5000, 3]], 99);
    let single_loc = target.spill(single.clone()).unwrap();
    assert_ne!(single_loc[0].uri(), locations[0].uri());
    for (object, loc) in originals
        .iter()
        .zip(&locations)
        .chain(single.iter().zip(&single_loc))
    {
        assert_eq!(loc.object_id(), object.id);
        assert_eq!(loc.offset() % 64, 0);
        let lens: Vec<u64> = object.buffers.iter().map(|b| b.len() as u64).collect();
        assert_eq!(loc.buffer_lens(), lens.as_slice());
        // Into caller memory.
        let mut back: Vec<Vec<u8>> = lens.iter().map(|l| vec![0xAA; *l as usize]).collect();
        let mut dests: Vec<&mut [u8]> = back.iter_mut().map(|v| v.as_mut_slice()).collect();
        target.restore_into(loc, &mut dests).unwrap();
        for (a, b) in back.iter().zip(&object.buffers) {
            assert_eq!(&a[..], &b[..], "object {}", object.id);
        }
        // As slices of the download.
        let slices = target.restore(loc).unwrap();
        assert_eq!(slices.len(), object.buffers.len());
        for (a, b) in slices.iter().zip(&object.buffers) {
            assert_eq!(a, b);
        }
    }
    let stats = target.stats();
    assert_eq!(stats.rounds, 2);
    assert_eq!(stats.objects_spilled, originals.len() as u64 + 1);
    assert_eq!(stats.objects_restored, 2 * stats.objects_spilled);
    let payload: u64 = originals
        .iter()
        .chain(&single)
        .flat_map(|o| o.buffers.iter().map(|b| b.len() as u64))
        .sum();
    assert_eq!(stats.bytes_spilled, payload);
    assert_eq!(stats.single_puts + stats.multipart_uploads, 2);
    // The remote objects exist until their last location goes.
    let root = target.root_uri();
    let root_path = root.trim_start_matches("test://").to_string();
    assert_eq!(list_all(&store, &root_path).len(), 2);
    let keep = locations[3].clone();
    drop(locations);
    drop(single_loc);
    assert!(target.wait_for_deletes(Duration::from_secs(10)));
    assert_eq!(
        list_all(&store, &root_path).len(),
        1,
        "a clone still holds the first round"
    );
    assert_eq!(target.restore(&keep).unwrap()[1], originals[3].buffers[1]);
    drop(keep);
    assert!(target.wait_for_deletes(Duration::from_secs(10)));
    assert!(list_all(&store, &root_path).is_empty());
    assert_eq!(target.stats().remote_objects_deleted, 2);
}

#[test]
fn round_trips_in_one_put_and_in_many_parts_local_and_memory() {
    for part_size in [1 << 20, 4096, 100, 64] {
        round_trip(Arc::new(InMemory::new()), part_size);
        let dir = tempfile::tempdir().unwrap();
        round_trip(
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap()),
            part_size,
        );
    }
}

#[test]
fn parts_are_fixed_size_slices_of_the_callers_buffers() {
    let recording = Recording::new(Arc::new(InMemory::new()));
    let record = recording.record.clone();
    let part_size = 1 << 20;
    let target = RemoteSpillTarget::open(
        Arc::new(recording),
        "p",
        "rec://",
        RemoteSpillConfig::default().with_part_size(part_size),
    )
    .unwrap();
    // 4 buffers of 3 MiB + 5 bytes: parts cut through buffers at odd places.
    let originals = objects(&[&[3 << 20, 5, 3 << 20], &[3 << 20, 5]], 1);
    let buffer_ranges: Vec<Range<usize>> = originals
        .iter()
        .flat_map(|o| o.buffers.iter())
        .map(|b| b.as_ptr() as usize..b.as_ptr() as usize + b.len())
        .collect();
    let payload: usize = buffer_ranges.iter().map(|r| r.len()).sum();
    let locations = target.spill(originals.clone()).unwrap();
    let r = record.lock().unwrap();
    let total: u64 = locations.iter().map(|l| l.len()).sum();
    assert_eq!(r.parts as u64, total.div_ceil(part_size as u64));
    assert_eq!(r.puts, 0);
    // Every payload byte the store received came from a chunk inside a caller's buffer;
    // whatever else it got (heads, padding) is small.
    let inside: usize = r
        .chunks
        .iter()
        .filter(|c| {
            buffer_ranges
                .iter()
                .any(|b| b.start <= c.start && c.end <= b.end)
        })
        .map(|c| c.len())
        .sum();
    let outside: usize = r.chunks.iter().map(|c| c.len()).sum::<usize>() - inside;
    assert_eq!(inside, payload, "payload bytes were copied before upload");
    assert!(outside < 4096, "{outside} bytes of non-payload chunks");
    drop(r);
    for (object, loc) in originals.iter().zip(&locations) {
        assert_eq!(target.restore(loc).unwrap(), object.buffers);
    }
    let stats = target.stats();
    assert_eq!(stats.multipart_uploads, 1);
    assert_eq!(stats.parts_uploaded, total.div_ceil(part_size as u64));
}

#[test]
fn a_failed_part_aborts_the_upload_and_registers_nothing() {
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut recording = Recording::new(memory.clone());
    recording.fail_part = Some(2);
    let record = recording.record.clone();
    let target = RemoteSpillTarget::open(
        Arc::new(recording),
        "f",
        "rec://",
        RemoteSpillConfig::default().with_part_size(1000),
    )
    .unwrap();
    let err = target.spill(objects(&[&[10_000]], 3)).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, SpillError::Remote { .. }), "{message}");
    assert!(
        message.contains("rec://f/") && message.contains("upload part 2"),
        "{message}"
    );
    assert!(message.contains("injected failure"), "{message}");
    assert_eq!(record.lock().unwrap().aborts, 1);
    assert!(list_all(&memory, "f").is_empty());
    let stats = target.stats();
    assert_eq!(
        (stats.failed_rounds, stats.aborted_uploads, stats.rounds),
        (1, 1, 0)
    );
    // The target still works after a failed round (single PUTs do not hit the failing part).
    let ok = target.spill(objects(&[&[500]], 4)).unwrap();
    assert_eq!(
        target.restore(&ok[0]).unwrap(),
        objects(&[&[500]], 4)[0].buffers
    );
}

/// Replace the bytes of the remote object behind `loc`'s round.
fn rewrite(store: &Arc<dyn ObjectStore>, uri: &str, edit: impl FnOnce(&mut Vec<u8>)) {
    let path = Path::from(uri.trim_start_matches("mem://"));
    block_on(async {
        let mut bytes = store
            .get(&path)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec();
        edit(&mut bytes);
        store.put(&path, bytes.into()).await.unwrap();
    });
}

#[test]
fn corruption_and_truncation_are_errors_naming_object_and_offset() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let target =
        RemoteSpillTarget::open(store.clone(), "c", "mem://", RemoteSpillConfig::default())
            .unwrap();
    let originals = objects(&[&[100], &[300, 70]], 5);
    let locations = target.spill(originals.clone()).unwrap();
    let loc = &locations[1];
    let uri = loc.uri();
    let pristine = {
        let path = Path::from(uri.trim_start_matches("mem://"));
        block_on(async { store.get(&path).await.unwrap().bytes().await.unwrap() })
    };
    let try_both = |what: &str| {
        let mut dests_v = [vec![0u8; 300], vec![0u8; 70]];
        let mut dests: Vec<&mut [u8]> = dests_v.iter_mut().map(|v| v.as_mut_slice()).collect();
        let a = target.restore_into(loc, &mut dests).unwrap_err();
        let b = target.restore(loc).unwrap_err();
        for e in [a, b] {
            let m = e.to_string();
            assert!(m.contains(&uri), "{what}: {m}");
            assert!(
                m.contains(&format!("offset {}", loc.offset())),
                "{what}: {m}"
            );
        }
    };
    // Flip one byte anywhere in the object: header, length table, table padding, buffers,
    // padding between buffers.
    let start = loc.offset() as usize;
    for at in [0, 20, 33, 64, 72, 100, 128, 200, 427, 430, 500, 511] {
        assert!(at < loc.len() as usize);
        rewrite(&store, &uri, |b| b[start + at] ^= 0x04);
        try_both(&format!("flip at {at}"));
        rewrite(&store, &uri, |b| *b = pristine.to_vec());
    }
    // Cut short: inside the last buffer, and before the object begins.
    for keep in [start + loc.len() as usize - 30, start - 10] {
        rewrite(&store, &uri, |b| b.truncate(keep));
        try_both(&format!("truncated to {keep}"));
        rewrite(&store, &uri, |b| *b = pristine.to_vec());
    }
    // Gone altogether.
    block_on(store.delete(&Path::from(uri.trim_start_matches("mem://")))).unwrap();
    try_both("deleted");
    // Wrong destination sizes are refused before any request.
    let mut small = [0u8; 10];
    let err = target
        .restore_into(&locations[0], &mut [&mut small[..]])
        .unwrap_err();
    assert!(matches!(err, SpillError::DestinationMismatch { .. }));
}

#[test]
fn a_dead_process_objects_are_removed_when_a_target_opens() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // A child that has exited: its pid is dead.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let host = {
        let probe =
            RemoteSpillTarget::open(store.clone(), "probe", "m://", Default::default()).unwrap();
        let root = probe.root_uri();
        root.rsplit_once('/')
            .unwrap()
            .1
            .splitn(3, '-')
            .nth(2)
            .unwrap()
            .to_string()
    };
    let put = |key: String| {
        block_on(store.put(&Path::from(key), Bytes::from_static(b"x").into())).unwrap();
    };
    let dead_dir = format!("s/{dead}-00000000000000ab-{host}");
    put(format!("{dead_dir}/0.spill"));
    put(format!("{dead_dir}/1.spill"));
    let live = format!("s/{}-00000000000000cd-{host}/0.spill", std::process::id());
    let other_host = format!("s/{dead}-00000000000000ef-elsewhere/0.spill");
    let not_ours = "s/unrelated/data.bin".to_string();
    for k in [&live, &other_host, &not_ours] {
        put(k.clone());
    }
    let target = RemoteSpillTarget::open(store.clone(), "s", "m://", Default::default()).unwrap();
    assert_eq!(target.stats().stale_objects_removed, 2);
    let mut left = list_all(&store, "s");
    left.sort();
    let mut expected = vec![live, other_host, not_ours];
    expected.sort();
    assert_eq!(left, expected);
}

#[test]
fn submit_blocks_while_the_rounds_in_flight_are_uploading() {
    let recording = Recording::new(Arc::new(InMemory::new()));
    let gate = recording.gate.clone();
    gate.store(false, Ordering::Release);
    let target = Arc::new(
        RemoteSpillTarget::open(
            Arc::new(recording),
            "b",
            "rec://",
            RemoteSpillConfig::default().with_rounds_in_flight(1),
        )
        .unwrap(),
    );
    let first = target.submit(objects(&[&[10]], 1)).unwrap();
    let submitted = Arc::new(AtomicUsize::new(0));
    let second = {
        let (target, submitted) = (target.clone(), submitted.clone());
        std::thread::spawn(move || {
            let pending = target.submit(objects(&[&[20]], 2)).unwrap();
            submitted.store(1, Ordering::Release);
            pending.wait().unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        submitted.load(Ordering::Acquire),
        0,
        "second round was queued without limit"
    );
    gate.store(true, Ordering::Release);
    let a = first.wait().unwrap();
    let b = second.join().unwrap();
    assert_eq!(target.restore(&a[0]).unwrap()[0].len(), 10);
    assert_eq!(target.restore(&b[0]).unwrap()[0].len(), 20);
}

#[test]
fn blocking_calls_inside_a_runtime_are_refused_and_async_ones_work() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let target = RemoteSpillTarget::open(
        store,
        "a",
        "mem://",
        RemoteSpillConfig::default().with_part_size(64),
    )
    .unwrap();
    let originals = objects(&[&[1000, 3]], 8);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // spill only waits on a channel (the upload runs on the target's own runtime).
        assert_eq!(target.spill(originals.clone()).unwrap().len(), 1);
        let locations = target.spill_async(originals.clone()).await.unwrap();
        assert!(matches!(
            target.restore(&locations[0]),
            Err(SpillError::InvalidArgument(_))
        ));
        assert_eq!(
            target.restore_async(&locations[0]).await.unwrap(),
            originals[0].buffers
        );
        let mut a = vec![0u8; 1000];
        let mut b = [0u8; 3];
        target
            .restore_into_async(&locations[0], &mut [&mut a[..], &mut b[..]])
            .await
            .unwrap();
        assert_eq!(
            (&a[..], &b[..]),
            (&originals[0].buffers[0][..], &originals[0].buffers[1][..])
        );
        // Dropping the last location (and later the target) inside a runtime must not panic.
        drop(locations);
    });
    drop(runtime);
    drop(target);
    // Many rounds in parallel from several threads.
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let target = Arc::new(
        RemoteSpillTarget::open(
            store,
            "t",
            "mem://",
            RemoteSpillConfig::default().with_part_size(256),
        )
        .unwrap(),
    );
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let target = target.clone();
            std::thread::spawn(move || {
                for round in 0..10 {
                    let objs = objects(&[&[round * 100 + t], &[7, 900]], (t * 100 + round) as u64);
                    let locs = target.spill(objs.clone()).unwrap();
                    for (o, l) in objs.iter().zip(&locs) {
                        assert_eq!(target.restore(l).unwrap(), o.buffers);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(target.stats().rounds, 40);
}
