//! forebay-store latencies from Rust (no Python in the way): put and get of bytes and of
//! Arrow batches, and a 64 MB put against a plain memcpy of the same bytes.
//!
//!     cargo bench --bench store

use std::hint::black_box;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use forebay::store::{ObjectStore, StoreConfig};

fn batch_of(nbytes: usize) -> RecordBatch {
    let n = (nbytes / 8).max(1) as i64;
    RecordBatch::try_from_iter([(
        "x",
        Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
    )])
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let store = ObjectStore::new(StoreConfig::new(512 << 20).without_spill()).unwrap();
    let mut g = c.benchmark_group("store");
    for &size in &[1usize << 10, 1 << 20, 64 << 20] {
        let data = vec![7u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(
            BenchmarkId::new("put_bytes+delete", size),
            &data,
            |b, data| {
                b.iter(|| {
                    let id = store.put_bytes(&[], &[data]).unwrap();
                    store.delete(id).unwrap();
                })
            },
        );
        let mut dst = vec![0u8; size];
        g.bench_with_input(BenchmarkId::new("memcpy", size), &data, |b, data| {
            b.iter(|| {
                dst.copy_from_slice(black_box(data));
                black_box(&dst);
            })
        });
        let id = store.put_bytes(&[], &[&data]).unwrap();
        g.bench_function(BenchmarkId::new("get_bytes", size), |b| {
            b.iter(|| black_box(store.get(id).unwrap().data().len()))
        });
        let batch = batch_of(size);
        g.bench_with_input(
            BenchmarkId::new("put_arrow+delete", size),
            &batch,
            |b, batch| {
                b.iter(|| {
                    let id = store
                        .put_arrow(&batch.schema(), std::slice::from_ref(batch), &[])
                        .unwrap();
                    store.delete(id).unwrap();
                })
            },
        );
        let aid = store
            .put_arrow(&batch.schema(), std::slice::from_ref(&batch), &[])
            .unwrap();
        g.bench_function(BenchmarkId::new("get_arrow", size), |b| {
            b.iter(|| black_box(store.get_arrow(aid).unwrap().1.len()))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
