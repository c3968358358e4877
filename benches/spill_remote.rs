//! The remote spill target through object_store, as ratios in one run: a 128 MiB round
//! uploaded by `RemoteSpillTarget::spill` (parts sliced from the objects' buffers) against
//! concatenate-then-upload (each object's head + payload copied into part buffers, what
//! object_store's `WriteMultipart` does) and a raw multipart upload of one pre-built 128 MiB
//! buffer in parts of the same size (the store's own limit). The store is `LocalFileSystem`
//! in `target/` (or `FOREBAY_SPILL_BENCH_DIR`): no network here, so this measures our side
//! of the path, not S3. Writers interleave, the order rotating every round; medians.
//!
//! `cargo bench --bench spill_remote [-- ROUNDS]` (default 9)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use forebay::spill::{RemoteSpillConfig, RemoteSpillTarget, SpillObject};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

const ROUND_BYTES: usize = 128 << 20;
const PART: usize = 16 << 20;
const SIZES: [usize; 3] = [1 << 20, 8 << 20, 128 << 20];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Multipart upload of `parts` to `path`, 4 parts in flight, then delete the object.
async fn upload(store: &Arc<dyn ObjectStore>, path: &Path, parts: Vec<PutPayload>) {
    let mut upload = store.put_multipart(path).await.unwrap();
    let mut pending = Vec::new();
    for part in parts {
        pending.push(upload.put_part(part));
        if pending.len() == 4 {
            futures::future::try_join_all(pending.drain(..))
                .await
                .unwrap();
        }
    }
    futures::future::try_join_all(pending).await.unwrap();
    upload.complete().await.unwrap();
    store.delete(path).await.unwrap();
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(9);
    let dir = std::env::var_os("FOREBAY_SPILL_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("spill-remote");
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&dir).unwrap());
    let target = RemoteSpillTarget::open(
        store.clone(),
        "forebay",
        "file://",
        RemoteSpillConfig::default().with_part_size(PART),
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let raw_source = Bytes::from(vec![7u8; ROUND_BYTES]);
    println!("remote spill of a 128 MiB round to LocalFileSystem, {PART}-byte parts, medians of {rounds}");
    println!(
        "{:>12} {:>11} {:>11} {:>11} {:>14} {:>16}",
        "object size", "forebay ms", "concat ms", "raw ms", "forebay/raw", "concat/forebay"
    );
    for size in SIZES {
        let objects: Vec<SpillObject> = (0..ROUND_BYTES / size)
            .map(|i| SpillObject {
                id: i as u64,
                buffers: vec![Bytes::from(vec![(i % 251) as u8 + 1; size])],
            })
            .collect();
        let (mut ours, mut concat, mut raw) = (Vec::new(), Vec::new(), Vec::new());
        let run_ours = || {
            let t = Instant::now();
            let locations = target.spill(objects.clone()).unwrap();
            drop(locations);
            assert!(target.wait_for_deletes(std::time::Duration::from_secs(30)));
            t.elapsed().as_secs_f64() * 1e3
        };
        let run_concat = || {
            let t = Instant::now();
            // Head + payload of each object copied into part-sized buffers.
            let mut parts = Vec::new();
            let mut current = Vec::with_capacity(PART);
            for o in &objects {
                let mut pieces: Vec<&[u8]> = vec![&[0u8; 128][..]];
                pieces.push(&o.buffers[0]);
                for mut piece in pieces {
                    while !piece.is_empty() {
                        let n = (PART - current.len()).min(piece.len());
                        current.extend_from_slice(&piece[..n]);
                        piece = &piece[n..];
                        if current.len() == PART {
                            parts.push(PutPayload::from(std::mem::replace(
                                &mut current,
                                Vec::with_capacity(PART),
                            )));
                        }
                    }
                }
            }
            if !current.is_empty() {
                parts.push(PutPayload::from(current));
            }
            runtime.block_on(upload(&store, &Path::from("concat.bin"), parts));
            t.elapsed().as_secs_f64() * 1e3
        };
        let run_raw = || {
            let t = Instant::now();
            let parts = (0..ROUND_BYTES)
                .step_by(PART)
                .map(|at| PutPayload::from(raw_source.slice(at..(at + PART).min(ROUND_BYTES))))
                .collect();
            runtime.block_on(upload(&store, &Path::from("raw.bin"), parts));
            t.elapsed().as_secs_f64() * 1e3
        };
        for round in 0..rounds {
            for k in 0..3 {
                match (round + k) % 3 {
                    0 => ours.push(run_ours()),
                    1 => concat.push(run_concat()),
                    _ => raw.push(run_raw()),
                }
            }
        }
        let (o, c, r) = (median(ours), median(concat), median(raw));
        println!(
            "{:>12} {:>11.1} {:>11.1} {:>11.1} {:>13.1}% {:>15.2}x",
            size,
            o,
            c,
            r,
            100.0 * r / o,
            c / o
        );
    }
}
