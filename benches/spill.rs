//! Criterion benches of forebay-spill. For objects of 64 KiB ... 128 MiB, one spill round of
//! 128 MiB in total (so every size writes the same bytes), three ways, same file system,
//! same sync policy (one fdatasync per file), in one run:
//!
//! - `vectored`: `SpillArea::spill` (header + buffers with writev, checksums, I/O thread);
//! - `concat`: per object, build `header + payload` in a fresh buffer, then write it;
//! - `raw`: one pre-built buffer of the same bytes written sequentially (the disk's limit).
//!
//! Plus restores of the same objects: `preadv` into caller memory and verified mmap.
//!
//! `cargo bench --bench spill` (spill directory: $FOREBAY_SPILL_BENCH_DIR or ./target).

use std::io::Write;
use std::path::PathBuf;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use forebay::spill::{SpillArea, SpillConfig, SpillObject, SyncPolicy};

const ROUND_BYTES: usize = 128 << 20;
const SIZES: [usize; 6] = [64 << 10, 1 << 20, 8 << 20, 32 << 20, 64 << 20, 128 << 20];

fn bench_dir() -> PathBuf {
    let base = std::env::var_os("FOREBAY_SPILL_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = base.join("spill-bench");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn round(size: usize) -> Vec<SpillObject> {
    (0..ROUND_BYTES / size)
        .map(|i| SpillObject {
            id: i as u64,
            buffers: vec![Bytes::from(vec![(i % 251) as u8 + 1; size])],
        })
        .collect()
}

fn bench_spill(c: &mut Criterion) {
    let dir = bench_dir();
    let area = SpillArea::open(SpillConfig::new([dir.join("area")]).with_sync(SyncPolicy::PerFile))
        .unwrap();
    let raw_source = vec![7u8; ROUND_BYTES];
    let mut group = c.benchmark_group("spill_128MiB_round_fdatasync");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(ROUND_BYTES as u64));
    for size in SIZES {
        let objects = round(size);
        group.bench_with_input(
            BenchmarkId::new("vectored", size),
            &objects,
            |b, objects| b.iter(|| drop(area.spill(objects.clone()).unwrap())),
        );
        group.bench_with_input(BenchmarkId::new("concat", size), &objects, |b, objects| {
            b.iter(|| {
                let path = dir.join("concat.bin");
                let mut f = std::fs::File::create(&path).unwrap();
                for o in objects {
                    let mut joined = Vec::with_capacity(64 + size);
                    joined.extend_from_slice(&[0u8; 64]);
                    joined.extend_from_slice(&o.buffers[0]);
                    f.write_all(&joined).unwrap();
                }
                f.sync_data().unwrap();
                std::fs::remove_file(&path).unwrap();
            })
        });
        group.bench_function(BenchmarkId::new("raw", size), |b| {
            b.iter(|| {
                let path = dir.join("raw.bin");
                let mut f = std::fs::File::create(&path).unwrap();
                f.write_all(&raw_source).unwrap();
                f.sync_data().unwrap();
                std::fs::remove_file(&path).unwrap();
            })
        });
    }
    group.finish();
}

fn bench_restore(c: &mut Criterion) {
    let dir = bench_dir();
    let area = SpillArea::open(SpillConfig::new([dir.join("restore")])).unwrap();
    let mut group = c.benchmark_group("restore");
    group.sample_size(10);
    for size in SIZES {
        let objects = round(size);
        let locations = area.spill(objects).unwrap();
        group.throughput(Throughput::Bytes(ROUND_BYTES as u64));
        let mut dest = vec![0u8; size];
        group.bench_function(BenchmarkId::new("preadv_into", size), |b| {
            b.iter(|| {
                for loc in &locations {
                    area.restore_into(loc, &mut [&mut dest[..]]).unwrap();
                }
            })
        });
        group.bench_function(BenchmarkId::new("mmap_verified", size), |b| {
            b.iter(|| {
                for loc in &locations {
                    drop(area.map(loc).unwrap());
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_spill, bench_restore);
criterion_main!(benches);
